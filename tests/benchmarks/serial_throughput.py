"""SERIAL delivery throughput: Herald vs the hand-written consumer + thread pool a user would write instead.

Run:  .venv/bin/python tests/benchmarks/serial_throughput.py [--messages 20000] [--inflight 64]

What it does (prints figures, asserts nothing):

1. Starts a local HTTP sink: nginx from Debian as a foreground child with its own config in a temp dir on a
   free 127.0.0.1 port (`return 200 "ok"` for any method, keep-alive, access_log off, stub_status on a separate
   location for counting). Without nginx it falls back to a threaded Python sink and says so.
2. Starts the embedded broker (noida-db) on a free port, creates one topic with 4 partitions and produces the
   same N JSON messages (~200 bytes, current timestamps) once, message i to partition i % 4 (--kafka-partitioner:
   the client's default partitioner instead, which fills keyless partitions very unequally).
3. Runs, each in its own subprocess, in the order baseline, aiohttp, Herald (1 batch), baseline, aiohttp,
   Herald (4 batches), baseline, aiohttp, so that every Herald run is bracketed by baseline runs and none
   gets a warm-cache advantage; each baseline's figure is the mean of its runs. Then Herald (4 batches) with
   `trackingAll` and a last baseline: the `tracking:` line is its time against the trackingOff run
   (--no-tracking skips it).
   - aiohttp (what a strong engineer would write instead): the same consumer feeding aiohttp on asyncio,
     one ClientSession with at most K connections, at most K messages unanswered.
   - baseline: confluent-kafka Consumer assigned to all partitions from offset 0, `consume()` in bulk, each
     message posted by a ThreadPoolExecutor(max_workers=K) with one keep-alive requests.Session per thread,
     at most K messages read and not yet answered (as Herald's inflightSize); the same headers Herald sends
     (Content-Type, Hermes-Message-Id as a uuid5 of topic/partition/offset, Hermes-Retry-Count).
     Timed from creating the consumer to the N-th 2xx answer.
   - Herald: a conf dir with one subscription (startingOffsets earliest, inflightSize K, rate 100000, no
     filters), `Runner(load_config(conf), spark=session).run(once=True)`; the SparkSession
     (`get_or_create_session("local[2]")`) is created BEFORE the clock starts, so JVM/session startup is
     excluded. Timed until `run()` returns (also: until the last batch's senders finished, from the metrics
     table). maxOffsetsPerTrigger = N (one micro-batch) and N/4 (four micro-batches).
4. Memory: while a run's subprocess lives, its whole process tree is sampled from /proc every 100 ms (for
   Herald: the Python driver, the JVM it launches and Spark's Python workers and planner). Reported: the
   peak of the summed RSS and the peak of the summed PSS (shared pages split between processes, so forked
   Python workers are not double counted). Short-lived processes may be missed between samples.
5. Delivered requests are counted at the sink (nginx stub_status `requests` before and after each run,
   minus the status requests themselves); with --log-ids nginx also logs each Hermes-Message-Id (buffered)
   and the distinct ids are counted per run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

TOPIC = "bench.serial"
SUBSCRIPTION = "serial-bench"
PARTITIONS = 4
STATUS_PATH = "/__sink_status"
MESSAGE_ID_NAMESPACE = uuid.UUID("6f1c9a8e-3b7d-5e2a-9c41-8d0b7e5f2a13")  # the same ids Herald computes
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------------------------------------------------
# The HTTP sink
# ---------------------------------------------------------------------------------------------------------
NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 2;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    {access_log}
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    client_body_buffer_size 64k;
    keepalive_timeout 120s;
    keepalive_requests 10000000;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = {status} {{
            access_log off;
            stub_status;
        }}
        location / {{
            default_type text/plain;
            return 200 "ok";
        }}
    }}
}}
"""


