"""What the tests' real Kafka broker (tests/support/kafka_broker.py) costs: seconds from launching its JVM to the
first metadata answer (first start, which formats the storage first, and a restart on the same data), the restart's
whole time (stop included), and its resident memory (MiB) when idle and after some topics and records.

    .venv/bin/python tests/benchmarks/kafka_broker_start.py [--runs 3] [--plaintext-only]

By default the broker has the SASL_SSL listener the `kafka_broker` fixture gives it; --plaintext-only leaves it out.

Not part of the suite (tests/benchmarks is outside testpaths). Numbers go to tests/benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.kafka_broker import KafkaBroker  # noqa: E402


def one_run(root: Path, sasl_ssl: bool) -> dict[str, float]:
    broker = KafkaBroker(root, sasl_ssl=sasl_ssl)
    began = time.monotonic()
    broker.start()
    figures = {"first start (format + start) s": time.monotonic() - began, "start to answer s": broker.started_in_s}
    time.sleep(2)
    figures["idle RSS MiB"] = broker.rss_bytes() / 2**20
    broker.create_topics({f"bench.t{n}": 3 for n in range(5)})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "log_level": 0})
    for n in range(20_000):
        producer.produce(f"bench.t{n % 5}", value=b"x" * 200)
        if n % 1000 == 0:
            producer.poll(0)
    producer.flush(30)
    del producer
    figures["RSS after 5 topics, 20k records MiB"] = broker.rss_bytes() / 2**20
    began = time.monotonic()
    broker.restart()
    figures["restart (stop + start) s"] = time.monotonic() - began
    figures["restart: start to answer s"] = broker.started_in_s
    broker.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plaintext-only", action="store_true", help="without the SASL_SSL listener")
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as root:
            runs.append(one_run(Path(root), sasl_ssl=not args.plaintext_only))
    for key in runs[0]:
        values = [run[key] for run in runs]
        print(f"{key:40s} median {statistics.median(values):7.1f}  (runs: {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
