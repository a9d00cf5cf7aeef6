"""The tables' names and schemas (docs/design.md §9).

Every row carries the round that wrote it: `writer` (the shared query of a topic, a catch-up run, the retry
driver, ...) and `batch_id` (that writer's round number). A round's rows are written as one slice per table
and replaced whole when the round is written again (a micro-batch replayed after a crash), so nothing is
counted twice. Credentials never reach a row: messages are stored as read, endpoints are not stored.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

UNDELIVERED = "undelivered"
OFFSETS = "offsets"
METRICS = "metrics"
RETRIES = "retries"
RETRANSMISSIONS = "retransmissions"
TRACKING = "tracking"
LEASES = "leases"
ADVISORIES = "advisories"
ENDPOINTS = "endpoints"

_TIMESTAMP = pa.timestamp("us", tz="UTC")

UNDELIVERED_SCHEMA = pa.schema([
    ("subscription", pa.string()),  # the id, group.topic.name
    ("topic_name", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("message_id", pa.string()),
    # DISCARDED; LOST: a range of offsets Kafka deleted (retention) or replaced (a topic created again) before it
    # was read; RESET: the topic's offsets went back, and the subscription had lost nothing of the old ones
    ("status", pa.string()),
    ("reason", pa.string()),  # the last attempt's, as Hermes writes it
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
    ("ended_by", pa.string()),  # status | messageTtl | maxAttempts | decode | template | retention
    ("writer", pa.string()),
    ("endpoint", pa.string()),  # BROADCAST: the endpoint that did not get the message (password masked)
    ("delivery_batch_id", pa.string()),  # BATCH: the Hermes-Batch-Id of the batch it was discarded with
])

OFFSETS_SCHEMA = pa.schema([
    ("subscription", pa.string()),
    ("topic", pa.string()),  # the Kafka topic
    ("partition", pa.int32()),
    ("offset", pa.int64()),  # the position: everything before it is delivered, discarded or parked
    ("batch_id", pa.int64()),  # the writer's round; -1: where the subscription started
    ("committed_at", _TIMESTAMP),  # the newest row of a (subscription, topic, partition) is its position
    ("writer", pa.string()),
    ("topic_id", pa.string()),  # Kafka's id of the topic the position is in (null: not known; engine/round/resets.py)
])

METRICS_SCHEMA = pa.schema([
    ("subscription", pa.string()),
    ("batch_id", pa.int64()),
    ("read", pa.int64()),
    ("delivered", pa.int64()),
    ("discarded", pa.int64()),
    ("filtered", pa.int64()),
    ("inflight", pa.int64()),  # most messages in flight at once during the round
    ("attempts", pa.int64()),
    ("timeouts", pa.int64()),
    ("other_errors", pa.int64()),
    ("codes_2xx", pa.int64()),
    ("codes_3xx", pa.int64()),
    ("codes_4xx", pa.int64()),
    ("codes_5xx", pa.int64()),
    ("rate", pa.float64()),  # attempts per second over the round's delivery time
    ("flow_mode", pa.string()),  # the adaptive controller's mode after the round
    ("flow_rate", pa.float64()),  # and its sending rate limit, attempts per second
    ("started_at", _TIMESTAMP),
    ("finished_at", _TIMESTAMP),
    ("parked", pa.int64()),  # messages parked to the retries table in the round
    ("kind", pa.string()),  # stream (the topic's shared query) | catchup | retry
    ("writer", pa.string()),
    ("batches_delivered", pa.int64()),  # BATCH subscriptions: batches delivered and discarded in the round
    ("batches_discarded", pa.int64()),  # (their messages count in delivered and discarded)
    ("lost", pa.int64()),  # offsets of its range Kafka deleted (retention) before they were read
    ("pending", pa.int64()),  # when the round was planned: its lag as the job knew it plus its parked messages
])

RETRIES_SCHEMA = pa.schema([
    ("subscription", pa.string()),
    ("topic_name", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("message_id", pa.string()),
    # PARKED (re-driven when due) | HELD (behind its subscription's position, which stops at it: its state is
    # where catch-up continues) | DELIVERED | DISCARDED | RELEASED (a HELD state that ended without an attempt
    # of its own: a retransmission moved the position, or the position passed it because its filter no longer
    # passes it or Kafka deleted it): the newest row of a message is where it stands
    ("state", pa.string()),
    ("message", pa.string()),  # the message as text, for people
    ("body", pa.binary()),  # PARKED rows: the message's exact bytes, to send
    ("avro", pa.binary()),  # PARKED rows of AVRO subscriptions: the Avro binary they are sent
    ("published_at", _TIMESTAMP),
    ("first_read_at", _TIMESTAMP),  # the TTL counts from here
    ("due_at", _TIMESTAMP),  # the next attempt may start then
    ("attempts", pa.int32()),
    ("backoff_ms", pa.float64()),  # the last un-jittered backoff, which the next grows from
    ("http_status", pa.int32()),  # the last attempt's
    ("reason", pa.string()),
    ("schema_id", pa.int32()),
    ("schema_version", pa.int32()),
    ("recorded_at", _TIMESTAMP),
    ("batch_id", pa.int64()),
    ("writer", pa.string()),
    ("targets", pa.string()),  # BROADCAST: JSON [[index, attempts, due_ms, backoff_s, status, reason], ...]
    ("key", pa.binary()),  # PARKED rows: the Kafka record's key, and its original bytes when kept (a dead-letter
    ("raw_value", pa.binary()),  # topic gets them if the retries end in a discard)
    ("batch_last_offset", pa.int64()),  # HELD rows of BATCH subscriptions: a closed batch's last offset
    ("kafka_topic", pa.string()),  # the Kafka topic of the round that wrote it (null: a retry round, older rows):
    # a HELD state is taken up only in its own Kafka topic, never in the one a kafkaTopic edit went to
])

RETRANSMISSIONS_SCHEMA = pa.schema([
    ("subscription", pa.string()),
    ("topic", pa.string()),  # the Kafka topic
    ("partition", pa.int32()),
    ("from_offset", pa.int64()),  # the position before the move (null: it had none yet)
    ("to_offset", pa.int64()),  # the first offset at or after requested_date (the end offset when none)
    ("requested_date", _TIMESTAMP),
    ("requested_by", pa.string()),  # the operating-system user who asked
    ("recorded_at", _TIMESTAMP),
    ("batch_id", pa.int64()),  # the move's id: epoch ms when it was asked
    ("writer", pa.string()),
    ("applied_at", _TIMESTAMP),  # when a job moved the subscription there (null: not yet, the next job does)
])

LEASES_SCHEMA = pa.schema([  # one row per job that took the storage path's lease (herald.storage.lease)
    ("holder", pa.string()),  # host:pid:run id
    ("host", pa.string()),
    ("pid", pa.int64()),
    ("acquired_at", _TIMESTAMP),
    ("renewed_at", _TIMESTAMP),
    ("expires_at", _TIMESTAMP),  # renewed every 30 s while the job runs
    ("released", pa.bool_()),  # the job ended and gave it back
    ("writer", pa.string()),
    ("batch_id", pa.int64()),
    ("space", pa.string()),  # the holder's boot id / PID namespace: where its pid means something
    ("seen_version", pa.int64()),  # the table version its holder decided to take the lease on (null: none)
    ("taken_version", pa.int64()),  # the commit version of its holder's taking (null: unknown, or this row)
])

TRACKING_SCHEMA = pa.schema([  # Hermes' message tracking (its fields, in this project's column style)
    ("message_id", pa.string()),
    ("timestamp", _TIMESTAMP),  # when the step happened
    ("subscription", pa.string()),
    ("topic_name", pa.string()),
    ("status", pa.string()),  # INFLIGHT | FAILED | SUCCESS | DISCARDED | FILTERED
    ("reason", pa.string()),  # FAILED and DISCARDED: why
    ("http_status", pa.int32()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("cluster", pa.string()),
    ("batch_id", pa.int64()),
    ("writer", pa.string()),
])

ADVISORIES_SCHEMA = pa.schema([  # priority groups: every pin given and given up (herald.engine.endpoints.pin_group)
    ("type", pa.string()),  # pinned | unpinned
    ("subscription", pa.string()),
    ("endpoint", pa.string()),  # the pinned endpoint, password masked
    ("pin_id", pa.string()),  # the Herald-Pin-Id its requests carry
    ("reason", pa.string()),  # timeout | admin | start | endpoint removed
    ("timestamp", _TIMESTAMP),
    ("writer", pa.string()),  # the job (priority:<run id>) or the operator who unpinned (admin:<user>)
    ("batch_id", pa.int64()),
])

ENDPOINTS_SCHEMA = pa.schema([  # discovery: each change of a subscription's set, whole (engine.endpoints.discoveries)
    ("subscription", pa.string()),
    ("endpoint", pa.string()),  # password masked; null in the one row of an empty set
    ("lookups", pa.string()),  # the lookup URLs whose last good answer named it, ", "-separated, passwords masked
    ("changed_at", _TIMESTAMP),  # when the set became this one (every row of a set has it)
    ("writer", pa.string()),  # discovery:<run id>
    ("batch_id", pa.int64()),
])

SCHEMAS = {UNDELIVERED: UNDELIVERED_SCHEMA, OFFSETS: OFFSETS_SCHEMA, METRICS: METRICS_SCHEMA,
           RETRIES: RETRIES_SCHEMA, RETRANSMISSIONS: RETRANSMISSIONS_SCHEMA, TRACKING: TRACKING_SCHEMA,
           LEASES: LEASES_SCHEMA, ADVISORIES: ADVISORIES_SCHEMA, ENDPOINTS: ENDPOINTS_SCHEMA}

PARKED, HELD, DELIVERED, DISCARDED, RELEASED = "PARKED", "HELD", "DELIVERED", "DISCARDED", "RELEASED"


def at_ms(epoch_ms: int | None) -> dt.datetime | None:
    """A table timestamp from epoch milliseconds."""
    if epoch_ms is None:
        return None
    return dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.timezone.utc)


def epoch_ms(value: dt.datetime | None) -> int | None:
    return int(value.timestamp() * 1000) if value is not None else None
