"""How a lane turns the rows it admits into units of delivery: what differs between SERIAL and BATCH.

- `Serial`: one unit per message (or, BROADCAST, one per endpoint it has to reach: the lane's
  `herald.delivery.choice`), while fewer than `inflight` messages are in flight;
- `Batched`: the messages go into a `herald.delivery.batcher.Batcher`; each batch that closes becomes a unit,
  sent once it is the first of its partition (batches of one partition go out in order, one at a time).

Both are an `Assembly`, the protocol the lane calls. An assembly tells its lane about units through a
`UnitSink`: `created` (the lane counts it as not attempted yet when it is `fresh`) and `ready` (its attempts
may start). When nothing fresh is left it says why the lane waits (`stuck`: a `Stuck`), and at the end of the
lane it hands back what is unfinished (`leftovers`), each with the state it is carried or parked with.

`now` is the loop's `herald.delivery.clock.Instant`; the times units keep are its monotonic seconds.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from herald.delivery.batcher import Batch, Batcher, batch_id
from herald.delivery.clock import Instant
from herald.delivery.message import Record, RetryState
from herald.delivery.plan import LanePlan, Target
from herald.delivery.policy import EndedBy
from herald.delivery.unit import BatchUnit, Broadcast, MemberUnit, MessageUnit, Unit
from herald.endpoint import MissingField, fill


class UnitSink(Protocol):
    def created(self, unit: Unit) -> None: ...

    def ready(self, unit: Unit) -> None: ...


class Stuck(enum.Enum):
    """Why a lane with nothing fresh left waits (`Assembly.stuck`)."""

    RETRIES = "retries"  # only retries can move it: it settles once that has lasted long enough
    FILLING = "filling"  # it holds only filling batches: carry them now rather than hold the round


@dataclass(frozen=True)
class Refused:
    """A row the lane takes but cannot send: it is discarded unsent with this reason."""

    reason: str
    ended_by: str


@dataclass
class Leftover:
    """An unfinished message (or batch) at the end of the lane: `record` is where it is carried or parked,
    `untouched` that it was never attempted, `always_carried` that it is carried even outside an ordered
    subscription (a batch: it is rebuilt from the log, never parked)."""

    record: Record
    state: RetryState
    units: list[Unit]
    untouched: bool
    always_carried: bool = False


class Assembly(Protocol):
    """What a lane asks of its assembly (`Serial` or `Batched`); `now` is the loop's `Instant`."""

    tracks_reads: bool  # True: it needs `read_through` for every partition the input reads past

    @property
    def in_flight(self) -> int:
        """Messages (SERIAL) or batches (BATCH) admitted and not ended."""

    @property
    def held(self) -> int:
        """Messages it holds."""

    @property
    def empty(self) -> bool:
        """Nothing admitted is left."""

    def place(self, record: Record, now: Instant) -> bool | Refused:
        """Admit `record` (False: no room now; `Refused`: it cannot be sent)."""

    def ended(self, unit: Unit, message_ended: bool) -> None:
        """`unit` ended (`message_ended`: and so did its message, a BROADCAST member's last sibling included)."""

    def placed_all(self, now: Instant) -> None:
        """Every row of the input so far is placed."""

    def close_due(self, now: Instant, everything: bool = False) -> None:
        """Close what is due (`everything`: all that is filling)."""

    def next_close(self) -> float | None:
        """When (monotonic seconds) something closes next, or None."""

    def read_through(self, partition: int, next_offset: int) -> bool:
        """The input read `partition` up to `next_offset`; True when that closed something."""

    def input_ended(self, now: Instant) -> bool:
        """The input is read to its end; True when that closed something."""

    def stuck(self, input_done: bool, pending: bool) -> Stuck | None:
        """With nothing fresh in the lane: why it waits, or None while something else can move it."""

    def leftovers(self, waiting: Iterable[Unit], now: Instant) -> list[Leftover]:
        """The unfinished messages (or batches) at the end of the lane, each with its state."""


