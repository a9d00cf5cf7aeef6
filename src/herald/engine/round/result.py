"""What a round did, per subscription, and the table rows that record it.

A round is one delivery job: a micro-batch of a topic's shared query (`stream`), a subscription group's
bounded read while it catches up (`catchup`), or a batch of parked retries re-driven on the driver (`retry`).
Its `RoundResult` is collected once on the driver (a Spark action never re-runs the senders) and written as
one slice per table (`table_rows`), keyed by (writer, batch_id).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow as pa

from herald.config import Subscription
from herald.delivery.flow import FlowState
from herald.delivery.message import Record, RetryState
from herald.delivery.policy import EndedBy
from herald.delivery.report import DISCARDED, Carried, Discarded, LaneCounters, Parked, Traced
from herald.engine.endpoints.pin_group import PinNews
from herald.storage.tables import (
    HELD,
    METRICS,
    METRICS_SCHEMA,
    OFFSETS,
    OFFSETS_SCHEMA,
    PARKED,
    RELEASED,
    RETRIES,
    RETRIES_SCHEMA,
    TRACKING,
    TRACKING_SCHEMA,
    UNDELIVERED,
    UNDELIVERED_SCHEMA,
    at_ms,
    epoch_ms,
)

STREAM, CATCHUP, RETRY = "stream", "catchup", "retry"
LOST = "LOST"  # the undelivered status of a range of offsets Kafka deleted before it was read
RESET = "RESET"  # the undelivered status of a topic reset that lost the subscription nothing (engine/round/resets.py)


@dataclass
class SubscriptionOutcome:
    """One subscription in one round.

    positions: partition -> its position after the round (only the partitions the round moved or kept).
    resolved: messages whose retry state (parked, or carried behind the position) reached an end:
        (partition, offset) -> (record, DELIVERED or DISCARDED); a retry round's unfinished ones are in `parked`
        again.
    ended_carried: (partition, offset, SUCCESS or DISCARDED): carried states the round's lanes continued and ended.
    lost: (partition, first, end) of each range of offsets [first, end) its round covered that Kafka had
        deleted (retention) before it was read: neither delivered nor discarded, and recorded as LOST.
    pin_news: what the round saw of its pinned endpoint (priority pinned; None: nothing was answered).
    """

    subscription: Subscription
    counters: LaneCounters = field(default_factory=LaneCounters)
    flow_state: FlowState = field(default_factory=FlowState)
    positions: dict[int, int] = field(default_factory=dict)
    discarded: list[Discarded] = field(default_factory=list)
    parked: list[Parked] = field(default_factory=list)
    carried: list[Carried] = field(default_factory=list)
    traced: list[Traced] = field(default_factory=list)
    resolved: dict[tuple[int, int], tuple[Record, str]] = field(default_factory=dict)
    ended_carried: list[tuple[int, int, str]] = field(default_factory=list)
    lost: list[tuple[int, int, int]] = field(default_factory=list)
    pin_news: PinNews | None = None
    pending: int = 0  # its pending messages when the round was planned (`LanePlan.pending`)
    kafka_topic: str | None = None  # the Kafka topic of its messages, when the round's names none (a retry round)
    parking: int = 0  # the round's token while its `parked` are not handed to the retry driver (`TopicPipeline`)


@dataclass
class RoundResult:
    kind: str
    writer: str
    batch_id: int
    kafka_topic: str
    cluster: str
    outcomes: list[SubscriptionOutcome] = field(default_factory=list)
    topic_id: str | None = None  # Kafka's id of the topic its positions are in, when known


def urgent(result: RoundResult) -> bool:
    """The round has rows an operator looks for soon after the event (`TableWriter.submit(urgent=True)`): a
    message discarded or lost (`undelivered` rows, DISCARDED `retries` rows), or parked by a stream or catch-up
    round (its first PARKED row). A retry round that parks its messages again is not: their PARKED rows are in
    the tables already, and a subscriber down for hours would otherwise commit every few seconds."""
    return any(outcome.discarded or outcome.lost or (outcome.parked and result.kind != RETRY)
               or any(status == DISCARDED for _, status in outcome.resolved.values())
               for outcome in result.outcomes)


def table_rows(result: RoundResult, now_ms: int) -> list[tuple[str, pa.Table]]:
    """The round's rows, table by table, in the order they must be written: positions last."""
    return [
        (UNDELIVERED, _undelivered(result, now_ms)),
        (RETRIES, _retries(result, now_ms)),
        (METRICS, _metrics(result)),
        (TRACKING, _tracking(result, now_ms)),
        (OFFSETS, _offsets(result, now_ms)),
    ]


