"""What goes into a BATCH subscription's batches (Hermes' `deliveryType: BATCH`), decided without I/O.

A `Batcher` keeps one lane's batches per partition, in order:

- a batch closes when it holds `size` messages, when the next message would take its body past
  `volume_bytes` (a message that alone is larger goes out alone), or `time_s` after its first message was
  read, that time carried across rounds (`close_due`, `next_close`);
- a partition holds at most two batches: the first may be in flight while the second fills; past that the
  partition takes no more messages until the first ends (`add` says so, and `end` frees it);
- a batch carried closed from an earlier round (`RetryState.batch_last_offset`) is rebuilt up to its last
  offset and closes there, also when its last message no longer comes (a filter edited since, a record
  compacted away): once the read has passed that offset (`read_through`, `close_passed`). So its id, a UUID
  of (subscription, partition, first offset, last offset), stays the same on every retry and after a crash.

Times are the task's monotonic seconds, passed in; `add` and `Batch.state` take the loop's
`herald.delivery.clock.Instant`, where a carried state's epoch milliseconds meet them.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterator, Mapping

from herald.delivery.clock import Instant
from herald.delivery.message import Record, RetryState, uuid5_text
from herald.delivery.spec import BatchSpec

# Namespace of batch ids: the same subscription, partition and offsets always give the same id.
BATCH_ID_NAMESPACE = uuid.UUID("0b6a3d52-8e1f-5c4b-a7d2-3f9e1c6b8a40")


def batch_id(subscription_id: str, partition: int, first_offset: int, last_offset: int) -> str:
    """The batch's Hermes-Batch-Id: a UUID of its content position, the same on every retry and replay."""
    return uuid5_text(BATCH_ID_NAMESPACE, f"{subscription_id}/{partition}/{first_offset}/{last_offset}")


class Batch:
    """One partition's messages sent together. `first_read_at`: when its first message was first read (its
    batchTime and TTL count from there). `resumed`: the state it was carried with (None: new). `last_offset`:
    set when it closes (or when it was carried closed: it then closes at that offset again). `unit`: what its
    attempts go out as, once it is closed (`herald.delivery.unit.BatchUnit`)."""

    __slots__ = ("partition", "records", "elements", "volume", "first_read_at", "resumed", "last_offset", "closed",
                 "unit")

    def __init__(self, partition: int, first_read_at: float, resumed: RetryState | None) -> None:
        self.partition = partition
        self.records: list[Record] = []
        self.elements: list[bytes] = []
        self.volume = 2  # bytes of the body: "[" and "]"
        self.first_read_at = first_read_at
        self.resumed = resumed
        self.last_offset = resumed.batch_last_offset if resumed is not None else None
        self.closed = False
        self.unit = None

    @property
    def first_offset(self) -> int:
        return self.records[0].offset

    @property
    def rebuilding(self) -> bool:
        """Open, and carried closed before: only its last offset closes it."""
        return not self.closed and self.last_offset is not None

    def room_for(self, element: bytes, volume_bytes: int) -> bool:
        return not self.records or self.volume + len(element) + 1 <= volume_bytes

    def add(self, record: Record, element: bytes) -> None:
        self.volume += len(element) + (1 if self.records else 0)
        self.records.append(record)
        self.elements.append(element)

    def close(self) -> None:
        self.closed = True
        if self.last_offset is None:
            self.last_offset = self.records[-1].offset

    def body(self) -> bytes:
        return b"[" + b",".join(self.elements) + b"]"

    def state(self, now: Instant, time_s: float) -> RetryState:
        """Its progress on the wall clock (epoch ms), to be carried: a sent batch's attempt state, or (never
        attempted) its first read, and when its time (`time_s`, seconds) closes it."""
        if self.unit is not None and self.unit.attempts > 0:
            state = self.unit.state(now)
            return RetryState(state.attempts, state.first_read_ms, state.due_ms, state.backoff_s, state.last_status,
                              state.last_reason, batch_last_offset=self.last_offset)
        if self.rebuilding and self.resumed is not None:
            return self.resumed  # being rebuilt and not all read again yet: it stays as it was
        first_read_ms = now.to_ms(self.first_read_at)
        return RetryState(attempts=0, first_read_ms=first_read_ms, due_ms=first_read_ms + round(time_s * 1000),
                          batch_last_offset=self.last_offset if self.closed else None)