class Serial:
    """One unit per message (per endpoint for BROADCAST), at most `plan.inflight` messages in flight."""

    tracks_reads = False

    def __init__(self, plan: LanePlan, targets: tuple[Target, ...], choice, sink: UnitSink) -> None:
        self.plan = plan
        self._targets = targets
        self._templated = any(target.templated for target in targets)
        self._choice = choice
        self._sink = sink
        self.in_flight = 0  # messages admitted and not ended

    @property
    def held(self) -> int:
        return self.in_flight

    @property
    def empty(self) -> bool:
        return self.in_flight == 0

    def place(self, record: Record, now: Instant) -> bool | Refused:
        """Admit `record` into flight (False: no room)."""
        if self.in_flight >= self.plan.inflight:
            return False
        urls = None
        if self._templated:
            urls = self._fill(record)
            if isinstance(urls, str):
                return Refused(urls, EndedBy.TEMPLATE)
        resume = self.plan.resume
        state = resume.get((record.partition, record.offset)) if resume else None
        at = now.s
        if not self._choice.fans_out:  # the common case, kept short: one unit
            self._begin(MessageUnit(record, at, at, urls), record, state, now)
            self.in_flight += 1
            return True
        spread = self._choice.spread(state)
        group = Broadcast() if spread[0][0] is not None else None
        for index, unit_state in spread:
            if group is None:
                unit = MessageUnit(record, at, at, urls)
            else:
                unit = MemberUnit(record, at, at, urls, index, group)
                group.members.append(unit)
            self._begin(unit, record, unit_state, now)
        if group is not None:
            group.remaining = len(group.members)
        self.in_flight += 1
        return True

    def _begin(self, unit: MessageUnit, record: Record, state: RetryState | None, now: Instant) -> None:
        """A message entering flight: new (after any sending delay from its publish time) or continuing from its
        retry `state`."""
        if state is not None:
            unit.resume(state, now)
            unit.fresh = unit.attempts == 0 or not self.plan.positional  # a parked retry: the round tries it
        else:
            if self.plan.sending_delay_s > 0:
                unit.due_at = now.s + max(0.0, self.plan.sending_delay_s - max(0, now.ms - record.timestamp_ms) / 1000)
            unit.fresh = True
        self._sink.created(unit)
        self._sink.ready(unit)

    def _fill(self, record: Record) -> tuple[str, ...] | str:
        """Each target's URL with the message's values in its placeholders, or why the message cannot be sent."""
        try:
            document = json.loads(record.body or b"")
        except ValueError:
            return "Endpoint template: the message is not JSON"
        try:
            return tuple(fill(target.url, document) for target in self._targets)
        except MissingField as error:
            return str(error)

    def ended(self, unit: Unit, message_ended: bool) -> None:
        if message_ended:
            self.in_flight -= 1

    # BATCH's thresholds and reads: nothing to do one message at a time
    def placed_all(self, now: Instant) -> None:
        pass

    def close_due(self, now: Instant, everything: bool = False) -> None:
        pass

    def next_close(self) -> float | None:
        return None

    def read_through(self, partition: int, next_offset: int) -> bool:
        return False

    def input_ended(self, now: Instant) -> bool:
        return False

    def stuck(self, input_done: bool, pending: bool) -> Stuck | None:
        """With nothing fresh in the lane: RETRIES when only retries can move it (no input left, or no room),
        else None."""
        if self.in_flight > 0 and ((input_done and not pending) or self.in_flight >= self.plan.inflight):
            return Stuck.RETRIES
        return None

    def leftovers(self, waiting: Iterable[Unit], now: Instant) -> list[Leftover]:
        """The unfinished messages among the `waiting` units, each with its state (a BROADCAST message's sums
        up its endpoints')."""
        groups: dict[int, tuple[Broadcast, list[MemberUnit]]] = {}
        result = []
        for unit in waiting:
            if unit.group is not None:
                groups.setdefault(id(unit.group), (unit.group, []))[1].append(unit)
            else:
                result.append(Leftover(unit.anchor, unit.state(now), [unit], unit.attempts == 0))
        for group, members in groups.values():
            result.append(Leftover(members[0].anchor, Broadcast.state(members, now), members,
                                   group.untouched(members)))
        self.in_flight = 0
        return result