def _undelivered(result: RoundResult, now_ms: int) -> pa.Table:
    rows = []
    for outcome in result.outcomes:
        subscription = outcome.subscription
        for item in outcome.discarded:
            rows.append({
                "subscription": subscription.id, "topic_name": subscription.topicName, "partition": item.partition,
                "offset": item.offset, "message_id": item.message_id, "status": "DISCARDED", "reason": item.reason,
                "http_status": item.http_status, "attempts": item.attempts,
                "message": item.message.decode("utf-8", errors="replace") if item.message is not None else None,
                "timestamp": at_ms(item.discarded_ms or now_ms), "published_at": at_ms(item.published_ms),
                "cluster": result.cluster, "batch_id": result.batch_id, "raw_value": item.raw_value,
                "schema_id": item.schema_id, "schema_version": item.schema_version, "ended_by": item.ended_by,
                "writer": result.writer, "endpoint": item.endpoint, "delivery_batch_id": item.batch_id,
            })
        for partition, first, end in outcome.lost:
            rows.append({
                "subscription": subscription.id, "topic_name": subscription.topicName, "partition": partition,
                "offset": first, "status": LOST, "reason": lost_reason(result.kafka_topic, partition, first, end),
                "attempts": 0, "timestamp": at_ms(now_ms), "cluster": result.cluster, "batch_id": result.batch_id,
                "ended_by": EndedBy.RETENTION, "writer": result.writer,
            })
    return pa.Table.from_pylist(rows, schema=UNDELIVERED_SCHEMA)


def lost_reason(kafka_topic: str, partition: int, first: int, end: int) -> str:
    return (f"Deleted by Kafka (retention) before it was read: offsets {first}..{end - 1} of {kafka_topic}/"
            f"{partition} ({end - first} offsets)")


def _tracking(result: RoundResult, now_ms: int) -> pa.Table:
    """The steps of the messages of subscriptions that track them: every step (trackingAll, recorded by the
    lanes) and the discards (discardedOnly too)."""
    rows = []
    for outcome in result.outcomes:
        subscription = outcome.subscription
        if subscription.trackingMode == "trackingOff":
            continue
        steps = [(s.partition, s.offset, s.message_id, s.status, s.event_ms, s.reason, s.http_status)
                 for s in outcome.traced] if subscription.trackingMode == "trackingAll" else []
        steps += [(d.partition, d.offset, d.message_id, DISCARDED, d.discarded_ms or now_ms, d.reason, d.http_status)
                  for d in outcome.discarded]
        for partition, offset, message_id, status, event_ms, reason, http_status in steps:
            rows.append({"message_id": message_id, "timestamp": at_ms(event_ms), "subscription": subscription.id,
                         "topic_name": subscription.topicName, "status": status, "reason": reason,
                         "http_status": http_status, "partition": partition, "offset": offset,
                         "cluster": result.cluster, "batch_id": result.batch_id, "writer": result.writer})
    return pa.Table.from_pylist(rows, schema=TRACKING_SCHEMA)


def retry_row(subscription: Subscription, record: Record, state: RetryState | None, status: str, now_ms: int,
              writer: str, batch_id: int, kafka_topic: str | None = None) -> dict:
    """One row of the retries table: a message parked with its state, or the end it reached."""
    return {
        "subscription": subscription.id, "topic_name": subscription.topicName, "partition": record.partition,
        "offset": record.offset, "message_id": record.message_id, "state": status,
        "message": record.body.decode("utf-8", errors="replace") if record.body is not None else None,
        "body": record.body if status == PARKED else None,
        "avro": record.avro if status == PARKED else None,
        "published_at": at_ms(record.timestamp_ms or None),
        "first_read_at": at_ms(state.first_read_ms) if state else None,
        "due_at": at_ms(state.due_ms) if state else None,
        "attempts": state.attempts if state else None,
        "backoff_ms": state.backoff_s * 1000 if state and state.backoff_s is not None else None,
        "http_status": state.last_status if state else None, "reason": state.last_reason if state else None,
        "schema_id": record.schema_id, "schema_version": record.schema_version, "recorded_at": at_ms(now_ms),
        "batch_id": batch_id, "writer": writer, "targets": state.targets_json() if state else None,
        "key": record.key if status == PARKED else None, "raw_value": record.raw if status == PARKED else None,
        "batch_last_offset": state.batch_last_offset if state else None, "kafka_topic": kafka_topic or None,
    }