class Batcher:
    """One lane's batches, per partition (see the module's docstring). `resume`: (partition, offset) -> the
    state a batch carried from an earlier round starts with, keyed by its first message."""

    def __init__(self, spec: BatchSpec, resume: Mapping[tuple[int, int], RetryState]) -> None:
        self.spec = spec
        self._resume = resume
        self._partitions: dict[int, deque[Batch]] = {}  # the first may be in flight, the last may be open
        self._read_to: dict[int, int] = {}  # partition -> the offset after the last row read of it
        self.batches = 0  # batches held
        self.held = 0  # messages in them

    def add(self, record: Record, element: bytes, now: Instant) -> tuple[bool, list[Batch]]:
        """Put `record` (its JSON array element) into its partition's open batch. Returns whether it was taken
        (False: the partition has two batches and the second is closed) and the batches it closed."""
        closed = []
        queue = self._partitions.setdefault(record.partition, deque())
        batch = queue[-1] if queue and not queue[-1].closed else None
        if batch is not None and (record.offset > batch.last_offset if batch.rebuilding else
                                  len(batch.records) >= self.spec.size
                                  or not batch.room_for(element, self.spec.volume_bytes)):
            batch.close()
            closed.append(batch)
            batch = None
        if batch is None:
            if len(queue) >= 2:
                return False, closed
            resumed = self._resume.get((record.partition, record.offset)) if self._resume else None
            first_read_at = now.from_ms(resumed.first_read_ms) if resumed is not None else now.s
            batch = Batch(record.partition, first_read_at, resumed)
            queue.append(batch)
            self.batches += 1
        batch.add(record, element)
        self.held += 1
        if (record.offset >= batch.last_offset if batch.rebuilding else
                len(batch.records) >= self.spec.size or batch.volume >= self.spec.volume_bytes):
            batch.close()
            closed.append(batch)
        return True, closed

    def first(self, partition: int) -> Batch | None:
        """The partition's batch that goes out next (or is out)."""
        queue = self._partitions.get(partition)
        return queue[0] if queue else None

    def end(self, batch: Batch) -> Batch | None:
        """`batch` (its partition's first) ended; returns the partition's next batch when it is closed."""
        queue = self._partitions[batch.partition]
        assert queue[0] is batch
        queue.popleft()
        self.batches -= 1
        self.held -= len(batch.records)
        return queue[0] if queue and queue[0].closed else None

    def _filling(self) -> Iterator[Batch]:
        """Batches still filling (not those being rebuilt up to their last offset: only that offset ends them)."""
        for queue in self._partitions.values():
            if queue and not queue[-1].closed and queue[-1].last_offset is None:
                yield queue[-1]

    def close_due(self, now: float, everything: bool = False) -> list[Batch]:
        """Close the filling batches whose batchTime has passed at `now` (monotonic seconds; every one, with
        `everything`)."""
        closed = [batch for batch in self._filling() if everything or now >= batch.first_read_at + self.spec.time_s]
        for batch in closed:
            batch.close()
        return closed

    def next_close(self) -> float | None:
        """When the first filling batch's time closes it (monotonic seconds; None: none fills)."""
        times = [batch.first_read_at + self.spec.time_s for batch in self._filling()]
        return min(times) if times else None

    def read_through(self, partition: int, next_offset: int) -> bool:
        """The task read `partition` up to `next_offset`; True when that lets a rebuilt batch close."""
        self._read_to[partition] = max(self._read_to.get(partition, 0), next_offset)
        queue = self._partitions.get(partition)
        batch = queue[-1] if queue else None
        return batch is not None and batch.rebuilding and next_offset > batch.last_offset

    def close_passed(self) -> list[Batch]:
        """(every row read so far placed) Close the rebuilt batches whose last offset the read has passed."""
        closed = []
        for partition, queue in self._partitions.items():
            batch = queue[-1] if queue else None
            if batch is not None and batch.rebuilding and self._read_to.get(partition, 0) > batch.last_offset:
                batch.close()
                closed.append(batch)
        return closed

    def any_closed_first(self) -> bool:
        """Some partition's next batch is closed (it is out or about to be)."""
        return any(queue[0].closed for queue in self._partitions.values() if queue)

    def drain(self) -> list[Batch]:
        """Every batch held, by partition and in order; the batcher is empty after."""
        batches = [batch for queue in self._partitions.values() for batch in queue]
        self._partitions.clear()
        self.batches = self.held = 0
        return batches
