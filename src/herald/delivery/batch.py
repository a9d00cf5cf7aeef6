"""BATCH delivery (Hermes' `deliveryType: BATCH`): a subscription's messages sent as JSON arrays.

A `BatchLane` is a `Lane` whose unit of delivery is a `Batch` of one partition's messages instead of one
message. Everything that happens to an attempt (rate cap, flow control, OAuth, signing, the SERIAL
classification table with Retry-After, jittered backoff, the TTL from the first message's read) is the
lane's, unchanged; this module decides what goes into a batch and what its end means:

- a batch closes when it holds `size` messages, when the next message would take its body past
  `volume_bytes` (a message that alone is larger goes out alone), or `time_s` after its first message was
  read, that time carried across rounds;
- batches of one partition go out in order, one at a time: while one is in flight the next one may fill,
  and the partition takes no more messages until the one in flight ends;
- a delivered batch counts every message delivered; a discarded one writes every message to `undelivered`
  with the batch id and the reason. A message that is not JSON cannot be an array element: it is discarded
  alone (and, read again past a carried batch, not twice: `Lane.forget_rereads`);
- at the end of a round every batch not finished (open, closed or in retry) is carried at its first offset
  with its state, and the subscription's position stops there: a later round reads its messages again and
  rebuilds the same batch (a batch that was closed keeps its last offset, `RetryState.batch_last_offset`),
  so its `Hermes-Batch-Id`, a UUID of (subscription, partition, first offset, last offset), stays the same
  on every retry and after a crash. With `flush` (a `--once` run), open batches are sent once the input is
  read instead of waiting for their time.

Times are the loop's monotonic seconds (`now`) and wall-clock epoch milliseconds (`now_ms`).
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections import deque

from herald.delivery.lane import Lane
from herald.delivery.message import Delivery, Record, RetryState, uuid5_text
from herald.delivery.oauth import TOKENS, TokenCache
from herald.delivery.plan import LanePlan
from herald.delivery.policy import EndedBy
from herald.delivery.report import DISCARDED, FAILED, SUCCESS, Carried
from herald.delivery.signing import signature_lines
from herald.delivery.transport import HttpRequest

# Namespace of batch ids: the same subscription, partition and offsets always give the same id.
BATCH_ID_NAMESPACE = uuid.UUID("0b6a3d52-8e1f-5c4b-a7d2-3f9e1c6b8a40")


def batch_id(subscription_id: str, partition: int, first_offset: int, last_offset: int) -> str:
    """The batch's Hermes-Batch-Id: a UUID of its content position, the same on every retry and replay."""
    return uuid5_text(BATCH_ID_NAMESPACE, f"{subscription_id}/{partition}/{first_offset}/{last_offset}")


def _json_text(body: bytes | None) -> bytes | str:
    """The message as a JSON array element (null for a tombstone), or why it cannot be one."""
    if body is None:
        return b"null"
    try:
        json.loads(body)
    except ValueError as error:
        return f"BATCH delivery sends a JSON array and the message is not JSON: {error}"
    return body


