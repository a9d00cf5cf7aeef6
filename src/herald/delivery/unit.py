"""The unit of delivery: what one attempt sends, and what its end means.

A `Unit` is a message (`MessageUnit`), a BATCH subscription's batch of one partition's messages (`BatchUnit`),
or one endpoint's share of a BROADCAST message (`MemberUnit`, the members grouped in a `Broadcast`). The lane
(`herald.delivery.lane`) does the same for every kind: it admits, starts attempts within rate and flow,
classifies answers, backs off, and at the end carries or parks what is unfinished. A unit only says:

- what an attempt carries: its id header (`Hermes-Message-Id` or `Hermes-Batch-Id`), its body, and, when its
  endpoint URLs were filled from the message (`herald.endpoint.fill`), each endpoint's URL;
- which messages it covers (`records`: one, or a batch's) and under which one it is carried or parked
  (`anchor`: the first);
- what its end made of its message(s) (`end`): delivered, discarded, or (a BROADCAST member whose siblings
  have not all ended) nothing yet.

Its attempt state runs on the task's monotonic clock (seconds: `first_read_at`, `due_at`); `state` turns it,
at the loop's `herald.delivery.clock.Instant`, into a `RetryState` on the wall clock (epoch ms) to continue in
another task, round or process, and `resume` turns one back. A unit ends exactly once: delivered, discarded,
parked or carried (`finish` asserts it).
"""

from __future__ import annotations

import enum

from herald.delivery.clock import Instant
from herald.delivery.message import Record, RetryState, TargetState


class UnitEnd(str, enum.Enum):
    """How a unit (and, once its last BROADCAST sibling ends, its messages) ended in this task."""

    DELIVERED = "delivered"
    DISCARDED = "discarded"  # given up: an undelivered row for each of its messages
    CARRIED = "carried"  # unfinished, its state carried behind the position (ordered, BATCH)
    PARKED = "parked"  # unfinished, parked for the retry driver


class Unit:
    """What one attempt sends; subclasses say what and for which messages."""

    __slots__ = ("first_read_at", "due_at", "attempts", "backoff_s", "last_status", "last_reason", "finished",
                 "target", "bearer", "fresh", "opening")

    batch_id: str | None = None  # a batch's id (its undelivered rows carry it)
    target_fixed = False  # True: every attempt goes to `target` (a BROADCAST member)
    group: Broadcast | None = None  # a BROADCAST member's message (`MemberUnit`)

    def __init__(self, first_read_at: float, due_at: float) -> None:
        self.first_read_at = first_read_at
        self.due_at = due_at
        self.attempts = 0
        self.backoff_s: float | None = None
        self.last_status: int | None = None
        self.last_reason = ""
        self.finished: UnitEnd | None = None
        self.target = -1  # the endpoint its first attempt here went to (-1: none yet), or its fixed one
        self.bearer: str | None = None  # OAuth: the token its open attempt carries (never shown)
        self.fresh = False  # counted by its lane as not attempted yet (in this task)
        self.opening = False  # its open attempt is its first in this task

    # -- what it is -------------------------------------------------------------------------------------------
    @property
    def anchor(self) -> Record:
        """The message it is carried or parked under (the first it covers)."""
        raise NotImplementedError

    records: tuple[Record, ...] | list[Record]  # the messages it covers

    def id_line(self) -> str:
        """Its id header line, which every attempt carries (signatures sign with that id too)."""
        raise NotImplementedError

    @property
    def id(self) -> str:
        raise NotImplementedError

    def body(self, avro: bool) -> bytes:
        """What an attempt sends (`avro`: an AVRO delivery sends the Avro binary)."""
        raise NotImplementedError

    def schema_lines(self) -> tuple[str, ...]:
        """An AVRO delivery's Schema-Id / Schema-Version lines (a message's, when known)."""
        return ()

    def url(self, index: int) -> str | None:
        """The URL of endpoint `index` filled for this unit, or None: the endpoint's own."""
        return None

    def end(self, failed: bool) -> UnitEnd | None:
        """This unit ended (`failed`: given up). Returns what its messages became now: DELIVERED or DISCARDED,
        or None while a BROADCAST sibling has not ended."""
        return UnitEnd.DISCARDED if failed else UnitEnd.DELIVERED

    # -- its progress -----------------------------------------------------------------------------------------
    def resume(self, state: RetryState, now: Instant) -> Unit:
        """Continue from `state` (epoch ms): the TTL clock keeps running, attempts keep counting."""
        self.first_read_at = now.from_ms(state.first_read_ms)
        self.due_at = max(now.s, now.from_ms(state.due_ms))
        self.attempts = state.attempts
        self.backoff_s = state.backoff_s
        self.last_status = state.last_status
        self.last_reason = state.last_reason
        return self

    def state(self, now: Instant) -> RetryState:
        """Its progress on the wall clock (epoch ms), to continue elsewhere."""
        return RetryState(
            attempts=self.attempts,
            first_read_ms=now.to_ms(self.first_read_at),
            due_ms=max(now.ms, now.to_ms(self.due_at)),
            backoff_s=self.backoff_s,
            last_status=self.last_status,
            last_reason=self.last_reason,
        )

    def finish(self, how: UnitEnd) -> None:
        assert self.finished is None, f"{self.id} already {self.finished}"
        self.finished = how


