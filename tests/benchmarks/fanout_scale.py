"""Benchmark: what a topic costs as its number of subscriptions grows (one read, decode, parse and filter
projection per topic, whatever the number of subscriptions).

    .venv/bin/python tests/benchmarks/fanout_scale.py [--messages N] [--counts 1,10,50] [--no-matching]

One topic of N JSON messages (~200 bytes, 4 partitions) on the embedded broker. For each S in --counts, a
`herald run --once` in its own subprocess (cold Python, cold JVM, fresh tables and checkpoints) with S
subscriptions whose filters match nothing (`$.user.country` against values that never occur), so the figure
is the shared read, parse and filter cost; then, for information, the same with filters that each match
about 0.1% of the messages (one user name in 997), delivered to an nginx sink. It prints the wall time and
the peak RSS of the whole process tree (Python driver, JVM, every Spark Python worker) for each run, and as
its last line:

    fanout: time ratio T, memory ratio M

where T and M compare S=50 with S=1 on the match-nothing runs (targets: T <= 1.5, M <= 1.2).
Nothing is asserted; it is not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serial_throughput import (  # noqa: E402 - the benchmarks share their sink, broker and /proc helpers
    PARTITIONS,
    REPO,
    TOPIC,
    produce_messages,
    start_sink,
)
from topics_scale import bench_broker, delivered_in, herald_once  # noqa: E402

sys.path.insert(0, str(REPO))
from tests.support.herald_env import write_topics_conf  # noqa: E402


def subscriptions(count: int, sink_url: str | None) -> dict[str, dict]:
    """`count` subscriptions: with no sink, filters that match nothing; with a sink, each matches about 0.1%
    (documents carry `user.name` = user<i % 997>: one name per subscription)."""
    result = {}
    for n in range(count):
        if sink_url is None:
            rule = {"type": "jsonpath", "path": "$.user.country", "matcher": f"XX{n}"}
        else:
            rule = {"type": "jsonpath", "path": "$.user.name", "matcher": f"user{n * 10}"}
        result[f"s{n}"] = {"endpoint": f"{sink_url or 'http://127.0.0.1:9'}/s{n}", "filters": [rule],
                           "subscriptionPolicy": {"inflightSize": 64, "rate": 100000}}
    return result


def run_once(root: Path, bootstrap: str, count: int, sink_url: str | None, label: str) -> dict:
    work = root / label
    conf = write_topics_conf(work, bootstrap, {TOPIC: subscriptions(count, sink_url)}, settings={
        "storage": {"engine": "deltalake"},  # as its figures in README.md were measured
        "streaming": {"triggerInterval": "1 second", "maxOffsetsPerTrigger": 100000},
        "rateControl": {"adjustIntervalMs": 30000, "slowRate": 1, "heartbeatIntervalMs": 60000},
    })
    result = herald_once(conf, work / "run.log", timeout_s=1200)
    text = result["text"]
    batches = [line for line in text.splitlines() if " batch " in line and " in " in line and "delivered" in line]
    in_batches = sum(float(line.rsplit(" in ", 1)[1].split()[0]) for line in batches)
    if result["code"] != 0:
        print(f"!! {label} exited {result['code']}; last lines:\n   " + "\n   ".join(text.splitlines()[-20:]))
    return {**result, "label": label, "count": count, "in_batches_s": in_batches, "delivered": delivered_in(text),
            "top": sorted(result["peak_processes"].items(), key=lambda item: -item[1])[:3]}


def show(result: dict) -> None:
    top = ", ".join(f"{name} {rss / 2**20:.0f}" for name, rss in result["top"])
    print(f"  {result['label']:<22}{result['count']:>5}{result['wall_s']:>9.1f}{result['in_batches_s']:>11.1f}"
          f"{result['cpu_s']:>9.1f}{result['peak_rss'] / 2**20:>10.0f}{result['processes']:>7}"
          f"{result['delivered']:>10}   ({top} MiB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="N messages (default 100000)")
    parser.add_argument("--counts", default="1,10,50", help="subscription counts S (default 1,10,50)")
    parser.add_argument("--no-matching", action="store_true", help="skip the runs whose filters match ~0.1%%")
    args = parser.parse_args()
    counts = [int(value) for value in args.counts.split(",")]

    sink = None
    with bench_broker("herald-fanout-bench-") as (root, broker):
        try:
            broker.create_topics({TOPIC: PARTITIONS})
            began = time.perf_counter()
            sizes = produce_messages(broker.bootstrap_servers, args.messages, spread=True)
            print(f"one topic, {args.messages} messages of ~200 B on {PARTITIONS} partitions {sizes} "
                  f"(produced in {time.perf_counter() - began:.1f} s); {os.cpu_count()} CPUs", flush=True)
            header = (f"  {'run':<22}{'S':>5}{'wall s':>9}{'batches s':>11}{'CPU s':>9}{'peak MiB':>10}{'procs':>7}"
                      f"{'delivered':>10}")
            print("\nfilters matching nothing (the shared cost):")
            print(header)
            nothing = {}
            for count in counts:
                nothing[count] = run_once(root, broker.bootstrap_servers, count, None, f"match-nothing S={count}")
                show(nothing[count])
            if not args.no_matching:
                sink = start_sink(root, log_ids=False)
                print(f"\nfilters matching ~0.1% each, delivered to {sink.kind} (for information):")
                print(header)
                for count in counts:
                    show(run_once(root, broker.bootstrap_servers, count, sink.url, f"match-0.1% S={count}"))
            print("\nwall s: the whole `herald run --once` subprocess (SparkSession and query start included); "
                  "batches s: the topic query's micro-batches as it logs them; CPU s: the process tree's; peak MiB: "
                  "the highest sampled sum of RSS of the process tree; procs: processes seen.")
            low, high = min(counts), max(counts)
            if low in nothing and high in nothing:
                time_ratio = nothing[high]["wall_s"] / nothing[low]["wall_s"]
                batch_ratio = nothing[high]["in_batches_s"] / max(nothing[low]["in_batches_s"], 1e-9)
                memory_ratio = nothing[high]["peak_rss"] / nothing[low]["peak_rss"]
                print(f"micro-batches alone, S={high} vs S={low}: {batch_ratio:.2f}x the time")
                print(f"fanout: time ratio {time_ratio:.2f}, memory ratio {memory_ratio:.2f}")
        finally:
            if sink is not None:
                sink.stop()


if __name__ == "__main__":
    main()
