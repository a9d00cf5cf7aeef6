"""Benchmark: what Spark charges for the topics of one micro-batch, by the shape of their delivery jobs.

    .venv/bin/python tests/benchmarks/topic_rounds.py [--topics 40] [--partitions 2] [--messages 4000] [--rounds 3]

Issue 15 §6 (`topics_scale.py`): a job with T topics of one subscription each costs ~2x one topic with T
subscriptions. This isolates the part Spark charges per topic, without Kafka, HTTP or tables: the rows of one
micro-batch of T topics (P Kafka partitions each, N JSON messages in all) are cached in one local[2] session,
one cached partition per Kafka partition as Spark's Kafka source gives them. Each shape below projects them the
way `herald.engine.round.projection` does (the JSON parsed once for the filters, `with_targets`, the message ids
in the JVM) and hands them to a Python `mapInArrow` task that only counts its rows (so no sender runs):

- `per topic`: what the engine does now (`herald.engine.triggers.shared_read`): each topic's rows filtered from the
  cached batch, coalesced to its partitions, projected for its own subscription, collected in a Spark job of its
  own, 8 topics at a time (`shared_read.MAX_TOPIC_ROUNDS` threads).
- `union`: the same T projections, their `mapInArrow`s unioned into one Spark job (one collect).
- `one projection, 2 tasks`: one projection over the whole batch with every topic's subscription (T filters per
  row: more work than a topic condition would leave), coalesced to one task per core, one `mapInArrow`.
- `one projection, T*P tasks`: the same without coalescing: one Python task per Kafka partition.

Each shape runs `--rounds` times, interleaved; the best time of each is printed with its ratio to `per topic`,
and as the last line `topic rounds: union U, one projection O (per topic = 1)` (one projection: the 2-task shape).
Every shape must count the N rows (checked). Nothing is asserted; it is not collected by pytest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import pyarrow as pa  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from herald.engine.round.projection import position_message_id  # noqa: E402
from herald.filters.rules import FilterRule  # noqa: E402
from herald.filters.targets import with_targets  # noqa: E402
from herald.session import get_or_create_session  # noqa: E402

THREADS = 8  # herald.engine.triggers.shared_read.MAX_TOPIC_ROUNDS
SCHEMA = "topic string, partition int, offset long, value binary"


def count_rows(batches):
    """The delivery task's stand-in: reads its input to the end and reports how many rows it had."""
    rows = 0
    for batch in batches:
        rows += batch.num_rows
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def cached_batch(spark, topics: int, partitions: int, messages: int):
    """The micro-batch as the Kafka source gives it: one partition per Kafka partition, held in Spark's cache."""
    slices = topics * partitions
    per_slice = messages // slices
    rows = [(f"t{t}", p, o, json.dumps({"i": o, "sub": str(t), "pad": "x" * 150}).encode())
            for t in range(topics) for p in range(partitions) for o in range(per_slice)]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), SCHEMA)
    frame = (frame.withColumn("key", F.lit(None).cast("binary"))
             .withColumn("headers", F.lit(None).cast("array<struct<key:string,value:binary>>"))
             .withColumn("timestamp", F.current_timestamp()).persist())
    return frame, per_slice * slices


def projected(rows, rule_sets, kafka_topic: str):
    """`herald.engine.round.projection.project` for a JSON topic."""
    rows = with_targets(rows, rule_sets, "value", "headers")
    goes = F.size("targets") > 0
    return position_message_id(kafka_topic, rows.select(
        "partition", "offset", "timestamp", "headers", "targets",
        F.when(goes, F.col("key")).alias("key"), F.when(goes, F.col("value")).alias("value")))


def rule(topic: int) -> list[FilterRule]:
    return [FilterRule("jsonpath", str(topic), path="$.sub")]


def topic_frame(batch, topic: int, partitions: int):
    rows = batch.where(F.col("topic") == f"t{topic}").coalesce(partitions)
    return projected(rows, [rule(topic)], f"t{topic}").mapInArrow(count_rows, "rows long")


def counted(frame) -> int:
    return sum(frame.toArrow().column("rows").to_pylist())


def per_topic(batch, topics: int, partitions: int) -> int:
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        return sum(pool.map(lambda t: counted(topic_frame(batch, t, partitions)), range(topics)))


def union(batch, topics: int, partitions: int) -> int:
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        frames = list(pool.map(lambda t: topic_frame(batch, t, partitions), range(topics)))
    tagged = [frame.withColumn("round", F.lit(index)) for index, frame in enumerate(frames)]
    return counted(functools.reduce(lambda left, right: left.union(right), tagged))


def one_projection(batch, topics: int, tasks: int | None) -> int:
    rows = batch.coalesce(tasks) if tasks else batch
    return counted(projected(rows, [rule(t) for t in range(topics)], "all").mapInArrow(count_rows, "rows long"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=40, help="T (default 40)")
    parser.add_argument("--partitions", type=int, default=2, help="P Kafka partitions a topic (default 2)")
    parser.add_argument("--messages", type=int, default=4000, help="N messages in the batch (default 4000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each shape, interleaved (default 3)")
    args = parser.parse_args()
    spark = get_or_create_session("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    batch, rows = cached_batch(spark, args.topics, args.partitions, args.messages)
    batch.count()
    shapes = {
        "per topic": lambda: per_topic(batch, args.topics, args.partitions),
        "union": lambda: union(batch, args.topics, args.partitions),
        "one projection, 2 tasks": lambda: one_projection(batch, args.topics, 2),
        f"one projection, {args.topics * args.partitions} tasks": lambda: one_projection(batch, args.topics, None),
    }
    counted_once(shapes, rows)  # warms the Python workers and checks every shape reads the whole batch
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, shape in shapes.items():
            started = time.monotonic()
            shape()
            best[name] = min(best.get(name, float("inf")), time.monotonic() - started)
    print(f"{args.topics} topics x {args.partitions} partitions, {rows} messages, one subscription a topic; "
          f"best of {args.rounds}, 2 cores")
    baseline = best["per topic"]
    for name, seconds in best.items():
        print(f"  {name:32s} {seconds:6.2f} s   {seconds / baseline:5.2f}x per topic")
    print(f"topic rounds: union {best['union'] / baseline:.2f}, one projection "
          f"{best['one projection, 2 tasks'] / baseline:.2f} (per topic = 1)")


def counted_once(shapes, rows: int) -> None:
    for name, shape in shapes.items():
        got = shape()
        if got != rows:
            raise SystemExit(f"{name}: counted {got} rows, the batch has {rows}")


if __name__ == "__main__":
    main()
