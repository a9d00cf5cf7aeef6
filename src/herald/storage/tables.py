"""The tables' names and schemas, and builders of their rows from a micro-batch's summary.

Credentials never reach a row: messages are stored as read from Kafka, endpoints are not stored at all.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pyarrow as pa

from herald.delivery.report import BatchSummary

UNDELIVERED = "undelivered"
OFFSETS = "offsets"
METRICS = "metrics"

_TIMESTAMP = pa.timestamp("us", tz="UTC")

UNDELIVERED_SCHEMA = pa.schema([
    ("subscription", pa.string()),  # the id, group.topic.name
    ("topic_name", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("message_id", pa.string()),
    ("status", pa.string()),  # DISCARDED
    ("reason", pa.string()),
    ("http_status", pa.int32()),
    ("attempts", pa.int32()),
    ("message", pa.string()),  # the body as text (UTF-8, undecodable bytes replaced)
    ("timestamp", _TIMESTAMP),  # when it was discarded
    ("published_at", _TIMESTAMP),  # Kafka record timestamp
    ("cluster", pa.string()),
    ("batch_id", pa.int64()),
    ("raw_value", pa.binary()),  # the original bytes of a record that could not be decoded (AVRO topics)
    ("schema_id", pa.int32()),  # AVRO topics: the message's schema id and version, when known
    ("schema_version", pa.int32()),
])

OFFSETS_SCHEMA = pa.schema([
    ("subscription", pa.string()),
    ("topic", pa.string()),  # the Kafka topic
    ("partition", pa.int32()),
    ("offset", pa.int64()),  # the next offset to read: everything before it is delivered or discarded
    ("batch_id", pa.int64()),  # -1: the starting position pinned when the subscription first ran
    ("committed_at", _TIMESTAMP),
])

METRICS_SCHEMA = pa.schema([
    ("subscription", pa.string()),
    ("batch_id", pa.int64()),
    ("read", pa.int64()),
    ("delivered", pa.int64()),
    ("discarded", pa.int64()),
    ("filtered", pa.int64()),
    ("inflight", pa.int64()),  # most messages in flight at once during the batch
    ("attempts", pa.int64()),
    ("timeouts", pa.int64()),
    ("other_errors", pa.int64()),
    ("codes_2xx", pa.int64()),
    ("codes_3xx", pa.int64()),
    ("codes_4xx", pa.int64()),
    ("codes_5xx", pa.int64()),
    ("rate", pa.float64()),  # attempts per second over the batch's delivery time
    ("flow_mode", pa.string()),  # the adaptive controller's mode after the batch
    ("flow_rate", pa.float64()),  # and its sending rate limit, attempts per second
    ("started_at", _TIMESTAMP),
    ("finished_at", _TIMESTAMP),
])

SCHEMAS = {UNDELIVERED: UNDELIVERED_SCHEMA, OFFSETS: OFFSETS_SCHEMA, METRICS: METRICS_SCHEMA}


@dataclass(frozen=True)
class BatchContext:
    subscription_id: str
    topic_name: str
    cluster: str
    batch_id: int


def _at_ms(epoch_ms: int | None) -> dt.datetime | None:
    if epoch_ms is None:
        return None
    return dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.timezone.utc)


def undelivered_rows(summary: BatchSummary, context: BatchContext) -> pa.Table:
    rows = [
        {
            "subscription": context.subscription_id,
            "topic_name": context.topic_name,
            "partition": item.partition,
            "offset": item.offset,
            "message_id": item.message_id,
            "status": "DISCARDED",
            "reason": item.reason,
            "http_status": item.http_status,
            "attempts": item.attempts,
            "message": item.message.decode("utf-8", errors="replace") if item.message is not None else None,
            "timestamp": _at_ms(item.discarded_ms),
            "published_at": _at_ms(item.published_ms),
            "cluster": context.cluster,
            "batch_id": context.batch_id,
            "raw_value": item.raw_value,
            "schema_id": item.schema_id,
            "schema_version": item.schema_version,
        }
        for item in summary.discarded
    ]
    return pa.Table.from_pylist(rows, schema=UNDELIVERED_SCHEMA)


def offsets_rows(positions: dict[tuple[str, int], int], subscription_id: str, batch_id: int) -> pa.Table:
    now = dt.datetime.now(dt.timezone.utc)
    rows = [
        {"subscription": subscription_id, "topic": topic, "partition": partition, "offset": offset,
         "batch_id": batch_id, "committed_at": now}
        for (topic, partition), offset in sorted(positions.items())
    ]
    return pa.Table.from_pylist(rows, schema=OFFSETS_SCHEMA)


def metrics_row(summary: BatchSummary, context: BatchContext, flow_mode: str, flow_rate: float | None) -> pa.Table:
    counters = summary.counters
    seconds = max((counters.finished_ms - counters.started_ms) / 1000, 0.001)
    row = {
        "subscription": context.subscription_id,
        "batch_id": context.batch_id,
        "read": counters.read,
        "delivered": counters.delivered,
        "discarded": counters.discarded,
        "filtered": counters.filtered,
        "inflight": counters.inflight_peak,
        "attempts": counters.attempts,
        "timeouts": counters.timeouts,
        "other_errors": counters.other_errors,
        "codes_2xx": counters.codes_2xx,
        "codes_3xx": counters.codes_3xx,
        "codes_4xx": counters.codes_4xx,
        "codes_5xx": counters.codes_5xx,
        "rate": counters.attempts / seconds if counters.attempts else 0.0,
        "flow_mode": flow_mode,
        "flow_rate": flow_rate,
        "started_at": _at_ms(counters.started_ms or None),
        "finished_at": _at_ms(counters.finished_ms or None),
    }
    return pa.Table.from_pylist([row], schema=METRICS_SCHEMA)
