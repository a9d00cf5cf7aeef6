"""The function each Spark task runs (through `mapInArrow`): Arrow batches in, report rows out.

Input columns (see `herald.engine.query`): topic, partition, offset, timestamp, key, value, headers, matched,
and for AVRO topics text, error, raw, schema_id, schema_version.
Records are taken from each Arrow batch lazily, so the sender reads only as fast as it delivers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from herald.delivery.message import Record
from herald.delivery.plan import DeliveryPlan
from herald.delivery.sender import PartitionSender


def records_of(batches: Iterable[pa.RecordBatch]) -> Iterator[Record]:
    for batch in batches:
        if batch.num_rows == 0:
            continue
        topic = batch.column("topic").to_pylist()
        partition = batch.column("partition").to_pylist()
        offset = batch.column("offset").to_pylist()
        timestamp_ms = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000).to_pylist()
        key = batch.column("key").to_pylist()
        value = batch.column("value").to_pylist()
        headers = batch.column("headers").to_pylist()
        matched = batch.column("matched").to_pylist()
        optional = {name: batch.column(name).to_pylist() if name in batch.schema.names else [None] * batch.num_rows
                    for name in ("text", "error", "raw", "schema_id", "schema_version")}
        for i in range(batch.num_rows):
            yield Record(
                topic=topic[i],
                partition=partition[i],
                offset=offset[i],
                timestamp_ms=timestamp_ms[i] or 0,
                value=value[i],
                key=key[i],
                headers=tuple((h["key"], h["value"]) for h in headers[i]) if headers[i] else (),
                matched=bool(matched[i]),
                **{name: values[i] for name, values in optional.items()},
            )


def delivery_task(plan: DeliveryPlan):
    """The `mapInArrow` function for one micro-batch: delivers the task's records, yields one report."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        report = PartitionSender(plan).run(records_of(batches))
        yield report.to_arrow()

    return run