class Batch:
    """One partition's messages sent together. `first_read_at`: when its first message was first read (its
    batchTime and TTL count from there). `resumed`: the state it was carried with (None: new). `last_offset`:
    set when it closes (or when it was carried closed: it then closes at that offset again)."""

    __slots__ = ("partition", "records", "elements", "volume", "first_read_at", "resumed", "last_offset", "closed",
                 "delivery")

    def __init__(self, partition: int, first_read_at: float, resumed: RetryState | None) -> None:
        self.partition = partition
        self.records: list[Record] = []
        self.elements: list[bytes] = []
        self.volume = 2  # bytes of the body: "[" and "]"
        self.first_read_at = first_read_at
        self.resumed = resumed
        self.last_offset = resumed.batch_last_offset if resumed is not None else None
        self.closed = False
        self.delivery: Delivery | None = None

    @property
    def first_offset(self) -> int:
        return self.records[0].offset

    def room_for(self, element: bytes, volume_bytes: int) -> bool:
        return not self.records or self.volume + len(element) + 1 <= volume_bytes

    def add(self, record: Record, element: bytes) -> None:
        self.volume += len(element) + (1 if self.records else 0)
        self.records.append(record)
        self.elements.append(element)

    def body(self) -> bytes:
        return b"[" + b",".join(self.elements) + b"]"

    def state(self, now: float, now_ms: int, time_s: float) -> RetryState:
        """Its progress on the wall clock, to be carried: a sent batch's delivery state, or (never attempted)
        its first read, and when its time closes it."""
        if self.delivery is not None and self.delivery.attempts > 0:
            state = self.delivery.state(now, now_ms)
            return RetryState(state.attempts, state.first_read_ms, state.due_ms, state.backoff_s, state.last_status,
                              state.last_reason, batch_last_offset=self.last_offset)
        if not self.closed and self.resumed is not None and self.last_offset is not None:
            return self.resumed  # being rebuilt and not all read again yet: it stays as it was
        first_read_ms = now_ms - round((now - self.first_read_at) * 1000)
        return RetryState(attempts=0, first_read_ms=first_read_ms, due_ms=first_read_ms + round(time_s * 1000),
                          batch_last_offset=self.last_offset if self.closed else None)


