"""Reading the tables for people: last undelivered messages, metrics totals and offsets of a subscription.

These read Delta with delta-rs and never start Spark, so `herald undelivered|metrics|offsets` answer in about
a second. Field names of the JSON forms are Hermes' (`topicName`, `otherErrors`, `codes2xx`, ...).

Several writers write a subscription's rows (the topic's shared query, catch-up, the retry driver), each
numbering its own rounds, so "the newest" row is the one written last (finished_at / committed_at), with
batch_id only breaking ties.
"""

from __future__ import annotations

import time
from typing import Any

from herald.config import HeraldConfig, Subscription
from herald.storage import DeltaRsStore
from herald.storage.reads import sql_string
from herald.storage.tables import ADVISORIES, METRICS, OFFSETS, UNDELIVERED


def table_store(config: HeraldConfig) -> DeltaRsStore:
    """The job's tables as the CLI reads (and `herald maintain` keeps) them: delta-rs, no Spark, with the storage
    options and the file retention herald.yaml gives."""
    storage = config.settings.storage
    return DeltaRsStore(config.storage_path, storage.options or None, storage.maintenanceRetentionHours)


def _newest(column: str):
    """Sort key: when the row was written, then its batch_id (rows of old tables may lack the time)."""
    return lambda row: (_epoch_ms(row.get(column)) or 0, row["batch_id"])


def _epoch_ms(value) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None


def undelivered(config: HeraldConfig, subscription: Subscription, limit: int = 1) -> list[dict[str, Any]]:
    """The last `limit` discarded messages, newest first, in Hermes' undelivered-message format."""
    rows = table_store(config).read(UNDELIVERED, subscription.id).to_pylist()
    rows.sort(key=lambda row: (row["timestamp"], row["batch_id"], row["offset"]), reverse=True)
    return [
        {
            "timestamp": _epoch_ms(row["timestamp"]),
            "subscription": subscription.name,
            "topicName": row["topic_name"],
            "status": row["status"],
            "reason": row["reason"],
            "message": row["message"],
            "partition": row["partition"],
            "offset": row["offset"],
            "cluster": row["cluster"],
            "messageId": row["message_id"],
            "httpStatus": row["http_status"],
            "attempts": row["attempts"],
        }
        for row in rows[:limit]
    ]


_LIFETIME = {
    "delivered": "delivered",
    "discarded": "discarded",
    "filtered": "filtered",
    "timeouts": "timeouts",
    "otherErrors": "other_errors",
    "codes2xx": "codes_2xx",
    "codes3xx": "codes_3xx",
    "codes4xx": "codes_4xx",
    "codes5xx": "codes_5xx",
    "attempts": "attempts",
    "parked": "parked",
}


def metrics(config: HeraldConfig, subscription: Subscription, with_lag: bool = False,
            now_ms: int | None = None) -> dict[str, Any]:
    """Counts summed over every round the metrics table keeps (micro-batch, catch-up or retry round; the last
    `storage.historyRetentionHours`, a week by default: maintenance deletes older rows); `inflight`, `pending`,
    `rate` and `flow` are the last round's. `rate` is attempts per second, `lastBatchAt` epoch milliseconds.
    `inflight`: the most messages in flight at once in a task of that round (admitted and not yet delivered,
    discarded, parked or carried: being attempted or waiting for a retry). `pending`: its messages read or
    readable and not yet delivered or discarded when the round was planned (its Kafka lag as the job knew it,
    plus its parked messages). Priority overflow compares them with an endpoint's `minInflight` / `minPending`.

    Unlike Hermes' per-second gauges, timeouts/otherErrors/codes* are such counts of attempts; Hermes'
    per-second figures over the last minute are in `lastMinute`. With `with_lag`, `lag` gives per partition
    the end offset, the position and their difference (asking Kafka; `lagError` says why when it cannot).
    """
    rows = table_store(config).read(METRICS, subscription.id).to_pylist()
    result: dict[str, Any] = {"subscription": subscription.id, "batches": len(rows)}
    for name, column in _LIFETIME.items():
        result[name] = sum(row.get(column) or 0 for row in rows)
    if subscription.deliveryType == "BATCH":  # delivered and discarded count messages; these, batches
        for name, column in (("batchesDelivered", "batches_delivered"), ("batchesDiscarded", "batches_discarded")):
            result[name] = sum(row.get(column) or 0 for row in rows)
    last = max(rows, key=_newest("finished_at"), default=None)
    result["inflight"] = last["inflight"] if last else 0
    result["pending"] = (last.get("pending") or 0) if last else 0
    result["rate"] = round(last["rate"], 3) if last else 0.0
    result["flowMode"] = last["flow_mode"] if last else None
    result["flowRate"] = last["flow_rate"] if last else None
    result["lastBatchAt"] = _epoch_ms(last["finished_at"]) if last else None
    result["lastMinute"] = last_minute(rows, now_ms if now_ms is not None else int(time.time() * 1000))
    if with_lag:
        result["lag"], result["lagError"] = lag(config, subscription)
    return result


