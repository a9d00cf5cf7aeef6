"""Benchmark: per-batch read overhead of the herald_kafka source with and without its consumer cache.

    .venv/bin/python tests/benchmarks/kafka_consumer_cache.py

(tests/benchmarks is not in the suite's testpaths, so CI does not run it). Sizes come from the environment:
HERALD_BENCH_BATCHES (20), HERALD_BENCH_RECORDS (10), HERALD_BENCH_RUNS (3). It prints figures and ratios and
asserts only that both ways read the same records, never a timing. Takes about two minutes on 2 cores.

Two measurements against the embedded broker (noida-db, loopback), consumerCacheCapacity=0 (a consumer created
and closed per task, as before the cache) against the default (4):

1. **Spark micro-batches**: a Trigger.AvailableNow query over one partition holding batches x records records,
   maxOffsetsPerTrigger=records, so it runs `batches` consecutive one-task micro-batches; its foreachBatch counts
   the rows (the read happens there). Per run: wall time of the query, and the mean `triggerExecution` and
   `addBatch` of its micro-batches (Spark's progress, ms). Runs alternate (off, on, off, on, ...) after one
   warm-up run of each, in one SparkSession, each mode with its own group id prefix so neither sees the other's
   idle consumers.
2. **One Python process**: `read_offset_range` of the same consecutive ranges, in a loop, no Spark: what one
   task's read costs, in ms.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import pytest

from herald.source import PYTHON_SOURCE_NAME, register_python_source
from herald.source.consumers import CONSUMERS
from herald.source.fetch import read_offset_range

BATCHES = int(os.environ.get("HERALD_BENCH_BATCHES", "20"))
RECORDS = int(os.environ.get("HERALD_BENCH_RECORDS", "10"))
RUNS = int(os.environ.get("HERALD_BENCH_RUNS", "3"))
MODES = {"no cache": "0", "cache": "4"}


def produce(bootstrap: str, topic: str, count: int) -> None:
    """`count` records v0, v1, ... to partition 0, with current timestamps (noida-db applies time retention)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(15) == 0, "the producer did not deliver every record"


def run_query(spark, bootstrap: str, topic: str, capacity: str, prefix: str, checkpoint: Path) -> dict:
    """One AvailableNow query of `BATCHES` micro-batches of `RECORDS` records; its figures (s and ms)."""
    counts: list[int] = []
    frame = (spark.readStream.format(PYTHON_SOURCE_NAME).option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(RECORDS)).option("consumerCacheCapacity", capacity)
             .option("groupIdPrefix", prefix).load())
    started = time.perf_counter()
    query = (frame.writeStream.foreachBatch(lambda batch, _id: counts.append(batch.count()))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(300), "the benchmark query did not finish within 300 s"
    wall_s = time.perf_counter() - started
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert counts.count(RECORDS) == BATCHES and sum(counts) == BATCHES * RECORDS, counts
    return {
        "wall_s": wall_s,
        "trigger_ms": statistics.mean(p["durationMs"]["triggerExecution"] for p in progress),
        "add_batch_ms": statistics.mean(p["durationMs"]["addBatch"] for p in progress),
    }


def in_process_reads_ms(bootstrap: str, topic: str, capacity: int) -> tuple[float, list]:
    """Mean ms of one `read_offset_range` of RECORDS records, over BATCHES consecutive ranges; and the offsets read."""
    prefix = f"bench-{uuid.uuid4().hex}"
    read: list = []
    started = time.perf_counter()
    for start in range(0, BATCHES * RECORDS, RECORDS):
        for batch in read_offset_range({"bootstrap.servers": bootstrap}, topic, 0, start, start + RECORDS,
                                       group_id_prefix=prefix, cache_capacity=capacity):
            read.extend(batch.column("offset").to_pylist())
    return (time.perf_counter() - started) * 1000 / BATCHES, read


def test_consumer_cache_per_batch_overhead(spark, broker, topic_name, tmp_path):
    register_python_source(spark)
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, BATCHES * RECORDS)
    prefixes = {mode: f"bench-{mode.replace(' ', '-')}-{uuid.uuid4().hex[:8]}" for mode in MODES}

    def run(mode: str, index: int) -> dict:
        checkpoint = tmp_path / f"cp-{mode.replace(' ', '-')}-{index}"
        return run_query(spark, broker.bootstrap_servers, topic_name, MODES[mode], prefixes[mode], checkpoint)

    for mode in MODES:  # warm-up: JVM, Python workers and their imports; not counted
        run(mode, -1)
    figures: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for index in range(RUNS):
        for mode in MODES:
            figures[mode].append(run(mode, index))

    print(f"\n{BATCHES} micro-batches of {RECORDS} records, one partition, {RUNS} runs per mode (alternating):")
    print(f"{'':10} {'wall s':>8} {'triggerExecution ms':>20} {'addBatch ms':>12}   (mean per micro-batch)")
    means = {}
    for mode, runs in figures.items():
        for one in runs:
            print(f"{mode:10} {one['wall_s']:8.2f} {one['trigger_ms']:20.1f} {one['add_batch_ms']:12.1f}")
        means[mode] = {key: statistics.mean(one[key] for one in runs) for key in runs[0]}
    for key, label in (("wall_s", "wall"), ("trigger_ms", "triggerExecution"), ("add_batch_ms", "addBatch")):
        print(f"{label}: no cache / cache = {means['no cache'][key] / means['cache'][key]:.2f}x")

    uncached_ms, uncached = in_process_reads_ms(broker.bootstrap_servers, topic_name, capacity=0)
    cached_ms, cached = in_process_reads_ms(broker.bootstrap_servers, topic_name, capacity=4)
    assert cached == uncached == list(range(BATCHES * RECORDS))
    print(f"one read of {RECORDS} records in one process: {uncached_ms:.2f} ms without the cache, {cached_ms:.2f} ms "
          f"with it ({uncached_ms / cached_ms:.1f}x)")
    CONSUMERS.clear()


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-s", "-p", "no:cacheprovider", __file__]))
