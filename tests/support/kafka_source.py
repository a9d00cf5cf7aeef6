"""Helpers for the tests of Herald's Python Kafka Data Source: records published as given (partition, key,
headers, timestamp), a Trigger.AvailableNow query run to its end, and the source's options."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from pyspark.errors import StreamingQueryException

from herald.source import PYTHON_SOURCE_NAME

# noida-db applies the default 7-day time retention within seconds once a segment's newest record is older:
# test records carry recent timestamps.
BASE_TS_MS = (int(time.time()) - 3600) * 1000


def produce(bootstrap: str, topic: str, records: list[dict]) -> None:
    """Publish `records` (dicts with partition, key, value, headers, timestamp_ms) and wait for every ack."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failures: list[str] = []

    def on_delivery(error, _message):
        if error is not None:
            failures.append(str(error))

    for record in records:
        producer.produce(
            topic,
            key=record.get("key"),
            value=record.get("value"),
            partition=record["partition"],
            headers=record.get("headers"),
            timestamp=record.get("timestamp_ms", 0),
            on_delivery=on_delivery,
        )
    assert producer.flush(15) == 0, "producer did not deliver every record"
    assert not failures, failures


def simple_records(count: int, partitions: int, prefix: str = "v") -> list[dict]:
    return [
        {"partition": i % partitions, "key": f"k{i}".encode(), "value": f"{prefix}{i}".encode()} for i in range(count)
    ]


# Spark waits a fixed 10 s (PythonWorkerFactory.createSimpleWorker, no setting) for the planner process of a Python
# streaming source to connect back; on a loaded machine its start (Python, pyspark compiled from pyspark.zip) can
# take longer and the query fails before its first batch. Herald's supervisor starts such a query again from its
# checkpoint; the tests that run a query themselves do the same, until their deadline.
CONNECT_BACK_FAILED = "Python worker failed to connect back"


def run_available_now(spark, options: dict[str, str], checkpoint, timeout_s: float = 240) -> list[list[dict]]:
    """Run one Trigger.AvailableNow query to the end; return the rows of each micro-batch (empty batches too).

    A failed query raises StreamingQueryException (from `awaitTermination`), whose text carries the source's error;
    one whose planner process did not connect back in time is started again from its checkpoint. `timeout_s` is a
    deadline for a stuck query, not a speed bound.
    """
    batches: list[list[dict]] = []

    def collect(batch_df, _batch_id):
        rows = batch_df.selectExpr("*", "unix_millis(timestamp) AS timestamp_ms").collect()
        batches.append([row.asDict(recursive=True) for row in rows])

    deadline = time.monotonic() + timeout_s
    while True:
        reader = spark.readStream.format(PYTHON_SOURCE_NAME)
        for key, value in options.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            finished = query.awaitTermination(max(1.0, deadline - time.monotonic()))
        except StreamingQueryException as failure:
            if CONNECT_BACK_FAILED in str(failure) and time.monotonic() < deadline:
                continue
            raise
        finally:
            if query.isActive:
                query.stop()
        assert finished, f"AvailableNow query did not finish within {timeout_s} s"
        return batches


def base_options(broker, topic: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic, **extra}