def released_rows(subscription: Subscription, keys, status: str, now_ms: int, writer: str,
                  batch_id: int, kafka_topic: str | None = None) -> list[dict]:
    """Terminal retries rows (DELIVERED, DISCARDED or RELEASED) for carried states that ended: (partition, offset)
    `keys`. Without them a HELD row would stay a message's newest and be carried again after a restart."""
    return [retry_row(subscription, stub(partition, offset), None, status, now_ms, writer, batch_id, kafka_topic)
            for partition, offset in sorted(keys)]


def stub(partition: int, offset: int) -> Record:
    """A record that only says where a message is (for rows about a state, not about its content)."""
    return Record(partition=partition, offset=offset, timestamp_ms=0, message_id=None, body=None)


def state_of_row(row: dict) -> RetryState:
    """The retry state a retries-table row holds."""
    return RetryState(attempts=row["attempts"] or 0, first_read_ms=epoch_ms(row["first_read_at"]) or 0,
                      due_ms=epoch_ms(row["due_at"]) or 0,
                      backoff_s=row["backoff_ms"] / 1000 if row["backoff_ms"] is not None else None,
                      last_status=row["http_status"], last_reason=row["reason"] or "",
                      targets=RetryState.targets_from_json(row.get("targets")),
                      batch_last_offset=row.get("batch_last_offset"))


def _retries(result: RoundResult, now_ms: int) -> pa.Table:
    rows = []
    for outcome in result.outcomes:
        topic = outcome.kafka_topic or result.kafka_topic
        for (record, status) in outcome.resolved.values():
            rows.append(retry_row(outcome.subscription, record, None, status, now_ms, result.writer,
                                  result.batch_id, topic))
        for item in outcome.parked:
            rows.append(retry_row(outcome.subscription, item.record, item.state, PARKED, now_ms, result.writer,
                                  result.batch_id, topic))
        for item in outcome.carried:  # the state a later run continues from, should this one stop
            rows.append(retry_row(outcome.subscription, stub(item.partition, item.offset), item.state, HELD, now_ms,
                                  result.writer, result.batch_id, topic))
    return pa.Table.from_pylist(rows, schema=RETRIES_SCHEMA)


def _metrics(result: RoundResult) -> pa.Table:
    rows = []
    for outcome in result.outcomes:
        counters = outcome.counters
        seconds = max((counters.finished_ms - counters.started_ms) / 1000, 0.001)
        rows.append({
            "subscription": outcome.subscription.id, "batch_id": result.batch_id, "read": counters.read,
            "delivered": counters.delivered, "discarded": counters.discarded, "filtered": counters.filtered,
            "inflight": counters.inflight_peak, "attempts": counters.attempts, "timeouts": counters.timeouts,
            "other_errors": counters.other_errors, "codes_2xx": counters.codes_2xx,
            "codes_3xx": counters.codes_3xx, "codes_4xx": counters.codes_4xx, "codes_5xx": counters.codes_5xx,
            "rate": counters.attempts / seconds if counters.attempts else 0.0,
            "flow_mode": outcome.flow_state.mode.value, "flow_rate": outcome.flow_state.rate_per_s,
            "started_at": at_ms(counters.started_ms or None), "finished_at": at_ms(counters.finished_ms or None),
            "parked": counters.parked, "kind": result.kind, "writer": result.writer,
            "batches_delivered": counters.batches_delivered, "batches_discarded": counters.batches_discarded,
            "lost": counters.lost, "pending": outcome.pending,
        })
    return pa.Table.from_pylist(rows, schema=METRICS_SCHEMA)


def _offsets(result: RoundResult, now_ms: int) -> pa.Table:
    committed = at_ms(now_ms)
    rows = [
        {"subscription": outcome.subscription.id, "topic": result.kafka_topic, "partition": partition,
         "offset": offset, "batch_id": result.batch_id, "committed_at": committed, "writer": result.writer,
         "topic_id": result.topic_id}
        for outcome in result.outcomes for partition, offset in sorted(outcome.positions.items())
    ]
    return pa.Table.from_pylist(rows, schema=OFFSETS_SCHEMA)


def position_rows(subscription_id: str, kafka_topic: str, positions: dict[int, int], writer: str, batch_id: int,
                  now: dt.datetime, topic_id: str | None = None) -> pa.Table:
    """Offsets rows that set a subscription's position outside a round (where it starts, a move, a reset)."""
    rows = [{"subscription": subscription_id, "topic": kafka_topic, "partition": partition, "offset": offset,
             "batch_id": batch_id, "committed_at": now, "writer": writer, "topic_id": topic_id}
            for partition, offset in sorted(positions.items())]
    return pa.Table.from_pylist(rows, schema=OFFSETS_SCHEMA)