class MessageUnit(Unit):
    """One message. `urls`: each endpoint's URL filled from the message (templated endpoints), or None."""

    __slots__ = ("record", "urls", "records")

    def __init__(self, record: Record, first_read_at: float, due_at: float,
                 urls: tuple[str, ...] | None = None) -> None:
        super().__init__(first_read_at, due_at)
        self.record = record
        self.urls = urls
        self.records = (record,)

    @property
    def anchor(self) -> Record:
        return self.record

    @property
    def id(self) -> str:
        return self.record.message_id

    def id_line(self) -> str:
        return f"Hermes-Message-Id: {self.record.message_id}"

    def body(self, avro: bool) -> bytes:
        return (self.record.avro if avro else self.record.body) or b""

    def schema_lines(self) -> tuple[str, ...]:
        """An AVRO delivery's Schema-Id / Schema-Version lines, when known."""
        record = self.record
        lines = ()
        if record.schema_id is not None:
            lines += (f"Schema-Id: {record.schema_id}",)
        if record.schema_version is not None:
            lines += (f"Schema-Version: {record.schema_version}",)
        return lines

    def url(self, index: int) -> str | None:
        return self.urls[index] if self.urls is not None else None


class Broadcast:
    """A BROADCAST message in flight: one `MemberUnit` per endpoint it has still to reach; it ends when every
    one has, delivered only if none was given up."""

    __slots__ = ("members", "remaining", "failed")

    def __init__(self) -> None:
        self.members: list[MemberUnit] = []
        self.remaining = 0  # members not ended
        self.failed = 0  # members given up

    def member_ended(self, failed: bool) -> UnitEnd | None:
        """One member ended (`failed`: given up). What the message became: None while others have not ended."""
        self.remaining -= 1
        self.failed += failed
        if self.remaining:
            return None
        return UnitEnd.DISCARDED if self.failed else UnitEnd.DELIVERED

    def untouched(self, waiting: list[MemberUnit]) -> bool:
        """No member has ended or been attempted (`waiting`: the members not ended)."""
        return self.remaining == len(self.members) and all(unit.attempts == 0 for unit in waiting)

    @staticmethod
    def state(waiting: list[MemberUnit], now: Instant) -> RetryState:
        """The message's state from its `waiting` members' own: most attempts, earliest due, and each endpoint's."""
        states = [(unit.target, unit.state(now)) for unit in waiting]
        latest = max(states, key=lambda item: item[1].attempts)[1]
        return RetryState(
            attempts=latest.attempts, first_read_ms=latest.first_read_ms, due_ms=min(s.due_ms for _, s in states),
            last_status=latest.last_status, last_reason=latest.last_reason,
            targets=tuple(TargetState(index, s.attempts, s.due_ms, s.backoff_s, s.last_status, s.last_reason)
                          for index, s in sorted(states, key=lambda item: item[0])))


class MemberUnit(MessageUnit):
    """A BROADCAST message at one endpoint (`target`), with its own attempts and backoff."""

    __slots__ = ("group",)
    target_fixed = True

    def __init__(self, record: Record, first_read_at: float, due_at: float, urls: tuple[str, ...] | None,
                 target: int, group: Broadcast) -> None:
        super().__init__(record, first_read_at, due_at, urls)
        self.target = target
        self.group = group

    def end(self, failed: bool) -> UnitEnd | None:
        return self.group.member_ended(failed)


class BatchUnit(Unit):
    """A closed batch of one partition's messages, sent as a JSON array (`herald.delivery.batcher.Batch`)."""

    __slots__ = ("batch", "batch_id", "_body")

    def __init__(self, batch, batch_id: str, first_read_at: float, due_at: float) -> None:
        super().__init__(first_read_at, due_at)
        self.batch = batch
        self.batch_id = batch_id
        self._body = batch.body()

    @property
    def anchor(self) -> Record:
        return self.batch.records[0]

    @property
    def records(self) -> list[Record]:
        return self.batch.records

    @property
    def id(self) -> str:
        return self.batch_id

    def id_line(self) -> str:
        return f"Hermes-Batch-Id: {self.batch_id}"

    def body(self, avro: bool) -> bytes:
        return self._body
