"""One subscription inside a task's delivery loop (a "lane"): its queue, its units in flight, its flow.

The loop (`herald.delivery.sender`) owns the transport, the clock and the input; a lane owns the rules of its
subscription, from Hermes (`outcome`, `policy`, `flow`), the same for every delivery shape:

- it takes the rows its filters passed (`take`) and admits them into flight while its assembly has room
  (`herald.delivery.assembly`: one unit per message within the `inflightSize` share, or BATCH's batches).
  A message is in flight from then until it is delivered, discarded, parked or carried, retries included, so
  with inflight 1 a partition's messages go out in order;
- it starts attempts of due units, within its hard rate cap and its adaptive controller (`dispatch`), never
  refusing a first attempt for the TTL; each attempt goes to the endpoint its strategy picks
  (`herald.delivery.choice`: one endpoint, ANYCAST round-robin, overflow, or BROADCAST's every endpoint; a
  pinned endpoint's answers are watched, `herald.delivery.pin`);
- it classifies each answer and delivers, schedules a retry (backoff or Retry-After) or discards (`answer`);
- at the end (`settle`), what is unfinished either stops the subscription's position (never attempted, or an
  ordered subscription's retry or a batch, carried with its state) or is parked with its state (a retry of an
  unordered subscription). Its report says where its position may go: `stops`.

What a unit sends and what its end means is the unit's (`herald.delivery.unit`). `now` is the loop's
`herald.delivery.clock.Instant`: times kept and compared are its monotonic seconds, rows say its epoch ms.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable

from herald.delivery.assembly import Refused, Stuck, assembly_for
from herald.delivery.choice import endpoint_choice
from herald.delivery.clock import Instant
from herald.delivery.flow import MAX_TURNS_RATE_PER_S, FlowController, RateCap, Turns
from herald.delivery.message import Record
from herald.delivery.oauth import TOKENS, TokenCache, TokenError, Wait
from herald.delivery.outcome import TransportFailure, Verdict, classify
from herald.delivery.pin import PinWatch
from herald.delivery.plan import LanePlan, Target
from herald.delivery.policy import EndedBy, GiveUp, Retry
from herald.delivery.report import DISCARDED, FAILED, FILTERED, INFLIGHT, SUCCESS, Carried, LaneReport, Parked
from herald.delivery.signing import signature_lines
from herald.delivery.transport import HttpAnswer, HttpRequest
from herald.delivery.unit import Unit, UnitEnd

StartAttempt = Callable[[HttpRequest, object], None]


class Lane:
    def __init__(self, index: int, plan: LanePlan, now: Instant, rng: random.Random, tokens: TokenCache = TOKENS,
                 flush: bool = False) -> None:
        self.index = index
        self.plan = plan
        self.rng = rng
        self.pending: deque[Record] = deque()  # taken from the input, not yet admitted into flight
        self.open = 0  # attempts open now
        self.cut = False  # takes no more input
        self.settled = False  # nothing more happens for this lane in the task
        self.report = LaneReport(cut=False)
        self.counters = self.report.counters
        self.flow = FlowController(plan.rate_per_s, plan.flow_settings, plan.flow_state, now.s)
        carried_permit = plan.flow_state.permit_in_ms  # ms from now: only durations cross hosts
        whole_rate = self.flow.rate_per_s * plan.rate_tasks  # the subscription's, as the controller starts it
        turns = Turns.at(1.0 / whole_rate, plan.rate_tasks, plan.rate_turn, now.s, now.ms) \
            if plan.rate_tasks > 1 and whole_rate <= MAX_TURNS_RATE_PER_S * (1 + 1e-9) else None
        self.cap = RateCap(self.flow.rate_per_s, now.s + carried_permit / 1000 if carried_permit else float("-inf"),
                           turns)
        self._waiting: list[tuple[float, int, Unit]] = []  # ready units, not open: by due time
        self._fresh = 0  # units not attempted yet: never, or (parked retries) not in this task
        self._open_first = 0  # open attempts that are the first of their unit here
        # settling: starts no more attempts; settles once its open attempts are answered, or aborted by the loop
        # when `TaskPlan.request_grace_s` runs out (each then a timeout)
        self.settling = False
        self._sequence = itertools.count()
        self._resume = plan.resume
        self._stalled_since: float | None = None
        self._lines = plan.header_lines
        self._targets = plan.targets or (Target(plan.url),)
        self._tokens = tokens
        self._tracing = plan.tracks_all  # records INFLIGHT, FAILED, SUCCESS and FILTERED steps (DISCARDED: the
        # driver, from the discards, for discardedOnly too)
        self.choice = endpoint_choice(self._targets, plan.broadcast, self._load, plan.departed)
        self.assembly = assembly_for(plan, self._targets, self.choice, self, flush)
        self._batched = self.assembly.tracks_reads  # batches close on time: dispatch looks at their times
        self.pin = PinWatch(plan.pin) if plan.pin is not None else None  # priority pinned: the endpoint's answers

    def _load(self) -> tuple[int, int]:
        """(pending, in flight) for overflow endpoints: the subscription's pending messages when the round was
        planned less those this lane ended since, and the messages this lane holds in flight."""
        ended = self.counters.delivered + self.counters.discarded
        return max(0, self.plan.pending - ended), self.assembly.in_flight

    # -- what the assembly says -------------------------------------------------------------------------------
    def created(self, unit: Unit) -> None:
        """A unit exists: while it is fresh (not attempted here yet), the lane is not stalled."""
        if unit.fresh:
            self._fresh += 1

    def ready(self, unit: Unit) -> None:
        """A unit may be attempted from its due time."""
        heapq.heappush(self._waiting, (unit.due_at, next(self._sequence), unit))

    @property
    def in_flight(self) -> int:
        """Messages (BATCH: batches) admitted and not ended."""
        return self.assembly.in_flight

    @property
    def tracks_reads(self) -> bool:
        """It wants to know how far each partition has been read (`read_through`)."""
        return self.assembly.tracks_reads

    # -- input ------------------------------------------------------------------------------------------------
    def take(self, record: Record, now: Instant) -> bool:
        """Offer a row its filters passed; True when the lane keeps it pending (it then holds the row)."""
        if record.offset < self.plan.starts.get(record.partition, -1):
            return False  # already done before this round
        self.counters.matched += 1
        if self._tracing and not (self._resume and (record.partition, record.offset) in self._resume):
            self.report.trace(record, INFLIGHT, now.ms)  # a resumed message was read in an earlier round
        if record.error is not None:
            self.report.discard(record, f"Message could not be decoded: {record.error}", EndedBy.DECODE, None, 0,
                                 now.ms)
            return False
        self.pending.append(record)
        return True

    def passed_over(self, record: Record, now: Instant) -> None:
        """A row of the lane's range its filters did not pass (called only when the lane tracks everything)."""
        if record.offset >= self.plan.starts.get(record.partition, -1):
            self.report.trace(record, FILTERED, now.ms)

    def cut_input(self, progress: dict[int, int]) -> list[Record]:
        """Take no more input: the position stops at the rows not admitted and, in every partition read so far,
        after the last row read (`progress`). Returns the rows it stops holding."""
        self.cut = True
        self.report.cut = True
        dropped = self._leave_pending()
        if self.plan.positional:
            for partition, next_offset in progress.items():
                self.report.stop(partition, next_offset)
        return dropped

    def read_through(self, partition: int, next_offset: int) -> bool:
        """The task has read `partition` up to `next_offset` (its rows up to there were offered); True when that
        gave the lane something to do at once (a rebuilt batch closes at its last offset)."""
        return self.assembly.read_through(partition, next_offset)

    def input_ended(self, now: Instant) -> bool:
        """The task's input is all read; True when that gave the lane something to do at once (a --once run's
        filling batches go out)."""
        if self.settled or self.settling or self.pending:
            return False
        return self.assembly.input_ended(now)

    # -- flight -----------------------------------------------------------------------------------------------
    def admit(self, now: Instant) -> list[Record]:
        """Admit pending rows while the assembly has room; returns the rows it stops holding."""
        admitted = []
        while self.pending:
            record = self.pending[0]
            placed = self.assembly.place(record, now)
            if placed is False:
                break  # no room (BATCH: its partition has a batch in flight and the next one full; in order)
            admitted.append(self.pending.popleft())
            if isinstance(placed, Refused):
                self.report.discard(record, placed.reason, placed.ended_by, None, 0, now.ms)
        if not self.pending:
            self.assembly.placed_all(now)
        if admitted:
            self.counters.inflight_peak = max(self.counters.inflight_peak, self.assembly.held)
            self._stalled_since = None
        return admitted

    def dispatch(self, now: Instant, room: int, start: StartAttempt) -> tuple[float | None, int]:
        """Start due attempts, at most `room` (the transport's free places). Returns (when to look again, in
        monotonic seconds, or None when only an answer can unblock the lane; attempts started)."""
        if self.settling:
            return None, 0
        if not self._batched:
            return self._start_due(now, room, start)
        self.assembly.close_due(now)
        wake_at, started = self._start_due(now, room, start)
        close_at = self.assembly.next_close()
        if close_at is not None and (wake_at is None or close_at < wake_at):
            wake_at = close_at
        return wake_at, started

    def _start_due(self, now: Instant, room: int, start: StartAttempt) -> tuple[float | None, int]:
        at = now.s
        started = 0
        limit = self.flow.concurrency(self.plan.inflight) * self.choice.width
        while self._waiting and self.open < limit:
            due_at, _, unit = self._waiting[0]
            if due_at > at:
                return due_at, started
            if unit.attempts > 0 and at > self.plan.retry.deadline(unit.first_read_at):
                heapq.heappop(self._waiting)
                if unit.fresh:
                    unit.fresh = False
                    self._fresh -= 1
                self._end(unit, now, failure=(unit.last_reason, EndedBy.TTL))
                continue
            if started >= room:
                return at, started
            bearer = None
            if self.plan.oauth is not None:
                try:
                    bearer = self._tokens.token(self.plan.oauth, at)
                except Wait as wait:  # token requests are spaced: the attempt waits, uncounted
                    heapq.heappop(self._waiting)
                    unit.due_at = wait.at
                    self.ready(unit)
                    continue
                except TokenError as error:  # an ordinary retryable failure of this attempt
                    heapq.heappop(self._waiting)
                    self._begin(unit)
                    unit.attempts += 1
                    self.answer(unit, at, TransportFailure(error.kind, str(error)), now)
                    continue
            permit_wait_s = self.cap.try_acquire(at)
            if permit_wait_s > 0:
                return at + permit_wait_s, started
            heapq.heappop(self._waiting)
            self._begin(unit)
            unit.bearer = bearer
            start(self._request(unit, now), (self, unit, at))
            unit.attempts += 1
            started += 1
        return None, started

    def _begin(self, unit: Unit) -> None:
        """An attempt of `unit` starts (its answer comes to `answer`)."""
        if unit.fresh:
            unit.fresh = False
            unit.opening = True
            self._fresh -= 1
            self._open_first += 1
        self.open += 1
        self.counters.attempts += 1

    def _request(self, unit: Unit, now: Instant) -> HttpRequest:
        """One attempt: the subscription's lines, the endpoint's Authorization (or the OAuth bearer), the unit's
        id and retry count, an AVRO message's schema lines, and the signature of the exact body when the
        subscription signs (timestamp: `now` on the wall clock, in whole epoch seconds)."""
        plan = self.plan
        index = self.choice.pick(unit)
        target = self._targets[index]
        authorization = f"Authorization: Bearer {unit.bearer}" if unit.bearer else target.authorization
        lines = self._lines + ((authorization,) if authorization else ()) + (
            unit.id_line(), f"Hermes-Retry-Count: {unit.attempts}")
        if plan.avro:
            lines += unit.schema_lines()
        body = unit.body(plan.avro)
        if plan.signing_keys:
            lines += signature_lines(plan.signing_keys, unit.id, now.ms // 1000, body)
        return HttpRequest(unit.url(index) or target.url, lines, body, plan.request_timeout_s,
                           plan.socket_timeout_s, tls=plan.tls)

    def answer(self, unit: Unit, started_at: float, result, now: Instant) -> None:
        """Classify the answer to an attempt (begun at `started_at`, in seconds) and deliver, retry or discard."""
        self.open -= 1
        if unit.opening:
            unit.opening = False
            self._open_first -= 1
        if isinstance(result, HttpAnswer):
            outcome = classify(result.status, result.retry_after,
                               retry_client_errors=self.plan.retry.retry_client_errors,
                               oauth=self.plan.oauth is not None, now_epoch_s=now.ms / 1000)
            if self.plan.oauth is not None:
                if result.status == 401:
                    self._tokens.invalidate(self.plan.oauth, unit.bearer)
                elif 200 <= result.status < 300:
                    self._tokens.delivered(self.plan.oauth)
        else:
            outcome = classify(failure=result)
        if self.pin is not None:  # refused for its timeout: the lane starts nothing more, the driver unpins it
            self.settling |= self.pin.answer(outcome.verdict is Verdict.DELIVERED, now.ms)
            self.report.pin_news = self.pin.news()
        counters = self.counters
        category = outcome.category.value
        setattr(counters, category, getattr(counters, category) + 1)
        self.flow.record(outcome.slows, started_at)
        if outcome.verdict is Verdict.DELIVERED:
            self._end(unit, now)
            return
        unit.last_status, unit.last_reason = outcome.status, outcome.reason
        if self._tracing:
            for record in unit.records:
                self.report.trace(record, FAILED, now.ms, outcome.reason, outcome.status)
        step = self.plan.retry.after_failure(outcome, unit.attempts, unit.first_read_at, unit.backoff_s, now.s,
                                             self.rng)
        if isinstance(step, Retry):
            unit.due_at, unit.backoff_s = step.due_at, step.backoff_s
            self.ready(unit)
        else:
            assert isinstance(step, GiveUp)
            self._end(unit, now, failure=(step.reason, step.ended_by))

    def _end(self, unit: Unit, now: Instant, failure: tuple[str, str] | None = None) -> None:
        """`unit` ended: delivered, or given up with `failure` (reason, ended_by: an undelivered row for each
        of its messages; for a BROADCAST member, naming the endpoint it missed). Its message(s) end with it,
        or (BROADCAST) with the last member: delivered only if no member was given up."""
        unit.finish(UnitEnd.DELIVERED if failure is None else UnitEnd.DISCARDED)
        became = unit.end(failed=failure is not None)
        self.assembly.ended(unit, became is not None)
        if failure is not None:
            target = self._targets[unit.target] if unit.target_fixed else None
            endpoint = (target.shown or target.url) if target is not None else None
            for record in unit.records:
                self.report.discard(record, failure[0], failure[1], unit.last_status, unit.attempts, now.ms,
                                     endpoint, unit.batch_id)
        if became is None:
            return
        self._ended_carried(unit.anchor, SUCCESS if became is UnitEnd.DELIVERED else DISCARDED)
        if unit.batch_id is not None:
            if became is UnitEnd.DELIVERED:
                self.counters.batches_delivered += 1
            else:
                self.counters.batches_discarded += 1
        if became is not UnitEnd.DELIVERED:
            return
        records = unit.records
        self.counters.delivered += len(records)
        if not self.plan.positional:
            self.report.delivered.extend((record.partition, record.offset) for record in records)
        if self._tracing:
            for record in records:
                self.report.trace(record, SUCCESS, now.ms)

    def _ended_carried(self, record: Record, how: str) -> None:
        """A message (batch) this lane continued from a carried state ended (SUCCESS or DISCARDED): say so, so
        that the driver ends that state with what really happened."""
        if self._resume and self.plan.positional and (record.partition, record.offset) in self._resume:
            self.report.ended_carried.append((record.partition, record.offset, how))

    def adjust(self, now: Instant) -> None:
        """Let the adaptive controller close its window; the hard cap follows its rate."""
        if self.flow.adjust(now.s):
            self.cap.set_rate(self.flow.rate_per_s)

    # -- state ------------------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return not self.pending and self.assembly.empty

    def stalled(self, now: Instant, input_done: bool) -> float | None:
        """Since when (monotonic seconds) nothing but retries (and batches waiting for their time) can move this
        lane: every unit in flight has been tried, and no more input comes or there is no room; -inf when it may
        settle at once; None when something else still can move it."""
        how = None if self._fresh or self._open_first else self.assembly.stuck(input_done, bool(self.pending))
        if how is None:
            self._stalled_since = None
            return None
        if how is Stuck.FILLING:
            return -math.inf  # only filling batches: carry them now rather than hold the round
        if self._stalled_since is None:
            self._stalled_since = now.s
        return self._stalled_since

    def throttled_s(self, now: Instant) -> float:
        """Seconds its rate makes its next attempt wait (0 when it has nothing waiting to start, or may start)."""
        if not self._waiting and not self.pending:
            return 0.0
        return self.cap.wait(now.s)  # its share of the rate: its spacing, and its turn among the round's tasks

    def settle(self, now: Instant, progress: dict[int, int], input_done: bool) -> list[Record]:
        """End the lane (no attempt open): stop its position at what was never attempted, carry or park what is
        unfinished. Returns the rows it stops holding."""
        assert self.open == 0, "settle with attempts open"
        dropped = [] if input_done or self.cut else self.cut_input(progress)
        dropped += self._leave_pending()
        leftovers = self.assembly.leftovers((unit for _, _, unit in self._waiting), now)
        self._waiting.clear()
        positional = self.plan.positional
        retrying = []
        for leftover in leftovers:
            if leftover.untouched and positional and not leftover.always_carried:
                self.report.stop(leftover.record.partition, leftover.record.offset)
            else:
                retrying.append(leftover)
        for leftover in sorted(retrying, key=lambda item: (item.record.partition, item.record.offset)):
            record = leftover.record
            if positional and (leftover.always_carried or self.plan.ordered
                               or record.offset >= self.report.stops.get(record.partition, math.inf)):
                for unit in leftover.units:
                    unit.finish(UnitEnd.CARRIED)
                self.report.carried.append(Carried(record.partition, record.offset, leftover.state))
                self.report.stop(record.partition, record.offset)
            else:
                for unit in leftover.units:
                    unit.finish(UnitEnd.PARKED)
                self.report.parked.append(Parked(record, leftover.state))
                self.counters.parked += 1
        self._fresh = 0
        self.settled = True
        return dropped

    # -- helpers ----------------------------------------------------------------------------------------------
    def _leave_pending(self) -> list[Record]:
        """Give up the rows never admitted: the position stops at them, or (outside any position) they are
        parked again as they came."""
        dropped = list(self.pending)
        self.pending.clear()
        for record in dropped:
            if self.plan.positional:
                self.report.stop(record.partition, record.offset)
            else:
                state = self._resume.get((record.partition, record.offset))
                if state is not None:
                    self.report.parked.append(Parked(record, state))
                    self.counters.parked += 1
        return dropped
