"""Benchmark: what a topic costs. T topics with one subscription each against one topic with T subscriptions,
the same messages in total, each in one `herald run --once`.

    .venv/bin/python tests/benchmarks/topics_scale.py [--topics 40] [--messages 4000] [--connector spark]

On the embedded broker: the wide run has T topics of N/T JSON messages each (2 partitions) and one subscription
per topic; the narrow run has one topic of the same N messages (2 partitions) and T subscriptions. Message i
carries `sub: i % T` (in the wide run, topic t holds the messages with `sub: t`), and subscription t filters on
`$.sub == t`, so both runs evaluate one filter per subscription and deliver each message once, to one HTTP sink
(nginx when installed, else a Python server): the difference is the cost of T topics against one.
Each run is a `herald run --once` in its own subprocess (cold Python, cold JVM, fresh tables and
checkpoints). It prints the wall time, CPU and peak RSS of the whole process tree (Python driver, JVM, Spark's
Python workers, source processes) and, as its last line:

    topics: time ratio T, memory ratio M

the wide run against the narrow one (issue 15's targets: T <= 1.5, M <= 1.2). A run that fails is printed with
its last log lines (the ratio is then not printed). Nothing is asserted; it is not collected by pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serial_throughput import REPO, TreeMemory, free_port, start_sink  # noqa: E402 - shared sink and /proc helpers

sys.path.insert(0, str(REPO))
from tests.support.herald_env import write_topics_conf  # noqa: E402

PARTITIONS = 2


def produce(bootstrap: str, messages: int, topics: int, wide: list[str]) -> None:
    """Message i (`sub: i % topics`) to `bench.narrow`, and to its wide topic `wide[i % topics]`."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(messages):
        value = json.dumps({"i": i, "sub": str(i % topics), "pad": "x" * 150}).encode()
        producer.produce("bench.narrow", value=value, partition=i % PARTITIONS)
        producer.produce(wide[i % topics], value=value, partition=(i // topics) % PARTITIONS)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(60)


def subscription(sink_url: str, n: int) -> dict:
    return {"endpoint": f"{sink_url}/s{n}", "filters": [{"type": "jsonpath", "path": "$.sub", "matcher": str(n)}],
            "subscriptionPolicy": {"inflightSize": 64, "rate": 100000}}


def herald_once(conf: Path, log_path: Path, timeout_s: float = 1800) -> dict:
    """`herald run --once` on `conf` in a subprocess, its output in `log_path`, its process tree sampled:
    wall_s, cpu_s, peak_rss, peak_pss (bytes), peak_processes (command -> RSS at the peak), processes, code, text."""
    began = time.perf_counter()
    with open(log_path, "wb") as log:
        child = subprocess.Popen([sys.executable, "-m", "herald", "run", "--conf", str(conf), "--once"],
                                 stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        memory = TreeMemory(child.pid)
        try:
            code = child.wait(timeout=timeout_s)
        finally:
            memory.stop()
    return {"wall_s": time.perf_counter() - began, "cpu_s": memory.cpu_s, "peak_rss": memory.peak_rss,
            "peak_pss": memory.peak_pss, "peak_processes": memory.peak_processes, "peak_counts": memory.peak_counts,
            "processes": memory.process_count, "code": code, "text": log_path.read_text(errors="replace")}


def delivered_in(text: str) -> int:
    """The messages a run's micro-batches say they delivered."""
    return sum(int(line.split("delivered ")[1].split(",")[0]) for line in text.splitlines()
               if " batch " in line and "delivered" in line and " in " in line)


def run_once(root: Path, bootstrap: str, topics: dict[str, dict[str, dict]], connector: str, label: str,
             storage: dict | None = None) -> dict:
    """One `herald run --once` over `topics` (topic -> subscription name -> YAML fields) in a subprocess, its
    process tree sampled; `storage` overrides the suite's storage settings (delta-rs, rounds written at once)."""
    work = root / label
    conf = write_topics_conf(work, bootstrap, topics, settings={
        "kafka": {"connector": connector},
        "streaming": {"triggerInterval": "1 second", "maxOffsetsPerTrigger": 100000},
        "rateControl": {"adjustIntervalMs": 30000, "slowRate": 1, "heartbeatIntervalMs": 60000},
        "storage": {"engine": "deltalake", **(storage or {})},  # as its figures in README.md were measured
    })
    result = herald_once(conf, work / "run.log")
    if result["code"] != 0:
        print(f"!! {label} exited {result['code']}; last lines:\n   "
              + "\n   ".join(result["text"].splitlines()[-25:]), flush=True)
    return {**result, "label": label, "delivered": delivered_in(result["text"])}


@contextlib.contextmanager
def bench_broker(prefix: str, keep: bool = False):
    """(a temp dir, noida-db started in it on a free port); at the end the broker is stopped and the dir removed
    (kept and printed with `keep`)."""
    from herald.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)
    broker = EmbeddedBroker(root / "broker", port=free_port())
    try:
        broker.up()
        yield root, broker
    finally:
        broker.down()
        if keep:
            print(f"kept: {root} (each run's run.log, conf and storage)")
        else:
            shutil.rmtree(root, ignore_errors=True)


def show(result: dict) -> None:
    print(f"  {result['label']:<28}{result['wall_s']:>9.1f}{result['cpu_s']:>9.1f}"
          f"{result['peak_rss'] / 2**20:>10.0f}{result['processes']:>7}{result['delivered']:>11}"
          f"{result['code']:>6}", flush=True)
    by_command = sorted(result["peak_processes"].items(), key=lambda item: -item[1])
    print("    at the peak: " + ", ".join(f"{name} x{result['peak_counts'].get(name, 0)} {rss / 2**20:.0f} MiB"
                                       for name, rss in by_command), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=40, help="T (default 40)")
    parser.add_argument("--messages", type=int, default=4000, help="N messages in total (default 4000)")
    parser.add_argument("--connector", default="spark", choices=("spark", "python"),
                        help="kafka.connector (default spark: Spark's Kafka source)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' logs and tables (the path is printed)")
    args = parser.parse_args()

    with bench_broker("herald-topics-bench-", keep=args.keep) as (root, broker):
        wide = [f"bench.wide{t}" for t in range(args.topics)]
        broker.create_topics({**{topic: PARTITIONS for topic in wide}, "bench.narrow": PARTITIONS})
        produce(broker.bootstrap_servers, args.messages, args.topics, wide)
        sink = start_sink(root, log_ids=False)
        try:
            print(f"{args.topics} topics x 1 subscription vs 1 topic x {args.topics} subscriptions, "
                  f"{args.messages} messages in total, connector {args.connector}, "
                  f"sink {sink.kind}; {os.cpu_count()} CPUs", flush=True)
            print(f"  {'run':<28}{'wall s':>9}{'CPU s':>9}{'peak MiB':>10}{'procs':>7}{'delivered':>11}{'exit':>6}")
            narrow = run_once(root, broker.bootstrap_servers,
                              {"bench.narrow": {f"s{n}": subscription(sink.url, n) for n in range(args.topics)}},
                              args.connector, f"1 topic x {args.topics} subs")
            show(narrow)
            many = run_once(root, broker.bootstrap_servers,
                            {topic: {"s": subscription(sink.url, n)} for n, topic in enumerate(wide)},
                            args.connector, f"{args.topics} topics x 1 sub")
            show(many)
        finally:
            sink.stop()
        print("wall s: the whole `herald run --once` subprocess (SparkSession and query starts included); CPU s and "
              "peak MiB: the process tree's (sum of RSS, sampled); delivered: as the micro-batches log it.")
        if narrow["code"] == 0 and many["code"] == 0:
            print(f"topics: time ratio {many['wall_s'] / narrow['wall_s']:.2f}, "
                  f"memory ratio {many['peak_rss'] / narrow['peak_rss']:.2f}")

if __name__ == "__main__":
    main()