_PER_SECOND = {"timeouts": "timeouts", "otherErrors": "other_errors", "codes2xx": "codes_2xx",
               "codes3xx": "codes_3xx", "codes4xx": "codes_4xx", "codes5xx": "codes_5xx"}


def last_minute(rows: list[dict], now_ms: int) -> dict[str, float]:
    """Hermes' current figures: per second over the minute before `now_ms` (epoch ms), from the rounds that
    finished in it: `rate` (attempts), timeouts, otherErrors and codes*, and `delivered`."""
    recent = [row for row in rows if (_epoch_ms(row.get("finished_at")) or 0) > now_ms - 60_000]
    figures = {"rate": round(sum(row.get("attempts") or 0 for row in recent) / 60, 3),
               "delivered": round(sum(row.get("delivered") or 0 for row in recent) / 60, 3)}
    for name, column in _PER_SECOND.items():
        figures[name] = round(sum(row.get(column) or 0 for row in recent) / 60, 3)
    return figures


def lag(config: HeraldConfig, subscription: Subscription, timeout_s: float = 3.0) -> tuple[list[dict], str | None]:
    """Per partition, the messages published and not yet behind the subscription's position (the end offset
    minus the position); ([], why) when Kafka cannot be asked within `timeout_s` seconds."""
    from herald.source.kafka_offsets import KafkaOffsetsError, partition_watermarks

    kafka_topic = config.topic_of(subscription).kafka_topic
    positions = {row["partition"]: row["offset"] for row in offsets(config, subscription)
                 if row["topic"] == kafka_topic}
    try:
        marks = partition_watermarks(config.settings.kafka.client_config(), [kafka_topic], timeout_s)[kafka_topic]
    except KafkaOffsetsError as error:
        return [], str(error)
    return [{"partition": partition, "endOffset": high, "position": positions.get(partition),
             "lag": high - positions.get(partition, low)} for partition, (low, high) in sorted(marks.items())], None


def offsets(config: HeraldConfig, subscription: Subscription) -> list[dict[str, Any]]:
    """Per Kafka partition, the subscription's position: the next offset to read (everything before it is
    delivered, discarded or parked), its newest offsets row. `committedAt` is epoch milliseconds: when it last
    moved."""
    rows = table_store(config).latest(OFFSETS, ("topic", "partition"), "committed_at DESC NULLS LAST, batch_id DESC",
                                 columns=("topic", "partition", "offset", "batch_id", "committed_at"),
                                 where=f"subscription = {sql_string(subscription.id)}").to_pylist()
    latest = {(row["topic"], row["partition"]): row for row in rows}
    return [
        {
            "topic": row["topic"],
            "partition": row["partition"],
            "offset": row["offset"],
            "batchId": row["batch_id"],
            "committedAt": _epoch_ms(row["committed_at"]),
        }
        for _, row in sorted(latest.items())
    ]


def last_retransmission(config: HeraldConfig, subscription: Subscription) -> dict[str, Any] | None:
    """The subscription's last retransmission (who, when, from which offsets to which), or None."""
    from herald.storage.tables import RETRANSMISSIONS

    rows = table_store(config).read(RETRANSMISSIONS, subscription.id).to_pylist()
    if not rows:
        return None
    last = max(row["batch_id"] for row in rows)
    mine = sorted((row for row in rows if row["batch_id"] == last), key=lambda row: row["partition"])
    return {
        "date": _epoch_ms(mine[0]["requested_date"]),
        "requestedBy": mine[0]["requested_by"],
        "recordedAt": _epoch_ms(mine[0]["recorded_at"]),
        "partitions": [{"topic": row["topic"], "partition": row["partition"], "from": row["from_offset"],
                        "to": row["to_offset"]} for row in mine],
    }


def trace(config: HeraldConfig, subscription: Subscription, message_id: str) -> list[dict[str, Any]]:
    """A message's history in the tracking table (trackingAll / discardedOnly), oldest step first, in Hermes'
    fields. A message read again (a retransmission, a replay) shows each reading in turn."""
    from herald.delivery.report import STEP_ORDER
    from herald.storage.tables import TRACKING

    rows = [row for row in table_store(config).read(TRACKING, subscription.id).to_pylist()
            if row["message_id"] == message_id]
    rows.sort(key=lambda row: (_epoch_ms(row["timestamp"]), STEP_ORDER.get(row["status"], 1)))
    return [
        {
            "messageId": row["message_id"],
            "timestamp": _epoch_ms(row["timestamp"]),
            "subscription": subscription.name,
            "topicName": row["topic_name"],
            "status": row["status"],
            "reason": row["reason"],
            "httpStatus": row["http_status"],
            "partition": row["partition"],
            "offset": row["offset"],
            "cluster": row["cluster"],
        }
        for row in rows
    ]


def advisories(config: HeraldConfig, subscription: Subscription) -> list[dict[str, Any]]:
    """The subscription's priority advisories (pins given and given up), oldest first; endpoints masked."""
    rows = table_store(config).read(ADVISORIES, subscription.id).to_pylist()
    return sorted(rows, key=lambda row: (row["timestamp"], row["type"] == "pinned"))
