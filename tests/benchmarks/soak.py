"""Benchmark: a soak of `herald run` with bad neighbours: latency, memory, table growth, and the restart's cost.

    .venv/bin/python tests/benchmarks/soak.py [--minutes 20] [--rate 200] [--keep] [--lazy-heap] [--malloc-arena-max N]

What it runs: Apache Kafka (`tests/support/kafka_broker.py`, the jars `make install` fetched), three JSON topics of
2 partitions, and one `herald run --conf DIR` in its own process on the users' stack: Spark's Kafka source
(`kafka.connector: spark`) and delta-spark (`storage.engine: spark`); everything else in herald.yaml and in the
subscriptions is Herald's shipped defaults (`startingOffsets: latest`, rate 400, inflight 100, a 1 s trigger,
commits every 60 s, `spark.master: local[*]`). Twelve subscriptions, four a topic, no filters, each a real HTTP
server on 127.0.0.1 in this process (threads):

- `hang` (topic 0): accepts every request and never answers (its subscription has `requestTimeout: 60000`);
- `down` (topic 1): answers 503 to everything (no Retry-After);
- `flap` (topic 2): 200 for 60 s, then 500 for 60 s, alternating;
- `ok0` .. `ok8` (three a topic): answer 200 and record each message's latency, from the publish time in its body
  (epoch ms, set by the producer on this machine) to its arrival.

A producer thread publishes --rate messages a second in all (round robin over the topics, ~200 B each) from the
start to the end. Once every healthy subscriber has received a message, the soak runs for --minutes; every 30 s it
prints a sample: the driver's RSS (the `herald run` Python process and its JVM, from /proc; in local mode Spark's
executor is that same JVM), the JVM's heap and metaspace (`jstat -gc`, when the JDK has it), Spark's Python
workers apart, the job's CPU (cores, its live processes), each Delta table's rows, files and version under
<storage>/tables (delta-rs, as `herald undelivered` reads them), the parked count (the newest `retries` row of
each message in state PARKED, as a starting job loads them), each subscription's lag behind its topic's end (its
position in the offsets table, which is up to `commitIntervalMs` old) and the healthy subscribers' p50/p99 of the
arrivals in the window.

Then the job is stopped with SIGINT (graceful, as a terminal's Ctrl-C reaches it) and started again on the same
storage, and then a fresh job on an empty storage path is started the same way: each start is timed from the
process's launch to the first message a healthy subscriber receives from it (the time to the log line
`one query reads ...`, the read's start, is printed too). The restarted job also runs until every message published
during the soak has reached every healthy subscriber (a loss check across the stop, at most 240 s). Last lines
(each one line):

    targets: healthy p99 at most 3000 ms while the neighbour hangs, driver RSS growth at most 50 MiB/h after the
             first 5 minutes, restart ratio at most 1.2
    soak: healthy p99 X ms, driver RSS growth Y MiB/h, offsets rows per hour Z, restart ratio R

X, Y and Z come from the samples taken 5 minutes or more after the job's launch (X: the healthy arrivals of their
windows, so the job's start-up backlog is left out; the whole soak's p99 is printed above it), Y and Z as the
slopes of a linear fit, per hour (a run too short for three such samples uses its second half, and says so); R is
the restart's time over the fresh start's. It takes --minutes plus about 5-8 minutes (the job's start, the stop
and the two starts after it). `--minutes 3` is a quick check. Nothing is asserted; it is not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.support.herald_env import write_topics_conf  # noqa: E402
from tests.support.http_server import LocalHttpServer  # noqa: E402
from tests.support.kafka_broker import KafkaBroker  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import percentile  # noqa: E402 - sibling module
from serial_throughput import _cpu_s, _rss_pss, _tree  # noqa: E402 - the process-tree readers of a sibling

TOPICS = ("bench.soak0", "bench.soak1", "bench.soak2")
PARTITIONS = 2
BAD = {"hang": 0, "down": 1, "flap": 2}  # the bad subscriber -> its topic's index
HEALTHY = {f"ok{n}": n // 3 for n in range(9)}  # three healthy subscribers a topic
SAMPLE_EVERY_S = 30.0
TOUCHED_HEAP = "-Dlog4j2.level=WARN -Xms1g -XX:+AlwaysPreTouch -XX:NativeMemoryTracking=summary"
"""herald.yaml's `spark.driver.extraJavaOptions` unless --lazy-heap (Herald's local default, plus): the driver
JVM's heap (spark.driver.memory's default -Xmx1g) committed and touched at its start, as services that run for
months are often set up. Left to the JVM, the heap grows to -Xmx over the first 15-20 minutes
(tests/benchmarks/README.md), and a fit of RSS over a 20-minute soak measures that fill, not a leak. Native memory
tracking (summary) says which of the JVM's own areas grow (`native_memory_growth`)."""
FIT_AFTER_S = 300.0  # RSS and table growth are fitted on the samples after the job's first 5 minutes
FLAP_PERIOD_S = 60.0
READ_STARTED = "one query reads"  # the log line of the shared read's start (engine/triggers/shared_read.py)


