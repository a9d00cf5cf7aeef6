"""A Spark standalone cluster for tests: one master and one worker, from the installed pyspark, on 127.0.0.1.

    cluster = SparkCluster(tmp_path / "cluster")
    cluster.start()                     # both JVMs, then waits until the worker registered with the master
    cluster.master_url                  # spark://127.0.0.1:<port>, for spark-submit --master
    cluster.application(app_id)         # the master's JSON about an application (running or completed)
    cluster.executors(app_id)           # the worker's JSON about that application's executors
    cluster.executor_pids()             # the executor JVMs (CoarseGrainedExecutorBackend) the worker runs now
    cluster.stop()                      # kills both process groups; raises when a process it started is left

Nothing is downloaded: `spark-class` runs Spark's Master and Worker from pyspark's own jars. The master and the
worker each run in a process group of their own; the worker starts its executors (and they their Python workers)
in its group, with the worker's environment, which has no PYTHONPATH. The executors' Python is the one the job
names (`PYSPARK_PYTHON` in spark-submit's environment); `python_without_herald` makes one that has Herald's
dependencies and not Herald, as a node where they were installed and Herald is shipped with the job (operations.md's
`--py-files`): this checkout's virtualenv has Herald installed (editable), which would hide a job that does not
ship it.

The JVMs get the Kafka test broker's options (tests/support/kafka_broker.py): a small heap, C1 only, serial GC; and
the driver's class archive (tests/support/jvm_archive.py) when there is one: the master and the worker load Spark's
classes from the same jars. SPARK_SUBMIT_OPTS, which the suite sets for drivers, reaches neither (Spark's launcher
gives a Master or a Worker SPARK_DAEMON_JAVA_OPTS instead); the executors get neither (their options are the job's
`spark.executor.extraJavaOptions`), and they start as a user's do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DAEMON_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xlog:cds=off,cds+dynamic=off")
DAEMON_HEAP = "256m"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spark_class() -> Path:
    """`spark-class` of the installed pyspark (its package directory is SPARK_HOME), else the one beside this
    Python."""
    import pyspark

    packaged = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    return packaged if packaged.exists() else Path(sys.executable).with_name("spark-class")


class ClusterError(RuntimeError):
    pass


class SparkCluster:
    """work: a directory for the logs and the worker's work directory (each executor's files are under
    `work/worker/<app id>/<executor id>`); cores and memory: what the worker offers to jobs."""

    def __init__(self, work: Path, cores: int = 2, memory: str = "2g") -> None:
        self.work = work
        self.cores = cores
        self.memory = memory
        self.host = "127.0.0.1"
        self.master_port, self.master_ui_port = free_port(), free_port()
        self.worker_port, self.worker_ui_port = free_port(), free_port()
        self.worker_dir = work / "worker"
        self.master: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    # -- starting -----------------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 240.0) -> None:
        self.worker_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.master = self._launch("master", ["org.apache.spark.deploy.master.Master", "--host", self.host,
                                                  "--port", str(self.master_port),
                                                  "--webui-port", str(self.master_ui_port)])
            self.worker = self._launch("worker", [
                "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", self.host,
                "--port", str(self.worker_port), "--webui-port", str(self.worker_ui_port),
                "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.worker_dir)])
            self._wait_for_the_worker(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _environment(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items()
               if name not in ("PYTHONPATH", "SPARK_SUBMIT_OPTS", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
        options = list(DAEMON_JVM_OPTIONS)
        archive = _driver_archive()
        if archive is not None:
            options.insert(0, f"-XX:SharedArchiveFile={archive}")
        env.update(SPARK_DAEMON_JAVA_OPTS=" ".join(options), SPARK_DAEMON_MEMORY=DAEMON_HEAP,
                   SPARK_LOCAL_IP=self.host, SPARK_LOCAL_DIRS=str(self.work / "local"),
                   SPARK_NO_DAEMONIZE="1")
        return env

    def _launch(self, name: str, arguments: list[str]) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")  # the process writes to it until it ends
        try:
            return subprocess.Popen([str(spark_class()), *arguments], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self._environment(), cwd=self.work,
                                    start_new_session=True)
        finally:
            log.close()

    def _wait_for_the_worker(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process, name in ((self.master, "master"), (self.worker, "worker")):
                if process.poll() is not None:
                    raise ClusterError(f"the {name} exited with {process.returncode}: {self.log_tail(name)}")
            try:
                if any(worker.get("state") == "ALIVE" and worker.get("port") == self.worker_port
                       for worker in self.master_state().get("workers", [])):
                    return
            except OSError:
                pass  # the master's UI is not up yet
            time.sleep(0.5)
        raise ClusterError(f"the worker did not register within {timeout_s:.0f} s: {self.log_tail('worker')}")

    # -- asking -------------------------------------------------------------------------------------------------
    def master_state(self) -> dict:
        """The master's JSON (`/json/`): workers, activeapps, completedapps."""
        return _get_json(f"http://{self.host}:{self.master_ui_port}/json/")

    def worker_state(self) -> dict:
        """The worker's JSON (`/json/`): executors, finishedexecutors (each with appid, id, state)."""
        return _get_json(f"http://{self.host}:{self.worker_ui_port}/json/")

    def application(self, app_id: str) -> dict | None:
        state = self.master_state()
        return next((app for app in [*state.get("activeapps", []), *state.get("completedapps", [])]
                     if app.get("id") == app_id), None)

    def executors(self, app_id: str) -> list[dict]:
        """Every executor the worker ran for `app_id`, running or finished."""
        state = self.worker_state()
        return [executor for executor in [*state.get("executors", []), *state.get("finishedexecutors", [])]
                if executor.get("appid") == app_id]

    def executor_pids(self) -> list[int]:
        """The executor JVMs this worker runs now (their command line names the worker's URL)."""
        mark = f"Worker@{self.host}:{self.worker_port}"
        return [pid for pid, command in _processes() if EXECUTOR_CLASS in command and mark in command]

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    # -- stopping -----------------------------------------------------------------------------------------------
    def stop(self, timeout_s: float = 60.0) -> None:
        """The worker's group (its executors and their Python workers too), then the master's: SIGTERM, SIGKILL
        what is left after `timeout_s`. Raises ClusterError naming any process it started that is still there."""
        groups = [process.pid for process in (self.worker, self.master) if process is not None]
        for group in groups:
            _signal_group(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self._left(groups) and time.monotonic() < deadline:
            time.sleep(0.5)
        for group in groups:
            _signal_group(group, signal.SIGKILL)
        for process in (self.worker, self.master):
            if process is not None:
                process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while self._left(groups) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = self._left(groups)
        if left:
            raise ClusterError(f"processes the cluster started are still there: {left}")

    def _left(self, groups: list[int]) -> list[str]:
        """Processes of the cluster's groups, executors of its worker, or any process working in its directory."""
        mark = f"Worker@{self.host}:{self.worker_port}"
        work = str(self.work.resolve())
        left = []
        for pid, command in _processes():
            try:
                group = os.getpgid(pid)
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue  # gone meanwhile
            if _is_zombie(pid):
                continue
            if group in groups or mark in command or cwd == work or cwd.startswith(work + os.sep):
                left.append(f"{pid} {command[:160]}")
        return left


def python_without_herald(directory: Path) -> Path:
    """An executable running this Python with its installed packages but without Herald: `-S` leaves out
    site-packages and its .pth files (where an editable install of Herald lives), and site-packages itself goes
    on PYTHONPATH after what Spark puts there (pyspark)."""
    import sysconfig

    script = directory / "python-without-herald"
    site_packages = sysconfig.get_paths()["purelib"]
    script.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site_packages}" '
                      f'exec {sys.executable} -S "$@"\n')
    script.chmod(0o755)
    return script


