"""The unit of work: a Kafka record to deliver, its retry state, and its progress while in flight.

- `Record`: one Kafka record as a task reads it (immutable, shared by every subscription it goes to).
- `RetryState`: where a message's delivery stands, on the wall clock, so it can continue in another task,
  micro-batch or process (parked in the retries table, or carried to a subscription's catch-up).
- `Delivery`: one subscription's message in flight inside a task (for BROADCAST, at one endpoint, the
  message's deliveries grouped in a `Broadcast`), on the task's monotonic clock. It answers
  exactly once: it ends delivered, discarded, parked or carried, never two of them (`finish` asserts it).
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

    index: int  # the endpoint's place in the subscription's list
    attempts: int
    due_ms: int
    backoff_s: float | None = None
    last_status: int | None = None
    last_reason: str = ""

    def to_list(self) -> list:
        return [self.index, self.attempts, self.due_ms, self.backoff_s, self.last_status, self.last_reason]


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


class Delivery:
    """One subscription's message in flight in a task; times are the task's monotonic seconds."""

    __slots__ = ("record", "first_read_at", "due_at", "attempts", "backoff_s", "last_status", "last_reason",
                 "finished", "target", "urls", "group", "bearer", "fresh", "opening")

    def __init__(self, record: Record, first_read_at: float, due_at: float) -> None:
        self.record = record
        self.first_read_at = first_read_at
        self.due_at = due_at
        self.attempts = 0
        self.backoff_s: float | None = None
        self.last_status: int | None = None
        self.last_reason = ""
        self.finished: str | None = None
        self.target = -1  # the index of the lane's target its first attempt here went to (-1: none yet)
        self.urls: tuple[str, ...] | None = None  # templated targets: each target's URL filled for this message
        self.group: Broadcast | None = None  # BROADCAST: the message this delivery to one endpoint is part of
        self.bearer: str | None = None  # OAuth: the token its open attempt carries (never shown)
        self.fresh = False  # counted by its lane as not attempted yet (in this task)
        self.opening = False  # its open attempt is its first in this task

    @classmethod
    def resumed(cls, record: Record, state: RetryState, now: float, now_ms: int) -> Delivery:
        """Continue a message from its `state`: the TTL clock keeps running, attempts keep counting."""
        delivery = cls(record, first_read_at=now - (now_ms - state.first_read_ms) / 1000,
                       due_at=now + max(0, state.due_ms - now_ms) / 1000)
        delivery.attempts = state.attempts
        delivery.backoff_s = state.backoff_s
        delivery.last_status = state.last_status
        delivery.last_reason = state.last_reason
        return delivery

    def state(self, now: float, now_ms: int) -> RetryState:
        """This delivery's progress on the wall clock, to continue elsewhere."""
        return RetryState(
            attempts=self.attempts,
            first_read_ms=now_ms - round((now - self.first_read_at) * 1000),
            due_ms=now_ms + max(0, round((self.due_at - now) * 1000)),
            backoff_s=self.backoff_s,
            last_status=self.last_status,
            last_reason=self.last_reason,
        )

    def finish(self, how: str) -> None:
        assert self.finished is None, f"message {self.record.message_id} already {self.finished}"
        self.finished = how


class Broadcast:
    """A BROADCAST message in flight: one `Delivery` per endpoint (`members`); it ends when every one has."""

    __slots__ = ("members", "remaining", "failed", "started")

    def __init__(self) -> None:
        self.members: list[Delivery] = []
        self.remaining = 0  # members not finished
        self.failed = 0  # members discarded
        self.started = False  # some member has been attempted
