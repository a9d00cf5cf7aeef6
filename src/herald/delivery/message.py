"""The unit of work: a Kafka record to deliver, and its delivery progress.

A `Delivery` answers exactly once: it ends delivered or discarded, never both (`finish` asserts it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

# Namespace for deterministic message ids: the same topic/partition/offset always gives the same id, so a
# redelivered message carries the same Hermes-Message-Id and subscribers can deduplicate.
MESSAGE_ID_NAMESPACE = uuid.UUID("6f1c9a8e-3b7d-5e2a-9c41-8d0b7e5f2a13")


def message_id(topic: str, partition: int, offset: int, headers: list[tuple[str, bytes | None]] | None) -> str:
    """The Kafka header `id` when the publisher set one (Hermes frontend does), else a UUID of the position."""
    for key, value in headers or ():
        if key == "id" and value:
            return value.decode("utf-8", errors="replace")
    return str(uuid.uuid5(MESSAGE_ID_NAMESPACE, f"{topic}/{partition}/{offset}"))


@dataclass(frozen=True)
class Record:
    """One Kafka record as a task sees it (`matched` is the subscription's filter verdict)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    matched: bool = True
    text: str | None = None  # the message as JSON text when `value` is not (an AVRO subscription's Avro binary)
    error: str | None = None  # why the record could not be decoded; it is then discarded unsent
    raw: bytes | None = None  # the record's original bytes, kept when it could not be decoded
    schema_id: int | None = None
    schema_version: int | None = None

    @property
    def message_id(self) -> str:
        return message_id(self.topic, self.partition, self.offset, list(self.headers))


@dataclass(eq=False)
class Delivery:
    """A message in flight: read, not yet delivered or discarded.

    first_read_at: monotonic seconds when the task took it (the TTL clock starts here).
    attempts: attempts made so far; the next one carries Hermes-Retry-Count = attempts.
    backoff_s: the last un-jittered backoff, which the next one grows from.
    """

    record: Record
    message_id: str
    first_read_at: float
    due_at: float
    attempts: int = 0
    backoff_s: float | None = None
    last_status: int | None = None
    last_reason: str = ""
    finished: str | None = field(default=None)

    def finish(self, how: str) -> None:
        assert self.finished is None, f"message {self.message_id} already {self.finished}"
        self.finished = how