def moved_rows(subscription: Subscription, keys, now_ms: int, writer: str, batch_id: int,
               kafka_topic: str | None = None) -> pa.Table:
    """RELEASED rows for the carried states a retransmission dropped."""
    return pa.Table.from_pylist(released_rows(subscription, keys, RELEASED, now_ms, writer, batch_id, kafka_topic),
                                schema=RETRIES_SCHEMA)


def reset_tables(subscription: Subscription, reset, outcome, stamp: int, cluster: str,
                 before: dict[int, int], ended: SubscriptionOutcome | None = None) -> list[tuple[str, pa.Table]]:
    """What a reset of its topic (`engine.resets.TopicReset`) records for one subscription (`outcome`, a
    `SubscriptionReset`; `before`: its positions when the reset was found), in the order rows are written: per
    partition reset, a LOST undelivered row for the old log's offsets it never read, else a RESET row, and the
    undelivered rows of its parked messages the reset ended (`ended`, their DISCARDED outcome); the retries rows:
    RELEASED for the carried states it dropped, DISCARDED for those parked messages; its positions in the new log.
    One slice, `reset:<subscription>` / the reset's `found_ms` (stamped `stamp`, epoch ms, as the job stamps its
    rounds' rows)."""
    writer, batch_id = reset_writer(subscription.id), reset.found_ms
    parked = RoundResult(RETRY, writer, batch_id, reset.kafka_topic, cluster, [ended] if ended is not None else [])
    lost = {partition: (first, end) for partition, first, end in outcome.lost}
    rows = []
    for partition, part in sorted(reset.partitions.items()):
        gone = lost.get(partition)
        holds = (f"now holds offsets {part.low}..{part.high - 1}" if part.listed
                 else "is not in the topic now (added again, its offsets start at 0)")
        reason = (f"Kafka topic {reset.kafka_topic} {_reset_cause(reset, part)}: partition {partition} {holds} "
                  f"where the job knew offsets up to {part.known_end - 1}; "
                  f"delivery goes on from offset {outcome.positions[partition]}")
        if gone is not None:
            reason += (f"; offsets {gone[0]}..{gone[1] - 1} of the old log ({gone[1] - gone[0]} offsets) were never "
                       "read and are gone")
        rows.append({
            "subscription": subscription.id, "topic_name": subscription.topicName, "partition": partition,
            "offset": gone[0] if gone else before.get(partition, part.low), "status": LOST if gone else RESET,
            "reason": reason, "attempts": 0, "timestamp": at_ms(stamp), "cluster": cluster, "batch_id": batch_id,
            "ended_by": EndedBy.RESET, "writer": writer,
        })
    released = pa.Table.from_pylist(released_rows(subscription, outcome.dropped, RELEASED, stamp, writer, batch_id,
                                                  reset.kafka_topic), schema=RETRIES_SCHEMA)
    return [
        (UNDELIVERED, pa.concat_tables([pa.Table.from_pylist(rows, schema=UNDELIVERED_SCHEMA),
                                        _undelivered(parked, stamp)])),
        (RETRIES, pa.concat_tables([released, _retries(parked, stamp)])),
        (OFFSETS, position_rows(subscription.id, reset.kafka_topic, outcome.positions, writer, batch_id, at_ms(stamp),
                                reset.topic_id)),
    ]


def reset_writer(subscription_id: str) -> str:
    return f"reset:{subscription_id}"


def _reset_cause(reset, part) -> str:
    if reset.was_id and reset.topic_id and reset.was_id != reset.topic_id:
        return f"was created again (topic id {reset.was_id} -> {reset.topic_id})"
    return "went back (deleted and created again?)" if part.recreated else "had its log cut (unclean leader election?)"


def parked_discard_tables(subscription: Subscription, ended: SubscriptionOutcome, stamp: int, cluster: str,
                          writer: str, batch_id: int) -> list[tuple[str, pa.Table]]:
    """The undelivered and retries rows of parked messages a topic reset ended after its own rows were made (the
    round it waited for parked them): DISCARDED, stamped `stamp`."""
    result = RoundResult(RETRY, writer, batch_id, ended.kafka_topic or "", cluster, [ended])
    return [(UNDELIVERED, _undelivered(result, stamp)), (RETRIES, _retries(result, stamp))]