class BatchLane(Lane):
    """A BATCH subscription's lane: `Lane`'s attempts, over batches (see the module's docstring)."""

    def __init__(self, index: int, plan: LanePlan, now: float, now_ms: int, rng: random.Random,
                 tokens: TokenCache = TOKENS, flush: bool = False) -> None:
        super().__init__(index, plan, now, now_ms, rng, tokens)
        assert plan.batch is not None
        self.spec = plan.batch
        self.flush = flush
        self._partitions: dict[int, deque[Batch]] = {}  # the first may be in flight, the last may be open
        self._held = 0  # messages in batches
        self._read_to: dict[int, int] = {}  # partition -> the offset after the last row read of it

    # -- input into batches -----------------------------------------------------------------------------------
    def admit(self, now: float, now_ms: int) -> list[Record]:
        admitted = []
        while self.pending:
            record = self.pending[0]
            if not self._place(record, now, now_ms):
                break  # its partition has a batch in flight and the next one full: it waits (in order)
            admitted.append(self.pending.popleft())
        if not self.pending:
            self._close_passed(now, now_ms)
        if admitted:
            self.counters.inflight_peak = max(self.counters.inflight_peak, self._held)
            self._stalled_since = None
        return admitted

    def _place(self, record: Record, now: float, now_ms: int) -> bool:
        """Put `record` into its partition's open batch (closing batches as their thresholds say); False when
        the partition has no room."""
        element = _json_text(record.body)
        if isinstance(element, str):
            self._discard_record(record, element, EndedBy.DECODE, None, 0, now_ms)
            return True
        queue = self._partitions.setdefault(record.partition, deque())
        batch = queue[-1] if queue and not queue[-1].closed else None
        if batch is not None:
            if batch.last_offset is not None:  # rebuilding a batch carried closed: it ends where it ended
                if record.offset > batch.last_offset:
                    self._close(batch, now, now_ms, last_offset=batch.last_offset)
                    batch = None
            elif len(batch.records) >= self.spec.size or not batch.room_for(element, self.spec.volume_bytes):
                self._close(batch, now, now_ms)
                batch = None
        if batch is None:
            if len(queue) >= 2:
                return False
            resumed = self._resume.get((record.partition, record.offset)) if self._resume else None
            first_read_at = now - (now_ms - resumed.first_read_ms) / 1000 if resumed is not None else now
            batch = Batch(record.partition, first_read_at, resumed)
            queue.append(batch)
            self.in_flight += 1
        batch.add(record, element)
        self._held += 1
        if batch.last_offset is not None:
            if record.offset >= batch.last_offset:
                self._close(batch, now, now_ms, last_offset=batch.last_offset)
        elif len(batch.records) >= self.spec.size or batch.volume >= self.spec.volume_bytes:
            self._close(batch, now, now_ms)
        return True

    def _close(self, batch: Batch, now: float, now_ms: int, last_offset: int | None = None) -> None:
        """The batch takes no more messages; it is sent once it is the first of its partition."""
        batch.closed = True
        batch.last_offset = last_offset if last_offset is not None else batch.records[-1].offset
        first = batch.records[0]
        carrier = Record(partition=batch.partition, offset=first.offset, timestamp_ms=first.timestamp_ms,
                         message_id=batch_id(self.plan.subscription_id, batch.partition, first.offset,
                                             batch.last_offset),
                         body=batch.body())
        resumed = batch.resumed
        if resumed is not None and resumed.attempts > 0:
            delivery = Delivery.resumed(carrier, resumed, now, now_ms)
        else:
            delivery = self._count_fresh(Delivery(carrier, first_read_at=batch.first_read_at, due_at=now))
        batch.delivery = delivery
        if self._partitions[batch.partition][0] is batch:
            self._push(delivery)

    def _open_batches(self):
        """Batches still filling (not those being rebuilt up to their last offset: only that offset ends them)."""
        for queue in self._partitions.values():
            if queue and not queue[-1].closed and queue[-1].last_offset is None:
                yield queue[-1]

    def _close_due(self, now: float, now_ms: int, everything: bool = False) -> None:
        """Close the open batches whose batchTime has passed (every open batch, with `everything`)."""
        for batch in list(self._open_batches()):
            if everything or now >= batch.first_read_at + self.spec.time_s:
                self._close(batch, now, now_ms)

    def _next_close(self) -> float | None:
        times = [batch.first_read_at + self.spec.time_s for batch in self._open_batches()]
        return min(times) if times else None

    def read_through(self, partition: int, next_offset: int, now: float, now_ms: int) -> bool:
        """Remember how far `partition` was read: a batch being rebuilt up to its last offset closes there once
        the read has passed it (`_close_passed`), even when its last message no longer comes to the lane (a
        filter edited since, a record compacted away)."""
        self._read_to[partition] = max(self._read_to.get(partition, 0), next_offset)
        queue = self._partitions.get(partition)
        batch = queue[-1] if queue else None
        return batch is not None and not batch.closed and batch.last_offset is not None \
            and next_offset > batch.last_offset

    def _close_passed(self, now: float, now_ms: int) -> None:
        """(every row read so far placed) Close the rebuilt batches whose last offset the read has passed."""
        for partition, queue in self._partitions.items():
            batch = queue[-1] if queue else None
            if batch is not None and not batch.closed and batch.last_offset is not None \
                    and self._read_to.get(partition, 0) > batch.last_offset:
                self._close(batch, now, now_ms, last_offset=batch.last_offset)

    def input_ended(self, now: float, now_ms: int) -> bool:
        """With `flush` (a --once run), the open batches go out now instead of waiting for their time."""
        if not self.flush or self.settled or self.settling or self.pending or self._next_close() is None:
            return False
        self._close_due(now, now_ms, everything=True)
        return True

    # -- attempts ---------------------------------------------------------------------------------------------
    def dispatch(self, now: float, now_ms: int, room: int, start) -> tuple[float | None, int]:
        if not self.settling:
            self._close_due(now, now_ms)
        wake_at, started = super().dispatch(now, now_ms, room, start)
        close_at = self._next_close()
        if close_at is not None and not self.settling and (wake_at is None or close_at < wake_at):
            wake_at = close_at
        return wake_at, started

    def _request(self, delivery: Delivery, now_ms: int) -> HttpRequest:
        """One attempt of a batch: the subscription's lines, Authorization, Hermes-Batch-Id, the retry count,
        and the signature of the body (webhook-id: the batch id)."""
        plan = self.plan
        index = self._target_of(delivery) if len(self._targets) > 1 else 0
        target = self._targets[index]
        authorization = f"Authorization: Bearer {delivery.bearer}" if delivery.bearer else target.authorization
        record = delivery.record
        lines = self._lines + ((authorization,) if authorization else ()) + (
            f"Hermes-Batch-Id: {record.message_id}", f"Hermes-Retry-Count: {delivery.attempts}")
        body = record.body or b"[]"
        if plan.signing_keys:
            lines += signature_lines(plan.signing_keys, record.message_id, now_ms // 1000, body)
        return HttpRequest(target.url, lines, body, plan.request_timeout_s, plan.socket_timeout_s, tls=plan.tls)

    def _ended(self, delivery: Delivery) -> Batch:
        """The batch of `delivery` ended: the next closed batch of its partition may go."""
        queue = self._partitions[delivery.record.partition]
        batch = queue.popleft()
        assert batch.delivery is delivery
        self.in_flight -= 1
        self._held -= len(batch.records)
        if queue and queue[0].closed:
            self._push(queue[0].delivery)
        return batch

    def _delivered(self, delivery: Delivery, now_ms: int) -> None:
        batch = self._ended(delivery)
        if batch.resumed is not None:
            self._ended_carried(batch.records[0], SUCCESS)
        self.counters.delivered += len(batch.records)
        self.counters.batches_delivered += 1
        if self._tracing:
            for record in batch.records:
                self._trace(record, SUCCESS, now_ms)

    def _trace_failure(self, delivery: Delivery, now_ms: int, reason: str, status: int | None) -> None:
        for record in self._partitions[delivery.record.partition][0].records:
            self._trace(record, FAILED, now_ms, reason, status)

    def _discard(self, delivery: Delivery, reason: str, ended_by: str, now_ms: int | None) -> None:
        """Every message of the batch goes to `undelivered`, with the batch id and the last attempt's reason."""
        delivery.finish("discarded")
        batch = self._ended(delivery)
        if batch.resumed is not None:
            self._ended_carried(batch.records[0], DISCARDED)
        self.counters.batches_discarded += 1
        for record in batch.records:
            self._discard_record(record, reason, ended_by, delivery.last_status, delivery.attempts, now_ms,
                                 batch_id=delivery.record.message_id)

    # -- the end of the round ---------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return not self.pending and not any(self._partitions.values())

    def stalled(self, now: float, input_done: bool) -> float | None:
        """Nothing but retries and batches waiting for their time can move the lane, and no more input comes
        (or its partitions have no room): it may settle (at once when nothing of it is in flight at all)."""
        if self._fresh or self._open_first or (not input_done and not self.pending):
            self._stalled_since = None
            return None
        if self.flush and input_done and self._next_close() is not None:
            return None  # input_ended closes them
        if not any(queue[0].closed for queue in self._partitions.values() if queue):
            return -math.inf  # only open batches: carry them now rather than hold the round
        if self._stalled_since is None:
            self._stalled_since = now
        return self._stalled_since

    def settle(self, now: float, now_ms: int, progress: dict[int, int], input_done: bool) -> list[Record]:
        """Carry every unfinished batch at its first offset with its state; the position stops there."""
        assert self.open == 0, "settle with attempts open"
        dropped = [] if input_done or self.cut else self.cut_input(progress)
        dropped += self._leave_pending()
        for partition, queue in self._partitions.items():
            for batch in queue:
                if batch.delivery is not None:
                    batch.delivery.finish("carried")
                self.report.carried.append(Carried(partition, batch.first_offset,
                                                   batch.state(now, now_ms, self.spec.time_s)))
                self._stop(partition, batch.first_offset)
            queue.clear()
        self._waiting.clear()
        self.in_flight = 0
        self._held = 0
        self._fresh = 0
        self.settled = True
        return dropped