class Arrivals:
    """What the healthy subscribers received: latencies (ms) of first arrivals of messages published during the
    soak, per window and in all, and which messages each got (per-topic index i)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.window: list[float] = []
        self.soak = array("d")
        self.soak_from_ms = float("inf")  # latencies count for messages published from then (epoch ms)
        self.soak_until_ms = float("inf")  # and arrived before then
        self.seen = {name: bytearray() for name in HEALTHY}
        self.duplicates = 0
        self.first_after: float | None = None  # the first arrival at or after `watch_from` (monotonic s)
        self.watch_from = float("inf")

    def record(self, name: str, document: dict) -> None:
        arrived_ms = time.time() * 1000
        now = time.monotonic()
        i = document["i"]
        with self.lock:
            if self.first_after is None and now >= self.watch_from:
                self.first_after = now
            seen = self.seen[name]
            if i >= len(seen):
                seen.extend(bytes(i + 1 - len(seen) + 4096))
            if seen[i]:
                self.duplicates += 1
                return
            seen[i] = 1
            if self.soak_from_ms <= document["sent_ms"] and arrived_ms < self.soak_until_ms:
                latency = arrived_ms - document["sent_ms"]
                self.window.append(latency)
                self.soak.append(latency)

    def take_window(self) -> list[float]:
        with self.lock:
            taken, self.window = self.window, []
        return taken

    def watch(self, since: float) -> None:
        with self.lock:
            self.first_after, self.watch_from = None, since

    def missing(self, name: str, first: int, end: int) -> int:
        """How many of messages first .. end-1 of its topic subscriber `name` has not received."""
        with self.lock:
            seen = self.seen[name]
            return sum(1 for i in range(first, end) if i >= len(seen) or not seen[i])


class Subscriber:
    """One HTTP server on 127.0.0.1 (a thread per connection) answering as `name` says: see the module's doc."""

    def __init__(self, name: str, arrivals: Arrivals, began: float) -> None:
        self.name = name
        self.requests = 0  # in the current window
        self.failed = 0  # of those, answered 5xx (flap) or never answered (hang)
        lock = threading.Lock()
        subscriber = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    subscriber.requests += 1
                if name == "hang":
                    with lock:
                        subscriber.failed += 1
                    self._wait_for_the_client_to_give_up()
                    return
                if name == "down":
                    status = 503
                elif name == "flap":
                    status = 200 if int((time.monotonic() - began) / FLAP_PERIOD_S) % 2 == 0 else 500
                else:
                    arrivals.record(name, json.loads(body))
                    status = 200
                if status >= 500:
                    with lock:
                        subscriber.failed += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _wait_for_the_client_to_give_up(self) -> None:
                """No answer: the connection stays open until the sender closes it (its grace or timeout)."""
                self.close_connection = True
                self.connection.settimeout(600)
                try:
                    while self.connection.recv(65536):
                        pass
                except OSError:
                    pass

        self.server = LocalHttpServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{name}"
        self._lock = lock

    def take_counts(self) -> tuple[int, int]:
        with self._lock:
            counts = (self.requests, self.failed)
            self.requests = self.failed = 0
        return counts

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Publisher(threading.Thread):
    """Publishes `rate` messages a second in all, message k to topic k % 3 as that topic's i-th, partition i % 2,
    each body {"i", "sent_ms" (epoch ms), "pad"}. Falling more than a second behind restarts the schedule (no
    burst); `late_s` adds up the time so lost."""

    def __init__(self, bootstrap: str, rate: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "log.connection.close": False})
        self.rate = rate
        self.published = [0] * len(TOPICS)  # per topic: the next i
        self.errors = 0
        self.late_s = 0.0
        self._stopping = threading.Event()

    def _delivered(self, error, _message) -> None:
        if error is not None:
            self.errors += 1

    def run(self) -> None:
        began, k = time.monotonic(), 0
        while not self._stopping.is_set():
            delay = began + k / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:
                self.late_s += -delay
                began, k = time.monotonic(), 0
            t = k % len(TOPICS)
            i = self.published[t]
            body = json.dumps({"i": i, "sent_ms": time.time() * 1000, "pad": "x" * 150}).encode()
            self.producer.produce(TOPICS[t], value=body, partition=i % PARTITIONS, on_delivery=self._delivered)
            self.producer.poll(0)
            self.published[t] = i + 1
            k += 1
        self.producer.flush(30)
        self.producer = None  # its client goes now, before the broker stops (it would log failed reconnects)

    def stop(self) -> None:
        self._stopping.set()
        self.join()