def _json_element(body: bytes | None) -> bytes | str:
    """The message as a JSON array element (null for a tombstone), or why it cannot be one."""
    if body is None:
        return b"null"
    try:
        json.loads(body)
    except ValueError as error:
        return f"BATCH delivery sends a JSON array and the message is not JSON: {error}"
    return body


class Batched:
    """Messages into batches (`Batcher`); a closed batch is a unit, sent when first of its partition. With
    `flush` (a --once run), filling batches are closed once the input is read instead of waiting for their
    time. A message that is not JSON cannot be an array element: it is refused (discarded alone)."""

    tracks_reads = True

    def __init__(self, plan: LanePlan, sink: UnitSink, flush: bool = False) -> None:
        assert plan.batch is not None
        self.plan = plan
        self.spec = plan.batch
        self.flush = flush
        self._sink = sink
        self._batcher = Batcher(plan.batch, plan.resume)

    @property
    def in_flight(self) -> int:
        return self._batcher.batches

    @property
    def held(self) -> int:
        return self._batcher.held

    @property
    def empty(self) -> bool:
        return self._batcher.batches == 0

    def place(self, record: Record, now: Instant) -> bool | Refused:
        element = _json_element(record.body)
        if isinstance(element, str):
            return Refused(element, EndedBy.DECODE)
        taken, closed = self._batcher.add(record, element, now)
        self._closed(closed, now)
        return taken

    def _closed(self, batches: list[Batch], now: Instant) -> None:
        """Each batch that closed becomes a unit; it may go once it is its partition's first."""
        for batch in batches:
            first = batch.records[0]
            unit = BatchUnit(batch, batch_id(self.plan.subscription_id, batch.partition, first.offset,
                                             batch.last_offset), first_read_at=batch.first_read_at, due_at=now.s)
            resumed = batch.resumed
            if resumed is not None and resumed.attempts > 0:
                unit.resume(resumed, now)
            else:
                unit.fresh = True
            batch.unit = unit
            self._sink.created(unit)
            if self._batcher.first(batch.partition) is batch:
                self._sink.ready(unit)

    def ended(self, unit: Unit, message_ended: bool) -> None:
        """The partition's next batch may go."""
        following = self._batcher.end(unit.batch)
        if following is not None:
            self._sink.ready(following.unit)

    def placed_all(self, now: Instant) -> None:
        self._closed(self._batcher.close_passed(), now)

    def close_due(self, now: Instant, everything: bool = False) -> None:
        self._closed(self._batcher.close_due(now.s, everything), now)

    def next_close(self) -> float | None:
        return self._batcher.next_close()

    def read_through(self, partition: int, next_offset: int) -> bool:
        return self._batcher.read_through(partition, next_offset)

    def input_ended(self, now: Instant) -> bool:
        """With `flush`, close every filling batch now; True when there was one."""
        if not self.flush or self._batcher.next_close() is None:
            return False
        self.close_due(now, everything=True)
        return True

    def stuck(self, input_done: bool, pending: bool) -> Stuck | None:
        """With nothing fresh: None while more input may fill its batches (or, with `flush`, they close once
        it is read); FILLING when it holds only filling batches (carry them rather than hold the round);
        else RETRIES."""
        if not input_done and not pending:
            return None
        if self.flush and input_done and self._batcher.next_close() is not None:
            return None
        return Stuck.RETRIES if self._batcher.any_closed_first() else Stuck.FILLING

    def leftovers(self, waiting: Iterable[Unit], now: Instant) -> list[Leftover]:
        """Every batch not ended (filling, closed or in retry), carried at its first offset with its state."""
        return [Leftover(batch.records[0], batch.state(now, self.spec.time_s),
                         [batch.unit] if batch.unit is not None else [], untouched=False, always_carried=True)
                for batch in self._batcher.drain()]


def assembly_for(plan: LanePlan, targets: tuple[Target, ...], choice, sink: UnitSink,
                 flush: bool) -> Assembly:
    return Batched(plan, sink, flush) if plan.batch is not None else Serial(plan, targets, choice, sink)

