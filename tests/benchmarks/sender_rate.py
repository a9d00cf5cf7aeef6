"""Benchmark: the in-task sending rate, Herald's delivery loop alone (no Spark, no Kafka) against nginx.

    .venv/bin/python tests/benchmarks/sender_rate.py [--messages N] [--inflight K]

One process POSTs N bodies of ~200 bytes to an nginx sink on 127.0.0.1 (keep-alive; the sink of
serial_throughput.py), side by side in this script:

- baseline: one `requests.Session` in one thread, one request after the other (what a simple consumer does);
- Herald's `TaskSender` (one lane, inflightSize K, rate unlimited) on the `requests` transport (a bounded
  thread pool), then on the `curl` transport (pycurl's multi interface, no threads).

For each it prints wall time, messages/s, and messages per CPU-second of this process (its threads
included; nginx's CPU is not counted), and the ratio of each Herald run's per-CPU figure to the baseline's.
Herald's target: >= 10,000 messages per CPU-second (per core) with curl. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serial_throughput import start_sink  # noqa: E402 - the benchmarks share their nginx sink

from herald.delivery.input import InputBatch  # noqa: E402
from herald.delivery.message import Record, message_id  # noqa: E402
from herald.delivery.plan import TaskPlan  # noqa: E402
from herald.delivery.sender import TaskSender  # noqa: E402
from tests.support.delivery import lane_plan, retry_policy

BODY = json.dumps({"type": "order.created", "note": "x" * 170}).encode()


def records(n: int) -> list[InputBatch]:
    now_ms = int(time.time() * 1000)
    rows = [Record(partition=0, offset=o, timestamp_ms=now_ms, message_id=message_id("bench", 0, o, None), body=BODY)
            for o in range(n)]
    return [InputBatch([(r, (0,)) for r in rows[i:i + 5000]], {0: np.arange(i, min(i + 5000, n), dtype=np.int64)},
                       0) for i in range(0, n, 5000)]


def measure(label: str, run) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    delivered = run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"label": label, "delivered": delivered, "wall_s": wall, "cpu_s": cpu}


def requests_baseline(url: str, n: int) -> int:
    import requests

    session = requests.Session()
    delivered = 0
    for o in range(n):
        answer = session.post(url, data=BODY, timeout=10, headers={
            "Content-Type": "application/json", "Hermes-Message-Id": message_id("bench", 0, o, None),
            "Hermes-Retry-Count": "0"})
        delivered += 200 <= answer.status_code < 300
    session.close()
    return delivered


def herald(url: str, n: int, inflight: int, transport: str) -> int:
    lane = lane_plan(url, subscription_id="bench.s", retry=retry_policy(message_ttl_s=60, backoff_s=0.1),
                     inflight=inflight, rate_per_s=1e6)
    plan = TaskPlan(topic="bench", lanes={0: lane}, budget_s=600,
                    transport=transport, max_open=inflight)
    batches = records(n)
    return TaskSender(plan).run(batches).lanes[0].counters.delivered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="N messages per Herald run (default 50000)")
    parser.add_argument("--inflight", type=int, default=64, help="K, Herald's inflightSize (default 64)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="herald-sender-bench-"))
    sink = start_sink(root, log_ids=False)
    try:
        url = sink.url
        herald(url, 2000, args.inflight, "curl")  # warm up: imports, connections
        baseline_n = max(1000, args.messages // 5)
        runs = [measure("requests.Session, 1 thread", lambda: requests_baseline(url, baseline_n)),
                measure("Herald, requests transport", lambda: herald(url, args.messages, args.inflight, "requests")),
                measure("Herald, curl transport", lambda: herald(url, args.messages, args.inflight, "curl")),
                measure("requests.Session, 1 thread", lambda: requests_baseline(url, baseline_n))]
        print(f"sink: {sink.kind} at {url}; bodies of {len(BODY)} B; Herald inflight {args.inflight}")
        print(f"  {'run':<30}{'delivered':>10}{'wall s':>8}{'msg/s':>9}{'msg per CPU-s':>15}")
        for run in runs:
            print(f"  {run['label']:<30}{run['delivered']:>10}{run['wall_s']:>8.2f}"
                  f"{run['delivered'] / run['wall_s']:>9,.0f}{run['delivered'] / run['cpu_s']:>15,.0f}")
        base = sum(r["delivered"] for r in (runs[0], runs[3])) / sum(r["cpu_s"] for r in (runs[0], runs[3]))
        for run in runs[1:3]:
            per_cpu = run["delivered"] / run["cpu_s"]
            print(f"{run['label']}: {per_cpu:,.0f} messages per CPU-second, {per_cpu / base:.1f}x the "
                  f"requests.Session baseline's")
    finally:
        sink.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
