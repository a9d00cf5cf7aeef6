"""Benchmark: how long after a message is discarded its row is in the undelivered table (`herald run`, delta-spark).

    .venv/bin/python tests/benchmarks/row_lag.py [--quiet 130] [--seconds 150] [--rate 20] [--poison-every 15]
                                                 [--ttl 10] [--urgent-commit-ms N] [--keep]

One topic (2 partitions) on the embedded broker; `herald run` in a subprocess on the users' stack
(`storage.engine: spark`, the default connector) with Herald's defaults for everything else (commitIntervalMs
60 s, urgentCommitMs 5 s, a 1 s trigger). Two subscriptions: `healthy` gets a steady flow (--rate messages a
second) that its endpoint answers 200; `poison` gets, after --quiet seconds of the healthy flow alone, one
message every --poison-every seconds for --seconds, alternately one its endpoint answers 400 (discarded at once,
in the micro-batch) and one it answers 500 (retried every 500 ms, parked after a second and re-driven by the
retry driver until its --ttl seconds discard it). A reader polls the undelivered and retries tables with delta-rs
every 0.5 s, as `herald undelivered` reads them: a discard's lag runs from its row's `timestamp` (when it was
discarded) to the poll that first saw the row; a first PARKED row's from its `recorded_at`. The offsets table's
Delta log gives how often routine rows were committed, in the quiet part and while discards came. Last line:

    row lag: discards p50 X s, max Y s (target 10 s); routine rows every Z s

(Z: the median time between two commits of positions in the quiet part.) Nothing is asserted; it is not
collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.support.herald_env import write_topics_conf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PostSink, percentile, stop_job  # noqa: E402 - sibling module

TOPIC = "bench.rowlag"
POISON = f"{TOPIC}.poison"


class Sink(PostSink):
    """Answers each POST with the status its body asks for (`answer`, 200 when none); counts the healthy ones."""

    def __init__(self) -> None:
        self.healthy = 0
        self._lock = threading.Lock()
        super().__init__(self._answer)

    def _answer(self, path: str, body: bytes) -> int:
        document = json.loads(body)
        if path == "/healthy":
            with self._lock:
                self.healthy += 1
        return document.get("answer", 200)


class Watcher:
    """Polls the poison subscription's undelivered and retries rows every `interval_s` (delta-rs): when each
    discard and each first PARKED row (by partition and offset) was first seen, and the time its row gives
    (epoch s)."""

    def __init__(self, storage_path: str, interval_s: float = 0.5) -> None:
        from herald.storage import DeltaRsStore

        self.store = DeltaRsStore(storage_path)
        self.interval_s = interval_s
        self.discards: dict[tuple[int, int], tuple[float, float, str]] = {}  # -> (discarded at, seen at, ended_by)
        self.parked: dict[tuple[int, int], tuple[float, float]] = {}  # -> (first PARKED row recorded at, seen at)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from herald.storage.tables import RETRIES, UNDELIVERED

        while not self._stop.wait(self.interval_s):
            try:
                undelivered = self.store.read(UNDELIVERED, POISON).to_pylist()
                retries = self.store.read(RETRIES, POISON).to_pylist()
            except Exception as error:  # noqa: BLE001 - a read racing a commit: the next poll sees it
                print(f"  (read failed: {type(error).__name__}: {error})", flush=True)
                continue
            now = time.time()
            for row in undelivered:
                key = (row["partition"], row["offset"])
                self.discards.setdefault(key, (row["timestamp"].timestamp(), now, row["ended_by"]))
            for row in retries:
                key = (row["partition"], row["offset"])
                if row["state"] == "PARKED" and key not in self.parked:
                    first = min(r["recorded_at"] for r in retries
                                if (r["partition"], r["offset"]) == key and r["state"] == "PARKED")
                    self.parked[key] = (first.timestamp(), now)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def commit_gaps(table_path: str, since: float, until: float) -> list[float]:
    """Seconds between consecutive commits of a Delta table whose commit time is within [since, until] (epoch s)."""
    from deltalake import DeltaTable

    times = sorted(entry["timestamp"] / 1000 for entry in DeltaTable(table_path).history()
                   if since <= entry["timestamp"] / 1000 <= until)
    return [later - earlier for earlier, later in zip(times, times[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quiet", type=float, default=130.0,
                        help="seconds of the healthy flow alone before the first poison message (default 130)")
    parser.add_argument("--seconds", type=float, default=150.0, help="seconds of poison messages (default 150)")
    parser.add_argument("--rate", type=float, default=20.0, help="healthy messages a second (default 20)")
    parser.add_argument("--poison-every", type=float, default=15.0, help="seconds between poison messages")
    parser.add_argument("--ttl", type=int, default=10, help="the poison subscription's messageTtl, s (default 10)")
    parser.add_argument("--urgent-commit-ms", type=int, default=None,
                        help="storage.urgentCommitMs (default: Herald's); 60000 shows the lag before it")
    parser.add_argument("--keep", action="store_true", help="keep the run's log and tables (the path is printed)")
    args = parser.parse_args()

    from confluent_kafka import Producer
    from serial_throughput import free_port  # noqa: E402 - sibling benchmark

    from herald.broker import EmbeddedBroker
    from herald.storage.tables import OFFSETS

    root = Path(tempfile.mkdtemp(prefix="herald-row-lag-bench-"))
    broker = EmbeddedBroker(root / "broker", port=free_port())
    sink = Sink()
    job = watcher = None
    try:
        broker.up()
        broker.create_topics({TOPIC: 2})
        layout = {
            "healthy": {"endpoint": f"{sink.url}/healthy", "startingOffsets": "latest",
                        "filters": [{"type": "jsonpath", "path": "$.to", "matcher": "healthy"}]},
            "poison": {"endpoint": f"{sink.url}/poison", "startingOffsets": "latest",
                       "filters": [{"type": "jsonpath", "path": "$.to", "matcher": "poison"}],
                       "subscriptionPolicy": {"messageTtl": args.ttl, "messageBackoff": 500}},
        }
        conf = write_topics_conf(root, broker.bootstrap_servers, {TOPIC: layout})
        storage = {"path": str(root / "storage"), "engine": "spark"}  # the rest as Herald's defaults
        if args.urgent_commit_ms is not None:
            storage["urgentCommitMs"] = args.urgent_commit_ms
        (conf / "herald.yaml").write_text(yaml.safe_dump({
            "kafka": {"bootstrapServers": broker.bootstrap_servers, "cluster": "bench"}, "storage": storage}))
        log = open(root / "run.log", "wb")
        job = subprocess.Popen([sys.executable, "-m", "herald", "run", "--conf", str(conf)], stdout=log,
                               stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0,
                             "log.connection.close": False})

        def publish(document: dict) -> None:
            producer.produce(TOPIC, json.dumps({**document, "sent_at": time.time(), "pad": "x" * 120}).encode())
            producer.poll(0)

        ready_by = time.monotonic() + 240
        while not sink.healthy and time.monotonic() < ready_by:  # the job is up once a message arrives
            publish({"to": "healthy"})
            producer.flush(5)
            time.sleep(1.0)
        if not sink.healthy:
            raise SystemExit("herald run delivered nothing within 240 s; see " + str(root / "run.log"))
        watcher = Watcher(str(root / "storage"))
        quiet_from = time.time()
        print(f"ready; {args.rate:g} healthy msg/s, {args.quiet:g} s alone, then a poison message every "
              f"{args.poison_every:g} s for {args.seconds:g} s (TTL {args.ttl} s)", flush=True)
        poison_from = quiet_from + args.quiet
        poison_until = poison_from + args.seconds
        poisons = 0
        began = time.monotonic()
        i = 0
        while time.time() < poison_until or (len(watcher.discards) < poisons and time.time() < poison_until + 90):
            # then until every poison message's row is seen (90 s at most: a minute's gathering and a write)
            delay = began + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            publish({"to": "healthy", "i": i})
            i += 1
            if poison_from + poisons * args.poison_every <= time.time() < poison_until:
                publish({"to": "poison", "answer": 400 if poisons % 2 == 0 else 500, "n": poisons})
                poisons += 1
        producer.flush(30)
        measured_until = time.time()
        watcher.stop()
        table = str(root / "storage" / "tables" / OFFSETS)
        quiet_gaps = commit_gaps(table, quiet_from, poison_from)
        poison_gaps = commit_gaps(table, poison_from, measured_until)
        discards = watcher.discards
        lags = [seen - at for at, seen, _ in discards.values()]
        by_kind = {kind: [seen - at for at, seen, ended in discards.values() if ended == kind]
                   for kind in sorted({ended for _, _, ended in discards.values()})}
        parked = [seen - at for at, seen in watcher.parked.values()]
        print(f"published {i} healthy, {sink.healthy} delivered; {poisons} poison, {len(discards)} discard rows seen "
              f"before the stop; load average {os.getloadavg()[0]:.1f}")
        for kind, values in by_kind.items():
            print(f"  discards ended by {kind}: {len(values)}, lag s " + ", ".join(f"{v:.1f}" for v in values))
        if parked:
            print(f"  first PARKED rows: {len(parked)}, lag s " + ", ".join(f"{v:.1f}" for v in parked))
        for name, gaps in (("quiet part", quiet_gaps), ("with discards", poison_gaps)):
            if gaps:
                print(f"  offsets commits, {name}: {len(gaps) + 1}, s apart: median {statistics.median(gaps):.1f}, "
                      f"min {min(gaps):.1f}, max {max(gaps):.1f}")
        if lags:
            routine = f"{statistics.median(quiet_gaps):.0f}" if quiet_gaps else "?"
            print(f"row lag: discards p50 {percentile(lags, 0.5):.1f} s, max {max(lags):.1f} s (target 10 s); "
                  f"routine rows every {routine} s")
        else:
            print("row lag: no discard row seen before the stop")
    finally:
        if watcher is not None:
            watcher.stop()
        if job is not None:
            stop_job(job, 90)
        sink.stop()
        broker.down()
        if args.keep:
            print(f"kept: {root} (run.log, conf and storage)")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