# ---------------------------------------------------------------------------------------------------------
# The job, its memory and its tables
# ---------------------------------------------------------------------------------------------------------
def write_conf(root: Path, bootstrap: str, subscribers: dict[str, Subscriber], storage: Path,
               driver_java_options: str | None = None) -> Path:
    """The conf directory: herald.yaml with the shipped defaults but the bootstrap, the storage and the stack
    (and `spark.driver.extraJavaOptions`, when given)."""
    layout: dict[str, dict[str, dict]] = {topic: {} for topic in TOPICS}
    for name, subscriber in subscribers.items():
        topic = TOPICS[BAD.get(name, HEALTHY.get(name))]
        fields: dict = {"endpoint": subscriber.url, "startingOffsets": "latest"}
        if name == "hang":
            fields["subscriptionPolicy"] = {"requestTimeout": 60000}
        layout[topic][name] = fields
    conf = write_topics_conf(root, bootstrap, layout)
    settings: dict = {"kafka": {"bootstrapServers": bootstrap, "connector": "spark"},
                      "storage": {"path": str(storage), "engine": "spark"}}
    if driver_java_options:
        settings["spark"] = {"conf": {"spark.driver.extraJavaOptions": driver_java_options}}
    (conf / "herald.yaml").write_text(yaml.safe_dump(settings))
    return conf


class Job:
    """One `herald run --conf DIR` process (its own process group), its log in `log`."""

    env: dict[str, str] = {}  # added to the job's environment (its JVM inherits it)

    def __init__(self, conf: Path, log: Path) -> None:
        self.log = log
        self.launched = time.monotonic()
        with open(log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "herald", "run", "--conf", str(conf)], stdout=out,
                                            stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                            env={**os.environ, **Job.env})

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 300.0) -> tuple[int | None, float]:
        """SIGINT to herald alone (a terminal's Ctrl-C); (exit code, seconds to exit). After `timeout_s` its
        process group is killed (exit code None)."""
        began = time.monotonic()
        if self.alive():
            self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - began
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # what is left of its group (a JVM, Python workers)
        except ProcessLookupError:
            pass
        self.process.wait()
        return code, took


def memory(root_pid: int) -> dict[str, float]:
    """RSS (MiB) of the Python driver, its JVM(s) and the other processes of the tree (Spark's Python workers)."""
    figures = {"python": 0.0, "jvm": 0.0, "workers": 0.0, "worker_count": 0, "jvm_pid": None}
    for pid in _tree(root_pid):
        rss, _, name = _rss_pss(pid)
        if pid == root_pid:
            figures["python"] += rss / 2**20
        elif name == "java":
            figures["jvm"] += rss / 2**20
            figures["jvm_pid"] = pid
        elif name:
            figures["workers"] += rss / 2**20
            figures["worker_count"] += 1
    return figures


def heap(jvm_pid: int | None) -> str:
    """The JVM's heap from `jstat -gc` (it reads the JVM's performance counters: no pause), as text: committed and
    used heap, the old generation's use, metaspace used (MiB) and full GCs so far; empty without jstat."""
    jstat = shutil.which("jstat")
    if jvm_pid is None or jstat is None:
        return ""
    try:
        lines = subprocess.run([jstat, "-gc", str(jvm_pid)], capture_output=True, text=True, timeout=30,
                               check=False).stdout
        header, values = lines.splitlines()[:2]
        gc = {name: float(value) for name, value in zip(header.split(), values.split())}
    except (OSError, ValueError, subprocess.SubprocessError):
        return ""
    committed = (gc["S0C"] + gc["S1C"] + gc["EC"] + gc["OC"]) / 1024
    used = (gc["S0U"] + gc["S1U"] + gc["EU"] + gc["OU"]) / 1024
    return (f"  heap {used:.0f}/{committed:.0f} MiB (old {gc['OU'] / 1024:.0f}), metaspace {gc['MU'] / 1024:.0f} MiB, "
            f"full GCs {gc['FGC']:.0f}")


