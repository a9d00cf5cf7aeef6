"""Benchmark: publish-to-arrival latency under `herald run` (default trigger), one subscription among 20.

    .venv/bin/python tests/benchmarks/latency.py [--rate 100] [--seconds 60] [--subscriptions 20]
                                                 [--trigger '1 second'] [--subscription-rate R]

One topic (2 partitions) on the embedded broker; `herald run` in a subprocess with the default trigger
(1 second) and 20 subscriptions on the topic, of which only `s0` passes the published messages (the others'
filters drop them, so the shared projection evaluates all 20). A Python HTTP sink on 127.0.0.1 records when
each message arrives. After the job is ready (a warm-up message delivered), messages are published at
--rate per second for --seconds, each carrying its publish time (time.time(), same machine as the sink).
It prints count, lost, p50/p90/p99/max, and as its last line:

    latency: p50 X ms, p99 Y ms

Target: p99 <= 1500 ms. Nothing is asserted; it is not collected by pytest.
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.support.herald_env import write_topics_conf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PostSink, percentile, stop_job  # noqa: E402 - sibling module

TOPIC = "bench.latency"


class Sink(PostSink):
    """Records (message i, publish time, arrival time) of every POST to /s0."""

    def __init__(self) -> None:
        self.arrivals: dict[int, tuple[float, float]] = {}
        self.others = 0
        self._lock = threading.Lock()
        super().__init__(self._answer)

    def _answer(self, path: str, body: bytes) -> int:
        arrived = time.time()
        document = json.loads(body)
        with self._lock:
            if path == "/s0":
                self.arrivals.setdefault(document["i"], (document["sent_at"], arrived))
            else:
                self.others += 1
        return 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second (default 100)")
    parser.add_argument("--seconds", type=float, default=60.0, help="publishing time (default 60)")
    parser.add_argument("--subscriptions", type=int, default=20, help="subscriptions on the topic (default 20)")
    parser.add_argument("--trigger", default="1 second",
                        help="streaming.triggerInterval (default '1 second', Herald's default)")
    parser.add_argument("--subscription-rate", type=float, default=None,
                        help="each subscription's subscriptionPolicy.rate (default: Herald's, 400 a second)")
    parser.add_argument("--keep", action="store_true", help="keep the run's log and tables (the path is printed)")
    args = parser.parse_args()

    from confluent_kafka import Producer
    from serial_throughput import free_port  # noqa: E402 - sibling benchmark

    from herald.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix="herald-latency-bench-"))
    broker = EmbeddedBroker(root / "broker", port=free_port())
    sink = Sink()
    job = None
    try:
        broker.up()
        broker.create_topics({TOPIC: 2})
        layout = {f"s{n}": {"endpoint": f"{sink.url}/s{n}", "startingOffsets": "latest",
                            "filters": [{"type": "jsonpath", "path": "$.to", "matcher": f"s{n}"}],
                            **({"subscriptionPolicy": {"rate": args.subscription_rate}}
                               if args.subscription_rate else {})}
                  for n in range(args.subscriptions)}
        conf = write_topics_conf(root, broker.bootstrap_servers, {TOPIC: layout}, settings={
            "storage": {"engine": "deltalake"},  # as its figures in README.md were measured
            "streaming": {"triggerInterval": args.trigger, "maxOffsetsPerTrigger": 10000, "configPollMs": 2000},
            "rateControl": {"adjustIntervalMs": 30000, "slowRate": 1, "heartbeatIntervalMs": 60000},
        })
        log = open(root / "run.log", "wb")
        job = subprocess.Popen([sys.executable, "-m", "herald", "run", "--conf", str(conf)], stdout=log,
                               stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0,
                             "log.connection.close": False})

        def publish(i: int) -> None:
            producer.produce(TOPIC, json.dumps({"i": i, "to": "s0", "sent_at": time.time(),
                                                "pad": "x" * 120}).encode())
            producer.poll(0)

        warmup = -1
        ready_by = time.monotonic() + 180
        while not sink.arrivals and time.monotonic() < ready_by:  # the job is up once a message arrives
            publish(warmup)
            producer.flush(5)
            warmup -= 1
            time.sleep(1.0)
        if not sink.arrivals:
            raise SystemExit("herald run delivered nothing within 180 s; see " + str(root / "run.log"))
        time.sleep(3.0)
        print(f"ready; publishing {args.rate:g} msg/s for {args.seconds:g} s to one of {args.subscriptions} "
              f"subscriptions", flush=True)
        count = int(args.rate * args.seconds)
        began = time.monotonic()
        for i in range(count):
            delay = began + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            publish(i)
        producer.flush(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(1 for i in range(count) if i in sink.arrivals) < count:
            time.sleep(0.2)
        latencies = [(sink.arrivals[i][1] - sink.arrivals[i][0]) * 1000 for i in range(count) if i in sink.arrivals]
        lost = count - len(latencies)
        print(f"published {count}, arrived {len(latencies)}, lost {lost}; to other subscriptions: {sink.others}")
        if latencies:
            print(f"ms: mean {statistics.mean(latencies):.0f}, p50 {percentile(latencies, 0.5):.0f}, "
                  f"p90 {percentile(latencies, 0.9):.0f}, p99 {percentile(latencies, 0.99):.0f}, "
                  f"max {max(latencies):.0f}; load average {os.getloadavg()[0]:.1f}")
            print(f"latency: p50 {percentile(latencies, 0.5):.0f} ms, p99 {percentile(latencies, 0.99):.0f} ms")
    finally:
        if job is not None:
            stop_job(job, 60)
        sink.stop()
        broker.down()
        if args.keep:
            print(f"kept: {root} (run.log, conf and storage)")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
