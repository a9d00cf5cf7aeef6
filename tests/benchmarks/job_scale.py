"""Benchmark: the memory of one job of many subscriptions over a few topics, as users run it.

    .venv/bin/python tests/benchmarks/job_scale.py [--topics 8] [--subscriptions 60] [--messages 32000]
                                                   [--connector spark] [--engine auto]

On the embedded broker: `--topics` JSON topics (2 partitions each) and `--subscriptions` subscriptions spread over
them (60 over 8: four topics with 8, four with 7). Message i of a topic carries `sub: i % k` (k the topic's
subscription count) and its subscription j filters on `$.sub == j`, so each message is delivered once, to one HTTP
sink (nginx when installed, else a Python server). One `herald run --once` in its own subprocess, with the storage
users get (`engine: auto`, so delta-spark where the jars load, and the default commit interval). It samples the
whole process tree (Python driver, JVM, Spark's Python workers, source processes) and prints, as its last line:

    scale: peak PSS X GiB (N processes)

issue 15 §5's target: at most 1.5 GiB for 60 subscriptions over 8 topics. PSS divides the pages that processes
share (forked Python workers share their daemon's) among them: what the tree really occupies. Nothing is
asserted; it is not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serial_throughput import start_sink  # noqa: E402 - the shared sink
from topics_scale import PARTITIONS, bench_broker, run_once, subscription  # noqa: E402


def spread(subscriptions: int, topics: int) -> list[int]:
    """How many subscriptions each topic gets: as even as can be, the first topics one more."""
    return [subscriptions // topics + (1 if t < subscriptions % topics else 0) for t in range(topics)]


def produce(bootstrap: str, counts: dict[str, int], per_topic: int) -> None:
    """`per_topic` messages to each topic; message i carries `sub: i % (the topic's subscription count)`."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for topic, count in counts.items():
        for i in range(per_topic):
            value = json.dumps({"i": i, "sub": str(i % count), "pad": "x" * 150}).encode()
            producer.produce(topic, value=value, partition=i % PARTITIONS)
            if i % 10000 == 0:
                producer.poll(0)
    producer.flush(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=8, help="topics (default 8)")
    parser.add_argument("--subscriptions", type=int, default=60, help="subscriptions over them (default 60)")
    parser.add_argument("--messages", type=int, default=32000, help="messages in total (default 32000)")
    parser.add_argument("--connector", default="spark", choices=("spark", "python"),
                        help="kafka.connector (default spark: Spark's Kafka source)")
    parser.add_argument("--engine", default="auto", choices=("auto", "spark", "deltalake"),
                        help="storage.engine (default auto: delta-spark where its jar loads)")
    args = parser.parse_args()

    with bench_broker("herald-scale-bench-") as (root, broker):
        counts = {f"bench.scale{t}": count for t, count in enumerate(spread(args.subscriptions, args.topics))}
        broker.create_topics({topic: PARTITIONS for topic in counts})
        per_topic = args.messages // args.topics
        produce(broker.bootstrap_servers, counts, per_topic)
        sink = start_sink(root, log_ids=False)
        try:
            print(f"{args.subscriptions} subscriptions over {args.topics} topics, {per_topic * args.topics} messages,"
                  f" connector {args.connector}, engine {args.engine}, sink {sink.kind}; {os.cpu_count()} CPUs",
                  flush=True)
            topics = {topic: {f"s{j}": subscription(sink.url, j) for j in range(count)}
                      for topic, count in counts.items()}
            result = run_once(root, broker.bootstrap_servers, topics, args.connector, "scale",
                              storage={"engine": args.engine, "commitIntervalMs": 60_000})
        finally:
            sink.stop()
    print(f"  wall {result['wall_s']:.1f} s, CPU {result['cpu_s']:.1f} s, peak RSS {result['peak_rss'] / 2**20:.0f} "
          f"MiB, peak PSS {result['peak_pss'] / 2**20:.0f} MiB, {result['delivered']} delivered, exit {result['code']}")
    at_peak = ", ".join(f"{name} {rss / 2**20:.0f}" for name, rss in
                        sorted(result["peak_processes"].items(), key=lambda item: -item[1]))
    print(f"  RSS at the peak by command, MiB: {at_peak}")
    if result["code"] == 0:
        print(f"scale: peak PSS {result['peak_pss'] / 2**30:.2f} GiB ({result['processes']} processes)")

if __name__ == "__main__":
    main()
