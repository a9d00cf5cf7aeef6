"""The unit of work: a Kafka record to deliver, its id, and its retry state.

- `Record`: one Kafka record as a task reads it (immutable, shared by every subscription it goes to).
- `RetryState`: where a message's delivery stands, on the wall clock, so it can continue in another task,
  micro-batch or process (parked in the retries table, or carried to a subscription's catch-up).

A message in flight is a unit of delivery (`herald.delivery.unit`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass

# Namespace for deterministic message ids: the same topic/partition/offset always gives the same id, so a
# redelivered message carries the same Hermes-Message-Id and subscribers can deduplicate.
MESSAGE_ID_NAMESPACE = uuid.UUID("6f1c9a8e-3b7d-5e2a-9c41-8d0b7e5f2a13")


def uuid5_text(namespace: uuid.UUID, name: str) -> str:
    """`str(uuid.uuid5(namespace, name))` without the UUID object: the same text, about twice as fast (it is
    computed for every record a task reads)."""
    digest = bytearray(hashlib.sha1(namespace.bytes + name.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def message_id(topic: str, partition: int, offset: int, headers: list[tuple[str, bytes | None]] | None) -> str:
    """The Kafka header `id` when the publisher set one (Hermes frontend does), else a UUID of the position."""
    for key, value in headers or ():
        if key == "id" and value:
            return value.decode("utf-8", errors="replace")
    return uuid5_text(MESSAGE_ID_NAMESPACE, f"{topic}/{partition}/{offset}")


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record of the task's topic.

    body: the message as published (JSON topics), or as JSON decoded from Avro (AVRO topics): what JSON
        subscriptions receive and people read; None for a tombstone.
    avro: an AVRO topic's Avro binary (without the wire-format prefix), for AVRO subscriptions.
    error: why the record could not be decoded; such a record is discarded unsent.
    raw: the record's original bytes, kept when it could not be decoded (and, on AVRO topics, for a
        subscription with a dead-letter topic).
    """

    partition: int
    offset: int
    timestamp_ms: int
    message_id: str
    body: bytes | None
    avro: bytes | None = None
    error: str | None = None
    raw: bytes | None = None
    schema_id: int | None = None
    schema_version: int | None = None
    key: bytes | None = None  # the Kafka record's key

    @property
    def size(self) -> int:
        """Bytes this record holds in memory (for the read-ahead bound)."""
        return len(self.body or b"") + len(self.avro or b"") + len(self.raw or b"") + len(self.key or b"") + 96


@dataclass(frozen=True)
class TargetState:
    """A BROADCAST message's progress at one endpoint it has not reached yet (`RetryState` fields, per target)."""

    index: int  # the endpoint's place in the round's targets (the lane's); see `endpoint`
    attempts: int
    due_ms: int
    backoff_s: float | None = None
    last_status: int | None = None
    last_reason: str = ""
    endpoint: str = ""
    """The endpoint as people see it (password masked), named by the driver when the state leaves a round
    (docs/design.md §7): lists and discovered sets change, so the next round finds its place by this name.
    Empty in states recorded before endpoints were named: `index` is then a place in the configured list."""

    def to_list(self) -> list:
        item = [self.index, self.attempts, self.due_ms, self.backoff_s, self.last_status, self.last_reason]
        return [*item, self.endpoint] if self.endpoint else item


@dataclass(frozen=True)
class RetryState:
    """A message's delivery progress on the wall clock (epoch milliseconds), valid in any process.

    attempts: attempts made so far; the next one carries Hermes-Retry-Count = attempts.
    first_read_ms: when the message was first read (its TTL counts from here).
    due_ms: when the next attempt may start.
    backoff_s: the last un-jittered backoff, which the next one grows from (None before any).
    targets: BROADCAST: the endpoints still to reach, each with its own progress (the fields above then sum
        them up: most attempts, earliest due).
    batch_last_offset: BATCH: the last offset of a closed batch (it is rebuilt up to there, so its id stays);
        None for a batch still open (due_ms is then when its batchTime closes it).
    """

    attempts: int
    first_read_ms: int
    due_ms: int
    backoff_s: float | None = None
    last_status: int | None = None
    last_reason: str = ""
    targets: tuple[TargetState, ...] = ()
    batch_last_offset: int | None = None

    def targets_json(self) -> str | None:
        return json.dumps([target.to_list() for target in self.targets]) if self.targets else None

    @staticmethod
    def targets_from_json(text: str | None) -> tuple[TargetState, ...]:
        return tuple(TargetState(*item) for item in json.loads(text)) if text else ()

    def at_target(self, target: TargetState) -> RetryState:
        """The progress at one endpoint, as a message's own."""
        return RetryState(target.attempts, self.first_read_ms, target.due_ms, target.backoff_s, target.last_status,
                          target.last_reason)
