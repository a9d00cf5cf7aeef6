"""One subscription inside a task's delivery loop (a "lane"): its queue, its messages in flight, its flow.

The loop (`herald.delivery.sender`) owns the transport, the clock and the input; a lane owns the rules of its
subscription, from Hermes (`outcome`, `policy`, `flow`):

- it takes the rows its filters passed (`take`), admits them into flight while it has room (`inflightSize`
  share; a message is in flight from then until it is delivered, discarded, parked or carried, retries
  included, so with inflight 1 a partition's messages go out in order);
- it starts attempts that are due, within its hard rate cap and its adaptive controller (`dispatch`), never
  refusing a first attempt for the TTL;
- it classifies each answer and delivers, schedules a retry (backoff or Retry-After) or discards (`answer`);
- at the end (`settle`), what is unfinished either stops the subscription's position (never attempted, or an
  ordered subscription's retry, carried with its state) or is parked with its state (a retry of an unordered
  subscription). Its report says where its position may go: `stops`.

Times are the loop's monotonic seconds (`now`) and wall-clock epoch milliseconds (`now_ms`).
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
from collections import deque
from collections.abc import Callable

from herald.delivery.flow import FlowController, RateCap
from herald.delivery.message import Broadcast, Delivery, Record, RetryState, TargetState
from herald.delivery.oauth import TOKENS, TokenCache, TokenError, Wait
from herald.delivery.outcome import FailureKind, TransportFailure, Verdict, classify
from herald.delivery.plan import LanePlan, Target
from herald.delivery.policy import EndedBy, GiveUp, Retry
from herald.delivery.report import (
    DISCARDED,
    FAILED,
    FILTERED,
    INFLIGHT,
    SUCCESS,
    Carried,
    Discarded,
    LaneReport,
    Parked,
    Traced,
)
from herald.delivery.signing import signature_lines
from herald.delivery.transport import HttpAnswer, HttpRequest
from herald.endpoint import MissingField, fill

StartAttempt = Callable[[HttpRequest, object], None]


class Lane:
    def __init__(self, index: int, plan: LanePlan, now: float, now_ms: int, rng: random.Random,
                 tokens: TokenCache = TOKENS) -> None:
        self.index = index
        self.plan = plan
        self.rng = rng
        self.pending: deque[Record] = deque()  # taken from the input, not yet admitted into flight
        self.in_flight = 0  # admitted and not finished: waiting or open
        self.open = 0  # attempts open now
        self.cut = False  # takes no more input
        self.settled = False  # nothing more happens for this lane in the task
        self.report = LaneReport(cut=False)
        self.counters = self.report.counters
        self.flow = FlowController(plan.rate_per_s, plan.flow_settings, plan.flow_state, now)
        carried_permit = plan.flow_state.next_permit_ms
        next_free = now + (carried_permit - now_ms) / 1000 if carried_permit else float("-inf")
        self.cap = RateCap(self.flow.rate_per_s, next_free)
        self._waiting: list[tuple[float, int, Delivery]] = []  # admitted, not open: by due time
        self._fresh = 0  # waiting deliveries not attempted yet: never, or (parked retries) not in this task
        self._open_first = 0  # open attempts that are the first of their delivery here
        self.settling = False  # starts no more attempts; settles once its open attempts are answered
        self._sequence = itertools.count()
        self._resume = plan.resume
        self._stalled_since: float | None = None
        self._lines = plan.header_lines
        self._targets = plan.targets or (Target(plan.url),)
        self._templated = any(target.templated for target in self._targets)
        self._next_target = 0  # round-robin over the targets, per lane
        self._tokens = tokens
        self._tracing = plan.tracks_all  # records INFLIGHT, FAILED, SUCCESS and FILTERED steps (DISCARDED: the
        # driver, from the discards, for discardedOnly too)

    # -- input ------------------------------------------------------------------------------------------------
    def take(self, record: Record, now_ms: int) -> bool:
        """Offer a row its filters passed; True when the lane keeps it pending (it then holds the row)."""
        if record.offset < self.plan.starts.get(record.partition, -1):
            return False  # already done before this round
        self.counters.matched += 1
        if self._tracing and not (self._resume and (record.partition, record.offset) in self._resume):
            self._trace(record, INFLIGHT, now_ms)  # a resumed message was read in an earlier round
        if record.error is not None:
            self._discard_record(record, f"Message could not be decoded: {record.error}", EndedBy.DECODE, None, 0,
                                 now_ms)
            return False
        self.pending.append(record)
        return True

    def passed_over(self, record: Record, now_ms: int) -> None:
        """A row of the lane's range its filters did not pass (called only when the lane tracks everything)."""
        if record.offset >= self.plan.starts.get(record.partition, -1):
            self._trace(record, FILTERED, now_ms)

    def cut_input(self, progress: dict[int, int]) -> list[Record]:
        """Take no more input: the position stops at the rows not admitted and, in every partition read so far,
        after the last row read (`progress`). Returns the rows it stops holding."""
        self.cut = True
        self.report.cut = True
        dropped = self._leave_pending()
        if self.plan.positional:
            for partition, next_offset in progress.items():
                self._stop(partition, next_offset)
        return dropped

    # -- flight -----------------------------------------------------------------------------------------------
    def admit(self, now: float, now_ms: int) -> list[Record]:
        """Admit pending rows while there is room in flight; returns the rows it stops holding."""
        admitted = []
        while self.pending and self.in_flight < self.plan.inflight:
            record = self.pending.popleft()
            admitted.append(record)
            urls = None
            if self._templated:
                urls = self._fill(record)
                if isinstance(urls, str):
                    self._discard_record(record, urls, EndedBy.TEMPLATE, None, 0, now_ms)
                    continue
            state = self._resume.get((record.partition, record.offset)) if self._resume else None
            if self.plan.broadcast:
                self._admit_broadcast(record, state, urls, now, now_ms)
            else:
                delivery = self._delivery(record, state, now, now_ms)
                delivery.urls = urls
                self._push(delivery)
            self.in_flight += 1
        if admitted:
            self.counters.inflight_peak = max(self.counters.inflight_peak, self.in_flight)
            self._stalled_since = None
        return admitted

    def _delivery(self, record: Record, state, now: float, now_ms: int) -> Delivery:
        """A message entering flight: new (after any sending delay) or continuing from its retry `state`."""
        if state is not None:
            delivery = Delivery.resumed(record, state, now, now_ms)
            if delivery.attempts == 0 or not self.plan.positional:
                self._count_fresh(delivery)  # a parked retry: the round is for trying it
            return delivery
        delay_s = 0.0
        if self.plan.sending_delay_s > 0:
            delay_s = max(0.0, self.plan.sending_delay_s - max(0, now_ms - record.timestamp_ms) / 1000)
        return self._count_fresh(Delivery(record, first_read_at=now, due_at=now + delay_s))

    def _count_fresh(self, delivery: Delivery) -> Delivery:
        """`delivery` is not attempted yet: the lane is not stalled (`stalled`) until it is."""
        delivery.fresh = True
        self._fresh += 1
        return delivery

    def _admit_broadcast(self, record: Record, state, urls, now: float, now_ms: int) -> None:
        """One delivery per endpoint the message has not reached yet (every endpoint, unless it continues)."""
        group = Broadcast()
        if state is not None and state.targets:
            members = [(target.index, state.at_target(target)) for target in state.targets]
        else:
            members = [(index, state) for index in range(len(self._targets))]
        for index, member_state in members:
            delivery = self._delivery(record, member_state, now, now_ms)
            delivery.target, delivery.urls, delivery.group = index, urls, group
            group.members.append(delivery)
            self._push(delivery)
        group.remaining = len(group.members)

    def dispatch(self, now: float, now_ms: int, room: int, start: StartAttempt) -> tuple[float | None, int]:
        """Start due attempts, at most `room` (the transport's free places). Returns (when to look again, or None
        when only an answer can unblock the lane; attempts started)."""
        started = 0
        if self.settling:
            return None, 0
        limit = self.flow.concurrency(self.plan.inflight) * (len(self._targets) if self.plan.broadcast else 1)
        while self._waiting and self.open < limit:
            due_at, _, delivery = self._waiting[0]
            if due_at > now:
                return due_at, started
            if delivery.attempts > 0 and now > self.plan.retry.deadline(delivery.first_read_at):
                heapq.heappop(self._waiting)
                if delivery.fresh:
                    delivery.fresh = False
                    self._fresh -= 1
                self._discard(delivery, delivery.last_reason, EndedBy.TTL, now_ms)
                continue
            if started >= room:
                return now, started
            bearer = None
            if self.plan.oauth is not None:
                try:
                    bearer = self._tokens.token(self.plan.oauth, now)
                except Wait as wait:  # token requests are spaced: the attempt waits, uncounted
                    heapq.heappop(self._waiting)
                    delivery.due_at = wait.at
                    self._push(delivery)
                    continue
                except TokenError as error:  # an ordinary retryable failure of this attempt
                    heapq.heappop(self._waiting)
                    self._begin(delivery)
                    delivery.attempts += 1
                    self.answer(delivery, now, TransportFailure(FailureKind.CONNECTION, str(error)), now, now_ms)
                    continue
            permit_wait_s = self.cap.try_acquire(now)
            if permit_wait_s > 0:
                return now + permit_wait_s, started
            heapq.heappop(self._waiting)
            self._begin(delivery)
            delivery.bearer = bearer
            start(self._request(delivery, now_ms), (self, delivery, now))
            delivery.attempts += 1
            started += 1
        return None, started

    def _begin(self, delivery: Delivery) -> None:
        """An attempt of `delivery` starts (its answer comes to `answer`)."""
        if delivery.fresh:
            delivery.fresh = False
            delivery.opening = True
            self._fresh -= 1
            self._open_first += 1
        self.open += 1
        if delivery.group is not None:
            delivery.group.started = True
        self.counters.attempts += 1

    def answer(self, delivery: Delivery, started_at: float, result, now: float, now_ms: int) -> None:
        """Classify the answer to an attempt and deliver, retry or discard."""
        self.open -= 1
        if delivery.opening:
            delivery.opening = False
            self._open_first -= 1
        if isinstance(result, HttpAnswer):
            outcome = classify(result.status, result.retry_after,
                               retry_client_errors=self.plan.retry.retry_client_errors,
                               oauth=self.plan.oauth is not None, now_epoch_s=now_ms / 1000)
            if self.plan.oauth is not None:
                if result.status == 401:
                    self._tokens.invalidate(self.plan.oauth, delivery.bearer)
                elif 200 <= result.status < 300:
                    self._tokens.delivered(self.plan.oauth)
        else:
            outcome = classify(failure=result)
        counters = self.counters
        category = outcome.category.value
        setattr(counters, category, getattr(counters, category) + 1)
        self.flow.record(outcome.slows, started_at)
        if outcome.verdict is Verdict.DELIVERED:
            delivery.finish("delivered")
            self._delivered(delivery, now_ms)
            return
        delivery.last_status, delivery.last_reason = outcome.status, outcome.reason
        if self._tracing:
            self._trace_failure(delivery, now_ms, outcome.reason, outcome.status)
        step = self.plan.retry.after_failure(outcome, delivery.attempts, delivery.first_read_at, delivery.backoff_s,
                                             now, self.rng)
        if isinstance(step, Retry):
            delivery.due_at, delivery.backoff_s = step.due_at, step.backoff_s
            self._push(delivery)
        else:
            assert isinstance(step, GiveUp)
            self._discard(delivery, step.reason, step.ended_by, now_ms)

    def _delivered(self, delivery: Delivery, now_ms: int) -> None:
        """A 2xx ended `delivery` (for BROADCAST, at one endpoint)."""
        if not self._message_done(delivery, failed=False):
            return
        if delivery.group is not None and delivery.group.failed:
            self._ended_carried(delivery.record, DISCARDED)  # some endpoint's attempts were given up
            return
        self.counters.delivered += 1
        self._ended_carried(delivery.record, SUCCESS)
        if not self.plan.positional:
            self.report.delivered.append((delivery.record.partition, delivery.record.offset))
        if self._tracing:
            self._trace(delivery.record, SUCCESS, now_ms)

    def _ended_carried(self, record: Record, how: str) -> None:
        """A message this lane continued from a carried state ended (SUCCESS or DISCARDED): say so, so that the
        driver ends that state with what really happened."""
        if self._resume and self.plan.positional and (record.partition, record.offset) in self._resume:
            self.report.ended_carried.append((record.partition, record.offset, how))

    def _trace_failure(self, delivery: Delivery, now_ms: int, reason: str, status: int | None) -> None:
        self._trace(delivery.record, FAILED, now_ms, reason, status)

    def input_ended(self, now: float, now_ms: int) -> bool:
        """The task's input is all read; True when that gave the lane something to do at once."""
        return False

    def read_through(self, partition: int, next_offset: int, now: float, now_ms: int) -> bool:
        """The task has read `partition` up to `next_offset` (its rows up to there were offered); True when that
        gave the lane something to do at once."""
        return False

    def adjust(self, now: float) -> None:
        """Let the adaptive controller close its window; the hard cap follows its rate."""
        if self.flow.adjust(now):
            self.cap.set_rate(self.flow.rate_per_s)

    # -- state ------------------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.in_flight == 0 and not self.pending

    def stalled(self, now: float, input_done: bool) -> float | None:
        """Since when nothing but retries can move this lane (every message in flight has been tried, and there
        is no room or no more input coming); None when something else still can."""
        blocked = self.in_flight > 0 and self._fresh == 0 and self._open_first == 0 and (
            (input_done and not self.pending) or self.in_flight >= self.plan.inflight)
        if not blocked:
            self._stalled_since = None
            return None
        if self._stalled_since is None:
            self._stalled_since = now
        return self._stalled_since

    def throttled_s(self, now: float) -> float:
        """Seconds its rate makes its next attempt wait (0 when it has nothing waiting to start, or may start)."""
        if not self._waiting and not self.pending:
            return 0.0
        return max(0.0, self.cap.next_free - now)

    def settle(self, now: float, now_ms: int, progress: dict[int, int], input_done: bool) -> list[Record]:
        """End the lane (no attempt open): stop its position at what was never attempted, carry or park its
        retries. Returns the rows it stops holding."""
        assert self.open == 0, "settle with attempts open"
        dropped = [] if input_done or self.cut else self.cut_input(progress)
        dropped += self._leave_pending()
        retrying: list[tuple[Record, RetryState, list[Delivery]]] = []
        groups: dict[int, list[Delivery]] = {}
        for _, _, delivery in self._waiting:
            if delivery.group is not None:
                groups.setdefault(id(delivery.group), []).append(delivery)
            elif delivery.attempts == 0 and self.plan.positional:
                self._stop(delivery.record.partition, delivery.record.offset)
            else:
                retrying.append((delivery.record, delivery.state(now, now_ms), [delivery]))
        for members in groups.values():
            group, record = members[0].group, members[0].record
            untouched = group.remaining == len(group.members) and all(d.attempts == 0 for d in members)
            if untouched and self.plan.positional:
                self._stop(record.partition, record.offset)
            else:
                retrying.append((record, _broadcast_state(members, now, now_ms), members))
        self._waiting.clear()
        for record, state, deliveries in sorted(retrying, key=lambda unit: (unit[0].partition, unit[0].offset)):
            if self.plan.positional and (self.plan.ordered
                                         or record.offset >= self.report.stops.get(record.partition, math.inf)):
                for delivery in deliveries:
                    delivery.finish("carried")
                self.report.carried.append(Carried(record.partition, record.offset, state))
                self._stop(record.partition, record.offset)
            else:
                for delivery in deliveries:
                    delivery.finish("parked")
                self.report.parked.append(Parked(record, state))
                self.counters.parked += 1
        self.in_flight = 0
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
                self._stop(record.partition, record.offset)
            else:
                state = self._resume.get((record.partition, record.offset))
                if state is not None:
                    self.report.parked.append(Parked(record, state))
                    self.counters.parked += 1
        return dropped

    def _push(self, delivery: Delivery) -> None:
        heapq.heappush(self._waiting, (delivery.due_at, next(self._sequence), delivery))

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

    def _target_of(self, delivery: Delivery) -> int:
        """ANYCAST: a message's first attempt here goes to the next target round-robin, each retry to the next
        one after its last."""
        if delivery.target < 0:
            delivery.target = self._next_target - delivery.attempts
            self._next_target = (self._next_target + 1) % len(self._targets)
        return (delivery.target + delivery.attempts) % len(self._targets)

    def _request(self, delivery: Delivery, now_ms: int) -> HttpRequest:
        """One attempt: the subscription's lines, the target's Authorization, the message id and retry count,
        Avro's schema lines, and the signature of the exact body when the subscription signs (timestamp:
        `now_ms`, in whole seconds)."""
        record = delivery.record
        if delivery.group is not None:
            index = delivery.target
        else:
            index = self._target_of(delivery) if len(self._targets) > 1 else 0
        target = self._targets[index]
        url = delivery.urls[index] if delivery.urls is not None else target.url
        authorization = f"Authorization: Bearer {delivery.bearer}" if delivery.bearer else target.authorization
        lines = self._lines + ((authorization,) if authorization else ()) + (
            f"Hermes-Message-Id: {record.message_id}", f"Hermes-Retry-Count: {delivery.attempts}")
        if self.plan.avro:
            if record.schema_id is not None:
                lines += (f"Schema-Id: {record.schema_id}",)
            if record.schema_version is not None:
                lines += (f"Schema-Version: {record.schema_version}",)
        plan = self.plan
        body = (record.avro if plan.avro else record.body) or b""
        if plan.signing_keys:
            lines += signature_lines(plan.signing_keys, record.message_id, now_ms // 1000, body)
        return HttpRequest(url, lines, body, plan.request_timeout_s, plan.socket_timeout_s, tls=plan.tls)

    def _trace(self, record: Record, status: str, now_ms: int, reason: str | None = None,
               http_status: int | None = None) -> None:
        self.report.traced.append(Traced(record.partition, record.offset, record.message_id, status, now_ms, reason,
                                   http_status))

    def forget_rereads(self) -> None:
        """Forget what a later round records again for the rows at or past where the position stops (it reads
        them again): their INFLIGHT and FILTERED steps, except for messages carried there with their state, and
        the discards of messages never attempted (undecodable, or an endpoint placeholder without a value),
        which would otherwise leave a second undelivered row."""
        stops = self.report.stops
        if not stops:
            return
        report = self.report
        kept = [item for item in report.discarded
                if item.attempts > 0 or item.offset < stops.get(item.partition, math.inf)]
        self.counters.discarded -= len(report.discarded) - len(kept)
        report.discarded[:] = kept
        if not self._tracing:
            return
        carried = {(item.partition, item.offset) for item in self.report.carried}
        self.report.traced[:] = [
            step for step in self.report.traced
            if step.status not in (INFLIGHT, FILTERED) or step.offset < stops.get(step.partition, math.inf)
            or (step.partition, step.offset) in carried]

    def _stop(self, partition: int, offset: int) -> None:
        stops = self.report.stops
        if offset < stops.get(partition, math.inf):
            stops[partition] = offset

    def _message_done(self, delivery: Delivery, failed: bool) -> bool:
        """A delivery ended; True when its message has (for BROADCAST, once its last endpoint's has)."""
        group = delivery.group
        if group is not None:
            group.remaining -= 1
            group.failed += failed
            if group.remaining:
                return False
        self.in_flight -= 1
        return True

    def _discard(self, delivery: Delivery, reason: str, ended_by: str, now_ms: int | None) -> None:
        """Give up a message (for BROADCAST, at one endpoint: one undelivered row per endpoint it missed)."""
        delivery.finish("discarded")
        if self._message_done(delivery, failed=True):
            self._ended_carried(delivery.record, DISCARDED)
        endpoint = self._targets[delivery.target].shown or self._targets[delivery.target].url \
            if delivery.group is not None else None
        self._discard_record(delivery.record, reason, ended_by, delivery.last_status, delivery.attempts, now_ms,
                             endpoint)

    def _discard_record(self, record: Record, reason: str, ended_by: str, status: int | None, attempts: int,
                        now_ms: int | None, endpoint: str | None = None, batch_id: str | None = None) -> None:
        self.counters.discarded += 1
        self.report.discarded.append(Discarded(
            partition=record.partition, offset=record.offset, message_id=record.message_id, reason=reason,
            ended_by=ended_by, http_status=status, attempts=attempts, message=record.body,
            published_ms=record.timestamp_ms, discarded_ms=now_ms or 0, raw_value=record.raw,
            schema_id=record.schema_id, schema_version=record.schema_version, endpoint=endpoint, key=record.key,
            batch_id=batch_id))


def _broadcast_state(members: list[Delivery], now: float, now_ms: int) -> RetryState:
    """A BROADCAST message's state: each unfinished endpoint's own, summed up as most attempts, earliest due."""
    states = [(delivery.target, delivery.state(now, now_ms)) for delivery in members]
    latest = max(states, key=lambda item: item[1].attempts)[1]
    return RetryState(
        attempts=latest.attempts, first_read_ms=latest.first_read_ms, due_ms=min(s.due_ms for _, s in states),
        last_status=latest.last_status, last_reason=latest.last_reason,
        targets=tuple(TargetState(index, s.attempts, s.due_ms, s.backoff_s, s.last_status, s.last_reason)
                      for index, s in sorted(states, key=lambda item: item[0])))