class NginxSink:
    kind = "nginx"

    def __init__(self, root: Path, log_ids: bool) -> None:
        self.root = root / "nginx"
        self.root.mkdir(parents=True)
        os.chmod(self.root, 0o755)
        self.port = free_port()
        self.ids_path = self.root / "ids.log" if log_ids else None
        access_log = "access_log off;"  # (an `access_log off` would cancel any other access_log of its level)
        if self.ids_path is not None:
            access_log = (f"log_format ids '$http_hermes_message_id';\n"
                          f"    access_log {self.ids_path} ids buffer=256k flush=1s;")
        conf = NGINX_CONF.format(root=self.root, port=self.port, status=STATUS_PATH, access_log=access_log)
        (self.root / "nginx.conf").write_text(conf)
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.version = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr.strip()
        self.process = subprocess.Popen(
            [binary, "-p", str(self.root), "-c", str(self.root / "nginx.conf"), "-e", str(self.root / "error.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        if not wait_port(self.port) or self.process.poll() is not None:
            error = self.process.stderr.read().decode() if self.process.poll() is not None else "no answer"
            self.stop()
            raise RuntimeError(f"nginx did not start: {error}")
        self._ids_offset = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"

    def count(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{STATUS_PATH}", timeout=5) as answer:
            text = answer.read().decode()
        # "Active connections: 1 \nserver accepts handled requests\n 5 5 7 \nReading: ..."
        return int(text.splitlines()[2].split()[2])

    def ids_since_last(self) -> tuple[int, int] | None:
        """(lines, distinct ids) logged since the last call; None without --log-ids."""
        if self.ids_path is None:
            return None
        time.sleep(1.3)  # the access log is flushed at least every second
        with open(self.ids_path, "rb") as log:
            log.seek(self._ids_offset)
            data = log.read()
        cut = data.rfind(b"\n") + 1
        self._ids_offset += cut
        lines = [line for line in data[:cut].split(b"\n") if line and line != b"-"]
        return len(lines), len(set(lines))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: finish open requests, then exit
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class PythonSink:
    """Fallback: a threaded http.server in its own process (far slower than nginx; the figures say so)."""

    kind = "python http.server (fallback: nginx unavailable)"
    version = ""

    def __init__(self, root: Path, log_ids: bool) -> None:
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, __file__, "--role", "pysink", "--port", str(self.port)])
        if not wait_port(self.port):
            self.stop()
            raise RuntimeError("the Python sink did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"

    def count(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{STATUS_PATH}", timeout=5) as answer:
            return int(answer.read())

    def ids_since_last(self):
        return None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def python_sink(port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    lock = threading.Lock()
    counter = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, body: bytes) -> None:
            with lock:
                counter[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer(b"ok")

        def do_GET(self):  # noqa: N802
            self._answer(str(counter[0] + 1).encode() if self.path == STATUS_PATH else b"ok")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.request_queue_size = 1024
    server.serve_forever()


def start_sink(root: Path, log_ids: bool):
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        print("nginx not found: installing it with apt-get (Debian package) ...", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "nginx"]):
            try:
                subprocess.run(command, env=env, capture_output=True, timeout=300, check=False)
            except (OSError, subprocess.TimeoutExpired) as error:
                print(f"  {' '.join(command)} failed: {error}")
                break
    try:
        return NginxSink(root, log_ids)
    except (OSError, RuntimeError) as error:
        print(f"!! nginx could not be used ({error}); FALLING BACK to a Python sink: figures are sink-bound")
        return PythonSink(root, log_ids)


# ---------------------------------------------------------------------------------------------------------
# Memory of a process tree, from /proc
# ---------------------------------------------------------------------------------------------------------
def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return children


def _tree(root: int) -> list[int]:
    children = _children_map()
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(children.get(pid, ()))
    return pids


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(root: int) -> float:
    return sum(_cpu_s(pid) for pid in _tree(root))


def machine_busy_s() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (everything but idle and iowait)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLOCK_TICKS


def _rss_pss(pid: int) -> tuple[int, int, str]:
    """(RSS bytes, PSS bytes, command name) of one process; zeros when it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            rss = int(statm.read().split()[1]) * PAGE_SIZE
        pss = 0
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
        with open(f"/proc/{pid}/comm") as comm:
            name = comm.read().strip()
        return rss, pss, name
    except (OSError, ValueError, IndexError):
        return 0, 0, ""


class TreeMemory:
    """Samples the summed RSS and PSS of a process and all its descendants until stopped; also adds up the CPU
    time of every process it saw (as last sampled: CPU used after the last sample of a process is missed)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes: dict[str, int] = {}  # at the RSS peak: command name -> RSS
        self.peak_counts: dict[str, int] = {}  # at the RSS peak: command name -> how many processes
        self.samples = 0
        self.processes_seen = 0
        self._cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            total_rss = total_pss = 0
            by_name: dict[str, int] = {}
            counts: dict[str, int] = {}
            for pid in _tree(self.pid):
                rss, pss, name = _rss_pss(pid)
                cpu = _cpu_s(pid)
                if cpu:
                    self._cpu[pid] = max(self._cpu.get(pid, 0.0), cpu)
                total_rss += rss
                total_pss += pss
                if name:
                    by_name[name] = by_name.get(name, 0) + rss
                    counts[name] = counts.get(name, 0) + 1
            self.samples += 1
            if total_rss > self.peak_rss:
                self.peak_rss, self.peak_processes, self.peak_counts = total_rss, by_name, counts
            self.peak_pss = max(self.peak_pss, total_pss)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())

    @property
    def process_count(self) -> int:
        return len(self._cpu)


# ---------------------------------------------------------------------------------------------------------
# The messages
# ---------------------------------------------------------------------------------------------------------
def documents(n: int) -> list[dict]:
    """N JSON documents of about 200 bytes each."""
    countries = ["PL", "DE", "GB", "FR"]
    result = []
    for i in range(n):
        document = {
            "id": i,
            "type": "order.created",
            "amount": round(10 + (i % 1000) * 1.25, 2),
            "currency": "PLN",
            "user": {"name": f"user{i % 997}", "email": f"user{i % 997}@example.com", "country": countries[i % 4]},
            "note": "",
        }
        pad = 200 - len(json.dumps(document))
        document["note"] = "lorem ipsum dolor sit amet consectetur"[: max(0, pad)].ljust(max(0, pad), "x")
        result.append(document)
    return result


def produce_messages(bootstrap: str, n: int, spread: bool) -> list[int]:
    """Produce the N documents once; `spread`: message i to partition i % PARTITIONS (equal partitions),
    else the client's default partitioner (sticky for keyless records: partitions of very unequal size).
    Returns the number of records in each partition."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    if spread:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        errors: list = []
        for i, document in enumerate(documents(n)):
            producer.produce(TOPIC, value=json.dumps(document).encode(), partition=i % PARTITIONS,
                             on_delivery=lambda error, _: errors.append(error) if error else None)
            if i % 10000 == 0:
                producer.poll(0)
        producer.flush(60)
        if errors:
            raise RuntimeError(f"producing failed: {errors[:3]}")
    else:
        from tests.support.herald_env import produce

        produce(bootstrap, TOPIC, documents(n))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-sizes-{uuid.uuid4()}"})
    try:
        sizes = []
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)
            sizes.append(high - low)
        return sizes
    finally:
        consumer.close()


# ---------------------------------------------------------------------------------------------------------
# Role: baseline (a subprocess)
# ---------------------------------------------------------------------------------------------------------
def run_baseline(args) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import requests
    from confluent_kafka import Consumer, TopicPartition

    n, k = args.messages, args.inflight
    local = threading.local()
    lock = threading.Lock()
    room = threading.BoundedSemaphore(k)  # at most K read and not yet answered, as Herald's inflightSize
    done = threading.Event()
    state = {"ok": 0, "failed": 0, "last_ok": 0.0}

    def session() -> requests.Session:
        s = getattr(local, "session", None)
        if s is None:
            s = local.session = requests.Session()
        return s

    def post(value: bytes, message_id: str) -> None:
        try:
            answer = session().post(args.url, data=value, timeout=10, headers={
                "Content-Type": "application/json", "Hermes-Message-Id": message_id, "Hermes-Retry-Count": "0"})
            ok = 200 <= answer.status_code < 300
        except requests.RequestException:
            ok = False
        finally:
            room.release()
        with lock:
            if ok:
                state["ok"] += 1
                state["last_ok"] = time.perf_counter()
            else:
                state["failed"] += 1
            if state["ok"] + state["failed"] >= n:
                done.set()

    started = time.perf_counter()
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": f"bench-baseline-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "isolation.level": "read_uncommitted",
    })
    consumer.assign([TopicPartition(args.topic, p, 0) for p in range(PARTITIONS)])
    consumed = 0
    with ThreadPoolExecutor(max_workers=k) as pool:
        while consumed < n:
            for message in consumer.consume(1000, timeout=1.0):
                if message.error() is not None:
                    continue
                message_id = str(uuid.uuid5(MESSAGE_ID_NAMESPACE,
                                            f"{message.topic()}/{message.partition()}/{message.offset()}"))
                room.acquire()
                pool.submit(post, message.value(), message_id)
                consumed += 1
        done.wait(600)
    consumer.close()
    return {
        "seconds": state["last_ok"] - started,
        "delivered": state["ok"],
        "failed": state["failed"],
        "consumed": consumed,
    }


def run_aiohttp_baseline(args) -> dict:
    """What a strong engineer would write instead: confluent-kafka feeding aiohttp on asyncio, one
    ClientSession whose connector keeps at most K keep-alive connections, at most K messages unanswered."""
    import asyncio

    import aiohttp
    from confluent_kafka import Consumer, TopicPartition

    n, k = args.messages, args.inflight
    state = {"ok": 0, "failed": 0, "last_ok": 0.0, "consumed": 0}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        room = asyncio.Semaphore(k)
        finished = asyncio.Event()
        consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"bench-aiohttp-{uuid.uuid4()}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(args.topic, p, 0) for p in range(PARTITIONS)])
        connector = aiohttp.TCPConnector(limit=k, force_close=False)
        timeout = aiohttp.ClientTimeout(total=10)

        async def post(session, value: bytes, message_id: str) -> None:
            try:
                async with session.post(args.url, data=value, headers={
                        "Content-Type": "application/json", "Hermes-Message-Id": message_id,
                        "Hermes-Retry-Count": "0"}) as answer:
                    await answer.read()
                    ok = 200 <= answer.status < 300
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            finally:
                room.release()
            if ok:
                state["ok"] += 1
                state["last_ok"] = time.perf_counter()
            else:
                state["failed"] += 1
            if state["ok"] + state["failed"] >= n:
                finished.set()

        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            while state["consumed"] < n:
                messages = await loop.run_in_executor(None, consumer.consume, 1000, 1.0)
                for message in messages:
                    if message.error() is not None:
                        continue
                    message_id = str(uuid.uuid5(MESSAGE_ID_NAMESPACE,
                                                f"{message.topic()}/{message.partition()}/{message.offset()}"))
                    await room.acquire()
                    asyncio.ensure_future(post(session, message.value(), message_id))
                    state["consumed"] += 1
            await asyncio.wait_for(finished.wait(), 600)
        consumer.close()

    started = time.perf_counter()
    asyncio.run(main())
    return {"seconds": state["last_ok"] - started, "delivered": state["ok"], "failed": state["failed"],
            "consumed": state["consumed"]}


# ---------------------------------------------------------------------------------------------------------
# Role: Herald (a subprocess)
# ---------------------------------------------------------------------------------------------------------
def run_herald(args) -> dict:
    import logging
    from datetime import timezone

    from herald.config.loader import load_config
    from herald.engine.round.pipeline import TopicPipeline
    from herald.engine.runner import Runner
    from herald.session import get_or_create_session
    from herald.storage import DeltaRsStore
    from herald.storage.tables import METRICS, TRACKING
    from tests.support.herald_env import write_conf

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("herald").setLevel(logging.INFO)

    session_started = time.perf_counter()
    spark = get_or_create_session("local[2]")
    session_s = time.perf_counter() - session_started

    workdir = Path(args.workdir)
    conf = write_conf(
        workdir, args.bootstrap, args.topic,
        {SUBSCRIPTION: {"endpoint": args.url, "trackingMode": args.tracking,
                        "subscriptionPolicy": {"inflightSize": args.inflight, "rate": 100000}}},
        settings={"streaming": {"maxOffsetsPerTrigger": args.max_offsets},
                  "storage": {"engine": "deltalake"}},  # as its figures in README.md were measured
    )
    config = load_config(conf)

    # Timing only (no behaviour change): how long each foreachBatch call takes (the table writes happen on
    # the writer thread, beside the next batch).
    batch_times: list[dict] = []
    deliver_batch = TopicPipeline.deliver_batch

    def timed_deliver_batch(self, batch_df, batch_id, ranges, writer, **options):
        began = time.perf_counter()
        deliver_batch(self, batch_df, batch_id, ranges, writer, **options)
        batch_times.append({"batch_id": batch_id, "start": began - run_started,
                            "handle_s": time.perf_counter() - began})

    TopicPipeline.deliver_batch = timed_deliver_batch

    runner = Runner(config, spark=spark)
    run_started = time.perf_counter()
    run_started_ms = time.time() * 1000
    code = runner.run(once=True)
    run_s = time.perf_counter() - run_started

    stream = next(iter(runner.pipelines.values()))
    progress = []
    for item in stream.query.recentProgress:
        item = item if isinstance(item, dict) else json.loads(item.json)
        progress.append({"batch_id": item.get("batchId"), "rows": item.get("numInputRows"),
                         "duration_ms": item.get("durationMs", {})})

    rows = [row for row in DeltaRsStore(config.storage_path).read(METRICS, config.subscriptions[0].id).to_pylist()
            if row["kind"] in ("stream", "catchup") and row["read"]]  # a loaded machine may deliver by catch-up
    rows.sort(key=lambda row: row["batch_id"])
    metrics = []
    def epoch_ms(value):
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp() * 1000

    for row in rows:
        started_ms, finished_ms = epoch_ms(row["started_at"]), epoch_ms(row["finished_at"])
        metrics.append({
            "batch_id": row["batch_id"], "read": row["read"], "delivered": row["delivered"],
            "discarded": row["discarded"], "attempts": row["attempts"], "codes_2xx": row["codes_2xx"],
            "tasks_s": (finished_ms - started_ms) / 1000 if started_ms and finished_ms else None,
            "tasks_start_s": (started_ms - run_started_ms) / 1000 if started_ms else None,
            "tasks_end_s": (finished_ms - run_started_ms) / 1000 if finished_ms else None,
        })
    tracking_rows = DeltaRsStore(config.storage_path).read(TRACKING).num_rows if args.tracking != "trackingOff" else 0
    spark.stop()
    return {
        "tracking_rows": tracking_rows,
        "seconds": run_s,
        "to_last_delivery_s": max((m["tasks_end_s"] or 0) for m in metrics) if metrics else None,
        "session_s": session_s,
        "exit_code": code,
        "delivered": sum(m["delivered"] for m in metrics),
        "discarded": sum(m["discarded"] for m in metrics),
        "batches": metrics,
        "foreach_batch": batch_times,
        "progress": progress,
    }


# ---------------------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------------------
def run_child(role: str, args, sink, root: Path, extra: list[str], label: str) -> dict:
    slug = label.replace(" ", "-").replace("#", "")
    result_path = root / f"{slug}.json"
    log_path = root / f"{slug}.log"
    command = [sys.executable, __file__, "--role", role, "--messages", str(args.messages),
               "--inflight", str(args.inflight), "--bootstrap", args.bootstrap, "--topic", TOPIC,
               "--url", sink.url, "--result", str(result_path), *extra]
    before = sink.count()
    sink_cpu_before, busy_before, load_before = tree_cpu_s(sink.process.pid), machine_busy_s(), os.getloadavg()[0]
    began = time.perf_counter()
    with open(log_path, "wb") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        memory = TreeMemory(child.pid)
        try:
            child.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"!! {label} took longer than {args.timeout:.0f} s: stopping its process tree", flush=True)
            for pid in reversed(_tree(child.pid)):  # the run's own descendants (JVM, Python workers), by pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            child.wait()
        finally:
            memory.stop()
    wall_s = time.perf_counter() - began
    sink_cpu_s, busy_s = tree_cpu_s(sink.process.pid) - sink_cpu_before, machine_busy_s() - busy_before
    load_after = os.getloadavg()[0]
    after = sink.count()
    requests_seen = after - before - 1  # the second status request is counted in `after`
    ids = sink.ids_since_last()
    if child.returncode != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print(f"!! {label} failed (exit {child.returncode}); last lines of its log:\n   " + "\n   ".join(tail))
        result = {"seconds": float("nan"), "delivered": 0, "failed_run": True}
    else:
        result = json.loads(result_path.read_text())
    result.update(label=label, role=role, sink_requests=requests_seen, sink_ids=ids,
                  peak_rss=memory.peak_rss, peak_pss=memory.peak_pss, peak_processes=memory.peak_processes,
                  memory_samples=memory.samples, log=str(log_path), tree_cpu_s=memory.cpu_s,
                  tree_processes=memory.process_count, sink_cpu_s=sink_cpu_s, machine_busy_s=busy_s,
                  wall_s=wall_s, load=(load_before, load_after))
    print(f"   {label}: {result['seconds']:.2f} s, sink counted {requests_seen} requests"
          + (f" ({ids[1]} distinct ids in {ids[0]} log lines)" if ids else ""), flush=True)
    return result


def mib(value: int) -> str:
    return f"{value / 2**20:,.0f} MiB"


def _fmt(value, spec: str, width: int) -> str:
    if value is None or value != value:  # None or NaN
        return f"{'-':>{width}}"
    return f"{value:>{width}{spec}}"


def report(args, sink, runs: list[dict], produce_s: float) -> None:
    n = args.messages
    ok = [r for r in runs if not r.get("failed_run")]
    baselines = [r for r in ok if r["role"] == "baseline"]
    heralds = [r for r in ok if r["role"] == "herald"]
    base_s = statistics.mean(r["seconds"] for r in baselines) if baselines else float("nan")

    print()
    print("=" * 100)
    print(f"SERIAL throughput: N={n} messages (~200 B JSON) on {PARTITIONS} partitions "
          f"{args.partition_sizes}, inflight K={args.inflight}, {os.cpu_count()} CPUs")
    print(f"sink: {sink.kind} {sink.version} at {sink.url}")
    print(f"broker: noida-db, messages produced once in {produce_s:.1f} s")
    print("order: " + " -> ".join(r["label"] for r in runs) + "; each run in its own subprocess (cold Python, cold "
          "JVM); baseline = mean of its runs")
    print()
    header = (f"{'run':<22}{'delivered':>10}{'sink reqs':>10}{'seconds':>9}{'msg/s':>8}{'time vs base':>13}"
              f"{'peak RSS':>11}{'peak PSS':>11}")
    print(header)
    print("-" * len(header))
    for r in runs:
        ratio = r["seconds"] / base_s if r["role"] == "herald" else None
        print(f"{r['label']:<22}{r.get('delivered', 0):>10}{r['sink_requests']:>10}{_fmt(r['seconds'], '.2f', 9)}"
              f"{_fmt(n / r['seconds'] if r['seconds'] else None, '.0f', 8)}"
              f"{(f'{ratio:.2f}x' if ratio == ratio and ratio is not None else ''):>13}"
              f"{mib(r['peak_rss']):>11}{mib(r['peak_pss']):>11}")
    print("-" * len(header))
    if baselines:
        each = ", ".join(f"{r['seconds']:.2f}" for r in baselines)
        print(f"{'baseline mean':<22}{'':>10}{'':>10}{base_s:>9.2f}{n / base_s:>8.0f}{'':>13}"
              f"{mib(max(r['peak_rss'] for r in baselines)):>11}{mib(max(r['peak_pss'] for r in baselines)):>11}"
              f"   (runs: {each} s; memory: the largest)")
    aiohttps = [r for r in ok if r["role"] == "aiohttp"]
    aio_s = statistics.mean(r["seconds"] for r in aiohttps) if aiohttps else float("nan")
    if aiohttps:
        each = ", ".join(f"{r['seconds']:.2f}" for r in aiohttps)
        print(f"{'aiohttp mean':<22}{'':>10}{'':>10}{aio_s:>9.2f}{n / aio_s:>8.0f}{'':>13}"
              f"{mib(max(r['peak_rss'] for r in aiohttps)):>11}{mib(max(r['peak_pss'] for r in aiohttps)):>11}"
              f"   (runs: {each} s)")
    for r in heralds:
        ratio = r["seconds"] / base_s
        print(f"{r['label']:<22} Herald/baseline: {ratio:.2f}x the time, {1 / ratio:.2f}x the throughput"
              f" (excluding SparkSession startup of {r['session_s']:.1f} s)")
        if aiohttps:
            ratio = r["seconds"] / aio_s
            print(f"{r['label']:<22} Herald/aiohttp baseline: {ratio:.2f}x the time, {1 / ratio:.2f}x the throughput"
                  f" (excluding SparkSession startup)")
        with_startup = r["seconds"] + r["session_s"]
        print(f"{r['label']:<22} with SparkSession startup included: {with_startup:.2f} s, "
              f"{base_s / with_startup:.2f}x the requests baseline's throughput"
              + (f", {aio_s / with_startup:.2f}x the aiohttp baseline's" if aiohttps else ""))
    print()
    print("per CPU (messages per CPU-second of the run's whole process tree, start-up included; nginx excluded):")
    for r in ok:
        if r.get("tree_cpu_s"):
            print(f"  {r['label']:<22}{n / r['tree_cpu_s']:>9,.0f} msg per CPU-s  ({r['tree_cpu_s']:.1f} CPU-s)")
    for r in heralds:
        in_tasks = sum(m["tasks_s"] or 0 for m in r["batches"])
        cores = min(os.cpu_count() or 1, PARTITIONS)
        if in_tasks:
            rate = r["delivered"] / in_tasks
            print(f"  {r['label']:<22} in the delivery tasks: {rate:,.0f} msg/s on {cores} cores, "
                  f"{rate / cores:,.0f} msg/s per core (target >= 10,000)")
    print()
    print("seconds    baseline: creating the Kafka consumer .. the N-th 2xx answer.")
    print("           Herald: Runner(...).run(once=True) called .. returned; the SparkSession was created before "
          "(its startup is excluded and shown above).")
    print("delivered  baseline: 2xx answers it counted; Herald: `delivered` summed over its metrics table.")
    print("sink reqs  requests nginx counted during the run (stub_status `requests` delta, status requests excluded).")
    print("peak RSS   highest sampled sum of RSS over the run's subprocess and all its descendants (/proc every "
          "100 ms):")
    print("           baseline: one Python process; Herald: Python driver + JVM + every Spark Python worker, daemon")
    print("           and planner. PSS: the same, with pages shared between processes (forked workers) split.")

    print()
    print("CPU during each run (seconds of CPU; the machine has "
          f"{os.cpu_count()} CPUs, so 1 s of wall time offers {os.cpu_count()} CPU-s):")
    print(f"  {'run':<22}{'wall':>7}{'run tree':>10}{'procs':>7}{'nginx':>7}{'machine':>9}{'other':>7}"
          f"{'load avg':>13}")
    for r in runs:
        other = r["machine_busy_s"] - r["tree_cpu_s"] - r["sink_cpu_s"]
        print(f"  {r['label']:<22}{r['wall_s']:>7.1f}{r['tree_cpu_s']:>10.1f}{r['tree_processes']:>7}"
              f"{r['sink_cpu_s']:>7.1f}{r['machine_busy_s']:>9.1f}{other:>7.1f}"
              f"{r['load'][0]:>7.1f}->{r['load'][1]:<4.1f}")
    print("  wall/run tree: the whole subprocess (for Herald including SparkSession startup and shutdown); other = "
          "machine busy - run tree - nginx: the broker and anything else on the machine (other load inflates "
          "every figure above).")

    for r in heralds:
        print()
        print(f"{r['label']}: exit code {r['exit_code']}, delivered {r['delivered']}, discarded {r['discarded']}; "
              f"processes at the RSS peak: "
              + ", ".join(f"{name} {mib(rss)}" for name, rss in
                          sorted(r["peak_processes"].items(), key=lambda item: -item[1])[:3]))
        fbs = {entry["batch_id"]: entry for entry in r["foreach_batch"]}
        metrics = {entry["batch_id"]: entry for entry in r["batches"]}
        print(f"  {'batch':>5}{'rows':>7}{'trigger':>9}{'latestOffset':>13}{'planning':>9}{'addBatch':>9}"
              f"{'walCommit':>10}{'commit':>8}{'foreachBatch':>13}{'to tasks':>9}{'in tasks':>9}"
              f"{'msg/s in tasks':>15}")
        for progress in r["progress"]:
            d = progress["duration_ms"]
            fb = fbs.get(progress["batch_id"], {})
            m = metrics.get(progress["batch_id"], {})
            tasks_s = m.get("tasks_s")
            to_tasks = m["tasks_start_s"] - fb["start"] if fb and m.get("tasks_start_s") is not None else None
            print(f"  {progress['batch_id']:>5}{progress['rows']:>7}{d.get('triggerExecution', 0) / 1000:>9.2f}"
                  f"{d.get('latestOffset', 0) / 1000:>13.2f}{d.get('queryPlanning', 0) / 1000:>9.2f}"
                  f"{d.get('addBatch', 0) / 1000:>9.2f}{d.get('walCommit', 0) / 1000:>10.2f}"
                  f"{d.get('commitOffsets', 0) / 1000:>8.2f}{_fmt(fb.get('handle_s'), '.2f', 13)}"
                  f"{_fmt(to_tasks, '.2f', 9)}{_fmt(tasks_s, '.2f', 9)}"
                  f"{_fmt(m.get('delivered', 0) / tasks_s if tasks_s else None, '.0f', 15)}")
        in_tasks = sum(m["tasks_s"] or 0 for m in r["batches"])
        first_fb = r["foreach_batch"][0]["start"] if r["foreach_batch"] else float("nan")
        first_task = r["batches"][0]["tasks_start_s"] if r["batches"] else float("nan")
        triggers = sum(p["duration_ms"].get("triggerExecution", 0) for p in r["progress"]) / 1000
        print(f"  phases of the {r['seconds']:.2f} s: run() -> first foreachBatch call {first_fb:.2f} s; -> first "
              f"task delivering {first_task:.2f} s; tasks delivering (summed over batches) {in_tasks:.2f} s "
              f"({in_tasks / r['seconds']:.0%}); everything else {r['seconds'] - in_tasks:.2f} s "
              f"({1 - in_tasks / r['seconds']:.0%})")
        print(f"  sum of triggers {triggers:.2f} s; outside any trigger (query start, first offsets, stop) "
              f"{r['seconds'] - triggers:.2f} s; last task finished at {_fmt(r['to_last_delivery_s'], '.2f', 0)} s")
    tracked = [r for r in heralds if r["label"].endswith("trackingAll")]
    untracked = [r for r in heralds if r["label"] == "herald 4 batches"]
    if tracked and untracked:
        on, off = tracked[0], untracked[0]
        rows_written = on.get("tracking_rows")
        print()
        print(f"tracking: trackingAll / trackingOff time ratio {on['seconds'] / off['seconds']:.2f} "
              f"({on['seconds']:.2f} s vs {off['seconds']:.2f} s, 4 batches each; "
              f"CPU {on['tree_cpu_s']:.1f} vs {off['tree_cpu_s']:.1f} CPU-s; {rows_written} tracking rows)")
    if heralds:
        print()
        print("  columns (s): trigger..commit = Spark's StreamingQueryProgress.durationMs (triggerExecution, "
              "latestOffset, queryPlanning, addBatch, walCommit, commitOffsets); foreachBatch = Herald's "
              "deliver_batch (TopicPipeline); to tasks = foreachBatch call .. first task's sender "
              "started; in tasks = first task start .. last task end (as the tasks report it in the metrics table).")
    print("=" * 100)


def orchestrate(args) -> None:
    from herald.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix="herald-serial-bench-"))
    os.chmod(root, 0o755)
    sink = broker = None
    try:
        print(f"work dir {root}", flush=True)
        sink = start_sink(root, args.log_ids)
        print(f"sink: {sink.kind} {sink.version} at {sink.url}", flush=True)
        broker = EmbeddedBroker(root / "broker", port=free_port())
        broker.up()
        broker.create_topics({TOPIC: PARTITIONS})
        args.bootstrap = broker.bootstrap_servers
        began = time.perf_counter()
        args.partition_sizes = produce_messages(args.bootstrap, args.messages, spread=not args.kafka_partitioner)
        produce_s = time.perf_counter() - began
        print(f"broker {args.bootstrap}: produced {args.messages} messages to {TOPIC} in {produce_s:.1f} s; "
              f"records per partition {args.partition_sizes}", flush=True)
        sink.count()  # warm the status endpoint

        n = args.messages
        plan = [("baseline", [], "baseline #1"),
                ("aiohttp", [], "aiohttp #1"),
                ("herald", ["--max-offsets", str(n)], "herald 1 batch"),
                ("baseline", [], "baseline #2"),
                ("aiohttp", [], "aiohttp #2"),
                ("herald", ["--max-offsets", str(max(1, n // 4))], "herald 4 batches"),
                ("baseline", [], "baseline #3"),
                ("aiohttp", [], "aiohttp #3")]
        if not args.no_tracking:
            plan += [("herald", ["--max-offsets", str(max(1, n // 4)), "--tracking", "trackingAll"],
                      "herald 4b trackingAll"),
                     ("baseline", [], "baseline #4")]
        runs = []
        for role, extra, label in plan:
            if role == "herald":
                extra = [*extra, "--workdir", str(root / label.replace(" ", "-"))]
            print(f"running {label} ...", flush=True)
            runs.append(run_child(role, args, sink, root, extra, label))
        report(args, sink, runs, produce_s)
    finally:
        if sink is not None:
            sink.stop()
        if broker is not None:
            broker.down()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="N messages (default 20000)")
    parser.add_argument("--inflight", type=int, default=64, help="K: inflightSize / pool size (default 64)")
    parser.add_argument("--log-ids", action="store_true", help="nginx logs each Hermes-Message-Id (buffered) "
                        "and the distinct ids per run are counted (slightly slows the sink)")
    parser.add_argument("--kafka-partitioner", action="store_true", help="produce with the client's default "
                        "partitioner (sticky: partitions of very unequal size) instead of message i to partition "
                        "i %% 4")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (conf, logs, tables)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--role", default="orchestrate",
                        choices=["orchestrate", "baseline", "aiohttp", "herald", "pysink"],
                        help=argparse.SUPPRESS)
    for internal in ("--bootstrap", "--topic", "--url", "--result", "--workdir"):
        parser.add_argument(internal, help=argparse.SUPPRESS)
    parser.add_argument("--max-offsets", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tracking", default="trackingOff", help=argparse.SUPPRESS)
    parser.add_argument("--no-tracking", action="store_true", help="skip the trackingAll run (its cost line)")
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.role == "orchestrate":
        orchestrate(args)
    elif args.role == "pysink":
        python_sink(args.port)
    else:
        result = {"baseline": run_baseline, "aiohttp": run_aiohttp_baseline, "herald": run_herald}[args.role](args)
        Path(args.result).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