def live_heap_mib(jvm_pid: int | None) -> float | None:
    """The JVM's live heap (MiB): its used heap just after a full GC that `jcmd GC.run` asks for (one pause), so
    what the heap keeps and not what it has not collected yet. None without jcmd or jstat."""
    jcmd = shutil.which("jcmd")
    if jvm_pid is None or jcmd is None:
        return None
    try:
        subprocess.run([jcmd, str(jvm_pid), "GC.run"], capture_output=True, timeout=60, check=True)
        lines = subprocess.run([shutil.which("jstat") or "jstat", "-gc", str(jvm_pid)], capture_output=True,
                               text=True, timeout=30, check=True).stdout
        header, values = lines.splitlines()[:2]
        gc = {name: float(value) for name, value in zip(header.split(), values.split())}
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return (gc["S0U"] + gc["S1U"] + gc["EU"] + gc["OU"]) / 1024


NMT_AREA = re.compile(r"^-\s+(.+?) \(reserved=\d+KB(?: [+-]\d+KB)?, committed=(\d+)KB(?: ([+-]\d+)KB)?\)")
NMT_TOTAL = re.compile(r"^Total: reserved=\d+KB(?: [+-]\d+KB)?, committed=(\d+)KB(?: ([+-]\d+)KB)?")


def native_memory(jvm_pid: int | None, command: str) -> str | None:
    """`jcmd <pid> VM.native_memory <command>` (the JVM runs with -XX:NativeMemoryTracking); None without it."""
    jcmd = shutil.which("jcmd")
    if jvm_pid is None or jcmd is None:
        return None
    try:
        return subprocess.run([jcmd, str(jvm_pid), "VM.native_memory", command], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def native_memory_growth(diff: str) -> tuple[float, float, list[tuple[str, float, float]]] | None:
    """From `summary.diff` against the baseline: (the JVM's committed total, MiB; its change since the baseline,
    MiB; each area's (name, committed MiB, change MiB), the largest changes first). None when it says nothing."""
    total = None
    areas = []
    for line in diff.splitlines():
        found = NMT_TOTAL.match(line)
        if found:
            total = (int(found.group(1)) / 1024, int(found.group(2) or 0) / 1024)
        found = NMT_AREA.match(line.strip() if line.startswith("-") else line)
        if found:
            areas.append((found.group(1).strip(), int(found.group(2)) / 1024, int(found.group(3) or 0) / 1024))
    if total is None:
        return None
    return total[0], total[1], sorted(areas, key=lambda area: -abs(area[2]))


def tables(storage: Path) -> dict[str, tuple[int, int, int]]:
    """table -> (rows, files, version), read with delta-rs; (-1, -1, -1) for one that could not be read."""
    from deltalake import DeltaTable

    found: dict[str, tuple[int, int, int]] = {}
    for path in sorted((storage / "tables").glob("*")):
        if not (path / "_delta_log").is_dir():
            continue
        try:
            table = DeltaTable(str(path))
            found[path.name] = (table.to_pyarrow_dataset().count_rows(), len(table.file_uris()), table.version())
        except Exception:  # noqa: BLE001 - a read racing a commit: the next sample reads it
            found[path.name] = (-1, -1, -1)
    return found


def newest_rows(storage: Path, table: str, keys: list[str], newest_first: list[str], columns: list[str]):
    """The newest row of each key of a table (delta-rs; rows ordered by `newest_first`, descending), as a pyarrow
    table of `keys` and `columns`, with the subscription's short name in `name`; None when there is no table."""
    import numpy as np
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    path = storage / "tables" / table
    if not (path / "_delta_log").is_dir():
        return None
    rows = DeltaTable(str(path)).to_pyarrow_table(columns=[*keys, *newest_first, *columns])
    if rows.num_rows == 0:
        return None
    rows = rows.sort_by([(key, "ascending") for key in keys] + [(key, "descending") for key in newest_first])
    newest = np.zeros(rows.num_rows, dtype=bool)
    newest[0] = True  # in this order, the first row of each key is its newest
    for key in keys:
        values = pc.dictionary_encode(rows[key]).combine_chunks().indices if key in ("subscription", "topic") \
            else rows[key].combine_chunks()
        values = values.to_numpy(zero_copy_only=False)
        newest[1:] |= values[1:] != values[:-1]
    rows = rows.filter(newest)
    names = [subscription.rsplit(".", 1)[-1] for subscription in rows["subscription"].to_pylist()]
    return rows.append_column("name", [names])


def parked(storage: Path) -> dict[str, int]:
    """subscription name -> messages parked: the newest `retries` row of each (subscription, partition, offset),
    by recorded_at then batch_id, in state PARKED (as `engine/triggers/retry_driver.py` loads them at a job's start)."""
    rows = newest_rows(storage, "retries", ["subscription", "partition", "offset"], ["recorded_at", "batch_id"],
                       ["state"])
    counts: dict[str, int] = {}
    for name, state in zip(*(rows.column(c).to_pylist() for c in ("name", "state"))) if rows is not None else ():
        if state == "PARKED":
            counts[name] = counts.get(name, 0) + 1
    return counts


def lags(storage: Path, published: list[int]) -> dict[str, int]:
    """subscription name -> messages between its position in the offsets table (its newest row per partition)
    and the end of its topic (`published`: per topic, how many messages the publisher has produced)."""
    rows = newest_rows(storage, "offsets", ["subscription", "topic", "partition"], ["committed_at", "batch_id"],
                       ["offset"])
    found: dict[str, int] = {}
    for name, topic, partition, offset in zip(*(rows.column(c).to_pylist() for c in
                                                ("name", "topic", "partition", "offset"))) if rows is not None else ():
        produced = published[TOPICS.index(topic)]
        found[name] = found.get(name, 0) + (produced - partition + PARTITIONS - 1) // PARTITIONS - offset
    return found


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, value) points, per hour; None for fewer than two points."""
    if len(points) < 2:
        return None
    import numpy as np

    seconds, values = np.array(points).T
    return float(np.polyfit(seconds / 3600.0, values, 1)[0])


# ---------------------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------------------
def sample(job: Job, storage: Path, arrivals: Arrivals, subscribers: dict[str, Subscriber], published: list[int],
           since: float, cpu_before: float) -> tuple[dict, float]:
    """One sample, printed (three lines); returns its figures and the job's process tree's CPU seconds now."""
    now = time.monotonic()
    rss = memory(job.process.pid)
    cpu = sum(_cpu_s(pid) for pid in _tree(job.process.pid))
    window = arrivals.take_window()
    counts = {name: subscriber.take_counts() for name, subscriber in subscribers.items()}
    found = tables(storage)
    try:
        parked_now, lag = parked(storage), lags(storage, published)
    except Exception as error:  # noqa: BLE001 - a read racing a commit: the next sample reads it
        print(f"            (tables not read: {type(error).__name__}: {error})", flush=True)
        parked_now, lag = {}, {}
    figures = {"t": now - job.launched, "driver": rss["python"] + rss["jvm"], "python": rss["python"],
               "jvm": rss["jvm"], "jvm_pid": rss["jvm_pid"], "tables": found,
               "parked": sum(parked_now.values()), "latencies": window}
    latency = (f"{len(window)} arrivals, p50 {percentile(window, 0.5):.0f} ms, p99 {percentile(window, 0.99):.0f} ms"
               if window else "no arrivals")
    print(f"  t {figures['t'] / 60:5.1f} min  driver RSS {figures['driver']:.0f} MiB (Python {rss['python']:.0f}, "
          f"JVM {rss['jvm']:.0f}{heap(rss['jvm_pid'])})  Python workers {rss['worker_count']} {rss['workers']:.0f} MiB"
          f"  CPU {(cpu - cpu_before) / max(now - since, 1e-9):.2f} cores  load {os.getloadavg()[0]:.1f}", flush=True)
    healthy_lag = max((lag.get(name, 0) for name in HEALTHY), default=0)
    print(f"            healthy: {latency}; requests: healthy {sum(counts[name][0] for name in HEALTHY)}, "
          + ", ".join(f"{name} {counts[name][0]} ({counts[name][1]} failed)" for name in BAD)
          + f"; parked {figures['parked']} (" + ", ".join(f"{k} {v}" for k, v in sorted(parked_now.items()))
          + "); lag " + ", ".join(f"{name} {lag.get(name, '?')}" for name in BAD) + f", healthy max {healthy_lag}",
          flush=True)
    print("            tables rows/files/version: "
          + ", ".join(f"{name} {rows}/{files}/v{version}" for name, (rows, files, version) in found.items()),
          flush=True)
    return figures, cpu


def wait_for_first_delivery(job: Job, arrivals: Arrivals, timeout_s: float) -> tuple[float | None, float | None]:
    """Seconds from the job's launch to the first arrival at a healthy subscriber, and to its read-started log
    line (None: not within `timeout_s`, or the job exited)."""
    read_started = None
    deadline = job.launched + timeout_s
    while time.monotonic() < deadline and job.alive():
        if read_started is None and READ_STARTED in job.log_text():
            read_started = time.monotonic() - job.launched
        with arrivals.lock:
            first = arrivals.first_after
        if first is not None:
            if read_started is None and READ_STARTED in job.log_text():
                read_started = time.monotonic() - job.launched
            return first - job.launched, read_started
        time.sleep(0.1)
    return None, read_started


def timed_start(label: str, conf: Path, log: Path, arrivals: Arrivals) -> tuple[Job, float | None]:
    """Launch a job and time its start; prints a line."""
    job = Job(conf, log)
    arrivals.watch(job.launched)
    first, read = wait_for_first_delivery(job, arrivals, timeout_s=900)
    read_text = f"{read:.1f} s" if read is not None else "not seen"
    first_text = f"{first:.1f} s" if first is not None else "none within 900 s"
    print(f"  {label}: first healthy delivery {first_text} after launch (read started: {read_text}); "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    if first is None:
        print("    last lines of its log:\n      " + "\n      ".join(job.log_text().splitlines()[-20:]), flush=True)
    return job, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="the soak's length, minutes (default 20)")
    parser.add_argument("--rate", type=float, default=200.0, help="messages a second over the 3 topics (default 200)")
    parser.add_argument("--keep", action="store_true", help="keep the logs and tables (the path is printed)")
    parser.add_argument("--lazy-heap", action="store_true",
                        help="leave the driver JVM's heap to grow as the JVM likes (default: committed and touched "
                             "at its start, so that RSS growth is what grows, not the heap filling up to -Xmx)")
    parser.add_argument("--malloc-arena-max", type=int, default=None,
                        help="MALLOC_ARENA_MAX for the job's processes (glibc's arenas; default: glibc's own)")
    args = parser.parse_args()
    jvm = None if args.lazy_heap else TOUCHED_HEAP
    if args.malloc_arena_max is not None:
        Job.env = {"MALLOC_ARENA_MAX": str(args.malloc_arena_max)}

    root = Path(tempfile.mkdtemp(prefix="herald-soak-bench-"))
    broker = KafkaBroker(root / "kafka")
    arrivals = Arrivals()
    began = time.monotonic()
    subscribers = {name: Subscriber(name, arrivals, began) for name in (*BAD, *HEALTHY)}
    publisher = None
    jobs: list[Job] = []
    try:
        broker.start()
        broker.create_topics({topic: PARTITIONS for topic in TOPICS})
        storage = root / "storage"
        conf = write_conf(root / "soak", broker.bootstrap_servers, subscribers, storage, jvm)
        fresh_storage = root / "fresh-storage"
        fresh_conf = write_conf(root / "fresh", broker.bootstrap_servers, subscribers, fresh_storage, jvm)
        print(f"soak: {args.minutes:g} min, {args.rate:g} msg/s over {len(TOPICS)} topics x {PARTITIONS} partitions, "
              f"12 subscriptions (hang, down, flap, 9 healthy); Spark's Kafka source, delta-spark, local[*] on "
              f"{os.cpu_count()} CPUs (Spark's executor is the driver's JVM); load {os.getloadavg()[0]:.1f}",
              flush=True)
        publisher = Publisher(broker.bootstrap_servers, args.rate)
        publisher.start()
        print(f"driver JVM options: {jvm or 'Herald local defaults (the heap grows as the JVM likes)'}"
              + (f"; MALLOC_ARENA_MAX={args.malloc_arena_max}" if args.malloc_arena_max is not None else ""),
              flush=True)
        job = Job(conf, root / "soak.log")
        jobs.append(job)
        ready_by = time.monotonic() + 900
        while time.monotonic() < ready_by and job.alive() and not all(arrivals.seen[name] for name in HEALTHY):
            time.sleep(0.2)
        if not all(arrivals.seen[name] for name in HEALTHY):
            raise SystemExit("herald run did not reach every healthy subscriber within 900 s; last lines:\n"
                             + "\n".join(job.log_text().splitlines()[-30:]))
        soak_from = time.monotonic()
        firsts = list(publisher.published)  # per topic, the first message the soak counts
        with arrivals.lock:
            arrivals.soak_from_ms = time.time() * 1000
        print(f"ready {soak_from - job.launched:.1f} s after launch; a sample every {SAMPLE_EVERY_S:g} s",
              flush=True)
        samples, cpu, since = [], 0.0, job.launched  # the first sample's CPU: since the launch
        live: list[tuple[float, float | None]] = []  # (t, the JVM's live heap, MiB) settled and at the end
        jvm_at_baseline = 0.0  # the JVM's RSS (MiB) when native memory tracking took its baseline
        for subscriber in subscribers.values():
            subscriber.take_counts()
        arrivals.take_window()
        end = soak_from + args.minutes * 60
        next_at = soak_from
        while True:
            time.sleep(max(0.0, next_at - time.monotonic()))
            if not job.alive():
                print(f"!! herald run exited {job.process.returncode} during the soak", flush=True)
                break
            figures, cpu = sample(job, storage, arrivals, subscribers, list(publisher.published), since, cpu)
            samples.append(figures)
            if (not live and figures["t"] >= FIT_AFTER_S) or next_at >= end:  # once settled, and at the end
                live.append((figures["t"], live_heap_mib(figures["jvm_pid"])))
                print(f"            JVM live heap after a full GC: {live[-1][1]} MiB", flush=True)
                if len(live) == 1:  # the JVM's own areas from here on
                    native_memory(figures["jvm_pid"], "baseline")
                    jvm_at_baseline = figures["jvm"]
                else:
                    native = native_memory_growth(native_memory(figures["jvm_pid"], "summary.diff") or "")
                    if native is not None:
                        total, grown, areas = native
                        span_h = (live[-1][0] - live[0][0]) / 3600
                        shown = ", ".join(f"{name} {size:.0f} MiB ({change:+.1f})" for name, size, change in areas[:6])
                        rss_grown = figures["jvm"] - jvm_at_baseline
                        print(f"JVM native memory tracking since {live[0][0] / 60:.1f} min: committed {total:.0f} MiB, "
                              f"{grown:+.1f} MiB ({grown / span_h:+.1f} MiB/h); by area: {shown}; the JVM's RSS "
                              f"{rss_grown:+.1f} MiB meanwhile, so {rss_grown - grown:+.1f} MiB outside what the JVM "
                              "tracks (native libraries' own allocations, the allocator's arenas)", flush=True)
            since = time.monotonic()
            if next_at >= end:
                break
            next_at = min(next_at + SAMPLE_EVERY_S, end)
        with arrivals.lock:
            arrivals.soak_until_ms = time.time() * 1000
        soak_published = list(publisher.published)

        code, took = job.stop()
        print(f"stopped with SIGINT: exit {code} after {took:.1f} s", flush=True)
        restarted, restart_s = timed_start("restart on the same storage", conf, root / "restart.log", arrivals)
        jobs.append(restarted)
        loaded = [line for line in restarted.log_text().splitlines() if "parked message(s) to retry" in line]
        print(f"    {loaded[-1].strip() if loaded else 'no parked messages loaded (log)'}", flush=True)
        check_by = time.monotonic() + 240
        missing = {}
        while restarted.alive():
            missing = {name: arrivals.missing(name, firsts[topic], soak_published[topic])
                       for name, topic in HEALTHY.items()}
            if not any(missing.values()) or time.monotonic() > check_by:
                break
            time.sleep(2)
        after_s = time.monotonic() - end
        short = ", ".join(f"{name} {count}" for name, count in missing.items() if count) or "none"
        print(f"    messages of the soak not received by a healthy subscriber {after_s:.0f} s after its end: "
              f"{sum(missing.values())} ({short}); duplicates so far {arrivals.duplicates}", flush=True)
        code, took = restarted.stop()
        print(f"    stopped: exit {code} after {took:.1f} s", flush=True)
        fresh, fresh_s = timed_start("fresh job on an empty storage path", fresh_conf, root / "fresh.log", arrivals)
        jobs.append(fresh)
        code, took = fresh.stop()
        print(f"    stopped: exit {code} after {took:.1f} s", flush=True)

        whole = list(arrivals.soak)
        settled = [s for s in samples if s["t"] >= FIT_AFTER_S]
        fitted_on = "windows ending 5 minutes or more after the launch"
        if len(settled) < 3:
            settled = samples[len(samples) // 2:]
            fitted_on = "the second half of the samples (the run is too short for 5 minutes)"
        latencies = [latency for s in settled for latency in s["latencies"]]
        rss_growth = slope_per_hour([(s["t"], s["driver"]) for s in settled])
        offsets_rows = slope_per_hour([(s["t"], s["tables"]["offsets"][0]) for s in settled
                                       if s["tables"].get("offsets", (-1,))[0] >= 0])
        print(f"published {sum(soak_published) - sum(firsts)} during the soak ({publisher.errors} produce errors, "
              f"{publisher.late_s:.1f} s behind schedule); load {os.getloadavg()[0]:.1f}", flush=True)
        for label, values in (("whole soak", whole), (fitted_on, latencies)):
            print(f"healthy arrivals, {label}: {len(values)}, p50 {percentile(values, 0.5):.0f} ms, "
                  f"p99 {percentile(values, 0.99):.0f} ms, max {max(values):.0f} ms" if values
                  else f"healthy arrivals, {label}: none", flush=True)
        late = slope_per_hour([(s["t"], s["driver"]) for s in samples[len(samples) // 2:]])
        print(f"driver RSS growth over the soak's second half, for comparison: {late:.1f} MiB/h" if late is not None
              else "driver RSS growth over the soak's second half: too few samples", flush=True)
        print(f"fits on {fitted_on} ({len(settled)} samples): driver RSS {settled[0]['driver']:.0f} -> "
              f"{settled[-1]['driver']:.0f} MiB, offsets rows {settled[0]['tables'].get('offsets', ('?',))[0]} -> "
              f"{settled[-1]['tables'].get('offsets', ('?',))[0]}; parked at the end {samples[-1]['parked']}",
              flush=True)
        def shown(value, spec):
            return format(value, spec) if value is not None else "?"

        python_growth = slope_per_hour([(s["t"], s["python"]) for s in settled])
        print(f"of which the Python driver: {shown(python_growth, '.1f')} MiB/h "
              f"({settled[0]['python']:.0f} -> {settled[-1]['python']:.0f} MiB)", flush=True)
        if len(live) == 2 and None not in (live[0][1], live[1][1]) and live[1][0] > live[0][0]:
            (t0, heap0), (t1, heap1) = live
            print(f"and the JVM's live heap (after a full GC): {heap0:.0f} MiB at {t0 / 60:.1f} min, {heap1:.0f} MiB "
                  f"at {t1 / 60:.1f} min: {(heap1 - heap0) * 3600 / (t1 - t0):.1f} MiB/h (the rest of the JVM's "
                  "growth is heap it had not collected yet, up to its -Xmx)", flush=True)
        print("targets: healthy p99 at most 3000 ms while the neighbour hangs, driver RSS growth at most 50 MiB/h "
              "after the first 5 minutes, restart ratio at most 1.2", flush=True)

        ratio = restart_s / fresh_s if restart_s and fresh_s else None
        print(f"soak: healthy p99 {shown(percentile(latencies, 0.99) if latencies else None, '.0f')} ms, "
              f"driver RSS growth {shown(rss_growth, '.1f')} MiB/h, "
              f"offsets rows per hour {shown(offsets_rows, '.0f')}, restart ratio {shown(ratio, '.2f')}", flush=True)
    finally:
        if publisher is not None:
            publisher.stop()
        for job in jobs:
            if job.alive():
                job.stop(60)
        for subscriber in subscribers.values():
            subscriber.stop()
        broker.stop()
        if args.keep:
            print(f"kept: {root} (soak.log, restart.log, fresh.log, conf and storage)")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