def _driver_archive() -> Path | None:
    """The suite's class archive of Spark's jars, when it was built (tests/support/jvm_archive.py)."""
    try:
        from tests.support.jvm_archive import archive_path

        archive = archive_path()
    except Exception:  # noqa: BLE001 - the daemons start without it, only slower
        return None
    return archive if archive.exists() else None


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass


def _processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process this user can see, this one excepted."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((int(entry.name), command))
    return found


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


class Submission:
    """One `spark-submit` (its JVM and the Python driver it starts) in a process group of its own, its output in
    `log_path`. `app_id` is the application id the master gave it (from the driver's log); `close()` kills what is
    left of the group and raises when a process of it is still there."""

    def __init__(self, command: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> None:
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, cwd=cwd, start_new_session=True)
        self.pid = self.process.pid  # spark-submit execs the JVM: the driver JVM's pid, and the group's

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def app_id(self) -> str | None:
        found = re.search(r"app ID (app-\d+-\d+)", self.output())
        return found.group(1) if found else None

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout=timeout_s)

    def signal(self, signum: int) -> None:
        """To the driver JVM alone, as Kubernetes' tini forwards a pod's SIGTERM to the process it started."""
        self.process.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """To the driver JVM and its Python at once, as YARN signals a container's process group."""
        _signal_group(self.pid, signum)

    def close(self) -> None:
        if self.process.poll() is None:
            _signal_group(self.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        else:
            _signal_group(self.pid, signal.SIGKILL)  # a Python driver that outlived its JVM
        deadline = time.monotonic() + 30
        while (left := _group_members(self.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left:
            raise ClusterError(f"processes of spark-submit {self.pid} are still there: {left}")


def _group_members(group: int) -> list[int]:
    members = []
    for pid, _ in _processes():
        try:
            if os.getpgid(pid) == group and not _is_zombie(pid):
                members.append(pid)
        except OSError:
            continue
    return members
