"""Catch-up: a subscription behind its topic's shared query reads its own range and delivers it alone.

A subscription falls behind when it is new with `earliest`, re-activated after a suspension, moved by an
operator, or stopped early at a batch deadline (slow, failing or rate-limited). A `CatchUp` thread per topic
then runs rounds for it: a bounded read (`streaming.maxOffsetsPerTrigger` records at most) of [its position,
the query's position), through the same projection and senders as the shared query, in at most half the
cluster's cores so the shared query keeps the rest. Subscriptions whose positions are within one read of each
other share the read. Once a subscription reaches the query's position between two micro-batches it rejoins
the query. An ordered subscription stopped at a message whose retry is not due yet waits for it without
running empty rounds, as a BATCH subscription stopped at its open batch waits for its batchTime or for enough
new records to fill it. More generally, a round that could do nothing for a subscription (no attempt, no
position moved: its only in-flight slot held by a message whose retry is not due, an open batch that fewer
messages than its size pass the filters of) is not run again until something can change that: new records, the
earliest due time of what it carries, its rate's next permit, or at the latest `IDLE_RECHECK_MS`. A round that
fails (a Kafka read, a schema registry that cannot answer) leaves its subscriptions where they were and is tried
again after `failure_backoff_s`: 2, 4 ... 60 s while the rounds keep failing.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

from herald.delivery.flow import FlowMode
from herald.engine.context import now_ms
from herald.engine.round import steps
from herald.engine.round.fanout import Participant
from herald.engine.round.owner import Round, TopicRound
from herald.engine.round.positions import Lost, behind, catch_up_ranges, earliest
from herald.engine.round.result import CATCHUP, RoundResult, SubscriptionOutcome
from herald.engine.round.state import SubscriptionState
from herald.engine.triggers.supervision import outage, short_error
from herald.source.kafka_offsets import partition_watermarks
from herald.source.stream import read_kafka_range

log = logging.getLogger(__name__)

THROTTLED_ROWS = 100
"""Most records a catch-up round reads for a subscription flow control slowed (SLOW: one a second; HEARTBEAT: one
probe a minute): it sends a probe or a few, and reading the whole maxOffsetsPerTrigger for them cost a Spark job
of 10,000 records a minute per failing subscriber beside the healthy ones (tests/benchmarks/README.md, soak)."""

_IDLE_S = 0.5
FIRST_FAILURE_BACKOFF_S = 2.0
MAX_FAILURE_BACKOFF_S = 60.0
IDLE_RECHECK_MS = 10_000
_ROUND_IDS = itertools.count(1)
"""Catch-up round ids, unique in the process: a topic's rounds are written as `catchup:<run>:<topic>`, and a
topic started again in the run (a new pipeline after an edit or a failure) must never reuse a round id, or its
round would replace the earlier round's rows (its undelivered and parked messages) in the tables."""


class CatchUp:
    def __init__(self, pipeline) -> None:
        self.pipeline = pipeline
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"herald-catchup-{pipeline.kafka_topic}", daemon=True)
        self.error: BaseException | None = None
        self._failures = 0  # its rounds that failed in a row

    def start(self) -> None:
        self._thread.start()

    @staticmethod
    def next_round_id() -> int:
        """The id its next round is written under (`_ROUND_IDS`)."""
        return next(_ROUND_IDS)

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.round()
                if worked:
                    self.pipeline.round_succeeded()
                    self._failures = 0
            except Exception as error:  # noqa: BLE001 - logged; the subscriptions stay behind and are retried
                self._failures += 1
                backoff_s = failure_backoff_s(self._failures)
                reason = short_error(error)
                if outage(reason):  # expected, and retried: one line
                    log.warning("%s: catch-up round failed, tried again in %.0f s: %s", self.pipeline.kafka_topic,
                                backoff_s, reason)
                else:
                    log.exception("%s: catch-up round failed, tried again in %.0f s", self.pipeline.kafka_topic,
                                  backoff_s)
                self.error = error
                self.pipeline.failed_rounds += 1
                self.pipeline.round_error = f"catch-up: {reason}"
                worked = False
                self._stop.wait(backoff_s)
            if not worked:
                self._wake.wait(_IDLE_S)
                self._wake.clear()

    # -- one round ----------------------------------------------------------------------------------------------
    def _group(self) -> tuple[list[SubscriptionState], dict[int, tuple[int, int]]] | None:
        """Choose the subscriptions of the next round and its ranges (lock held); None when there is none."""
        pipeline = self.pipeline
        frontier = pipeline.frontier
        if frontier is None:
            return None
        now = now_ms()
        ready = []
        for state in pipeline.states.values():
            if not state.catching_up or state.busy or pipeline.context.holds(state.id):
                continue  # (held: its pin changes hands, or it has no endpoint; what ends that wakes catch-up)
            if state.idle is not None:
                seen, wake_ms = state.idle
                if seen == frontier and now < wake_ms:
                    continue  # its last round could do nothing, and nothing has changed since
                state.idle = None
            if not behind(state.positions, frontier):
                if not pipeline.batch_in_progress:
                    state.catching_up = False  # it rejoins the shared query
                    log.info("%s caught up with the shared query", state.id)
                continue
            if _waiting_for_retry(state, now, frontier) or state.flow.next_permit_ms > now + 50:
                continue  # nothing can move before then (a retry's due time, or its rate's next permit)
            ready.append(state)
        if not ready:
            return None
        max_rows = pipeline.context.config.settings.streaming.maxOffsetsPerTrigger or 10_000
        leader = min(ready, key=lambda state: state.last_served_s)
        if leader.flow.mode is not FlowMode.NORMAL:  # a probe or a few: a round reads what it can send (and skip)
            max_rows = min(max_rows, THROTTLED_ROWS)
        window = catch_up_ranges(leader.positions, frontier, max_rows)
        group = [state for state in ready if state is leader or _within(state.positions, window)]
        starts = earliest(*(_clamped(state.positions, frontier) for state in group))
        ranges = catch_up_ranges(starts, frontier, max_rows)
        for state in group:
            state.busy = True
        return group, ranges, dict(frontier)

    def round(self) -> bool:
        """Run one catch-up round (`CatchUpRound`); False when no subscription needs one now."""
        return Round(self.pipeline.context, CatchUpRound(self)).run() is not None

    def _within_retention(self, ranges: dict[int, tuple[int, int]]) -> tuple[dict[int, tuple[int, int]], Lost]:
        """`within_log` of Kafka's watermarks now."""
        pipeline = self.pipeline
        marks = partition_watermarks(pipeline.context.client_config, [pipeline.kafka_topic])[pipeline.kafka_topic]
        return within_log(ranges, marks)


def within_log(ranges: dict[int, tuple[int, int]],
               marks: dict[int, tuple[int, int]]) -> tuple[dict[int, tuple[int, int]], Lost]:
    """(the ranges to read, the offsets of them already deleted), within Kafka's log (`marks`: partition -> (low,
    high)): a range that starts below what Kafka still holds is read from its earliest offset, and what is below
    is lost (recorded by the round); one that ends past Kafka's end is read to that end, as the offsets past it
    are not there (yet: the topic created again, or its log cut, since the frontier was set), and a round that
    read a range to its end moves the positions there. A partition Kafka does not list (the topic created again
    with fewer) is not read: its position stays."""
    clamped, deleted = {}, []
    for partition, (start, end) in ranges.items():
        if partition not in marks:
            continue
        low, high = marks[partition]
        end = min(end, high)
        if start < low:
            deleted.append((partition, start, min(low, end)))
        clamped[partition] = (min(max(start, low), end), end)
    return clamped, deleted


class CatchUpRound(TopicRound):
    """One catch-up round of `catchup`'s topic (`herald.engine.round.owner.Round` runs it): the group `_group`
    chose, its ranges read from Kafka (within what Kafka still holds) and delivered in Spark tasks of its own."""

    def __init__(self, catchup: CatchUp) -> None:
        super().__init__(catchup.pipeline)
        self.catchup = catchup

    def choose(self) -> list[Participant] | None:
        """(None, too, when every one of the group is held: a pin changing hands; the switch wakes catch-up)"""
        pipeline = self.pipeline
        with pipeline.lock:
            chosen = self.catchup._group()
            if chosen is None:
                return None
            self.group, self.ranges, self.frontier = chosen
            self.topic_id = pipeline.topic_id  # its positions are in this log (a reset found meanwhile waits for it)
            self.before = {state.id: dict(state.positions) for state in self.group}
            return steps.participants(pipeline.context, enumerate(self.group), pipeline.retries.parked_count) or None

    def deliver(self, participants: list[Participant]) -> list[SubscriptionOutcome]:
        pipeline, context = self.pipeline, self.pipeline.context
        self.ranges, deleted = self.catchup._within_retention(self.ranges)
        with context.catchup_slots:
            settings = context.config.settings
            raw = read_kafka_range(context.spark, context.connector, settings.kafka.bootstrapServers,
                                   settings.kafka.properties, pipeline.kafka_topic,
                                   {p: start for p, (start, _) in self.ranges.items()},
                                   {p: end for p, (_, end) in self.ranges.items()})
            return steps.deliver(context, pipeline.topic, [state.subscription for state in self.group], participants,
                                 raw, self.ranges, max_tasks=max(1, context.parallelism // 2), shared=False,
                                 known_lost=deleted)

    def take(self, participants: list[Participant], results: list[SubscriptionOutcome]) -> int:
        pipeline = self.pipeline
        with pipeline.lock:
            stamp = pipeline.apply(participants, results, self.topic_id)
            try:  # its outcome is taken: nothing here may keep it from being recorded
                _after_round(pipeline, self.group, results, self.before, self.frontier)
            except Exception:  # noqa: BLE001 - bookkeeping of when to run again; the round is recorded
                log.exception("%s catch-up: after its round", pipeline.kafka_topic)
        return stamp

    def result(self, results: list[SubscriptionOutcome]) -> RoundResult:
        pipeline, context = self.pipeline, self.pipeline.context
        self.batch_id = self.catchup.next_round_id()
        return RoundResult(CATCHUP, f"catchup:{context.run_id}:{pipeline.kafka_topic}", self.batch_id,
                           pipeline.kafka_topic, context.cluster, results, self.topic_id)

    def after(self, results: list[SubscriptionOutcome], started: float) -> None:
        pipeline = self.pipeline
        pipeline.flush_moves()
        log.info("%s catch-up round %d: %s, %d record(s) in %.1f s", pipeline.kafka_topic, self.batch_id,
                 ", ".join(state.id for state in self.group), sum(e - s for s, e in self.ranges.values()),
                 time.monotonic() - started)


def failure_backoff_s(failures: int) -> float:
    """Seconds to wait after `failures` (1 or more) catch-up rounds in a row failed: 2, 4, 8 ... 60."""
    return min(FIRST_FAILURE_BACKOFF_S * 2 ** (failures - 1), MAX_FAILURE_BACKOFF_S)


def _after_round(pipeline, group: list[SubscriptionState], results, before: dict, frontier) -> None:
    """(lock held) When the group's subscriptions run again: idle until something can change for those the round
    could do nothing for, catching up again for those the query moved past during the round."""
    for state in group:
        state.last_served_s = time.monotonic()
    for result in results:
        state = next(state for state in group if state.id == result.subscription.id)
        if not _acted(result, before[state.id], state.positions):
            state.idle = (frontier, _wake_ms(state))
    for state in group:  # the query may have moved on (or restarted) during the round
        if pipeline.frontier is not None and behind(state.positions, pipeline.frontier):
            state.catching_up = True


def _acted(result, before: dict[int, int], after: dict[int, int]) -> bool:
    """Whether a catch-up round did anything for a subscription: an attempt, a discard, a lost range recorded,
    or a position moved."""
    counters = result.counters
    return bool(counters.attempts or counters.discarded or result.lost
                or any(after.get(p, offset) != offset for p, offset in before.items()))


def _wake_ms(state: SubscriptionState) -> int:
    """When a subscription whose round could do nothing may be able to (epoch ms): the earliest due time of what
    it carries (a retry, a batch's batchTime), its rate's next permit, or `IDLE_RECHECK_MS` from now."""
    now = now_ms()
    times = [carried.due_ms for carried in state.live_carried().values() if carried.due_ms > now]
    if state.flow.next_permit_ms > now:
        times.append(state.flow.next_permit_ms)
    return min([*times, now + IDLE_RECHECK_MS])


def _within(positions: dict[int, int], window: dict[int, tuple[int, int]]) -> bool:
    """True when a subscription's positions fall inside another's next read (they can share it)."""
    return all(start <= positions.get(p, end) <= end for p, (start, end) in window.items())


def _clamped(positions: dict[int, int], frontier: dict[int, int]) -> dict[int, int]:
    return {p: min(positions.get(p, end), end) for p, end in frontier.items()}


def _waiting_for_retry(state: SubscriptionState, now: int, frontier: dict[int, int]) -> bool:
    """Nothing can move yet: in every partition it is behind in, its position stops at a carried message whose
    next attempt is not due yet (ordered), or, BATCH, at a batch still open that neither its batchTime nor
    enough new records can close yet. A partition behind with nothing carried there can move at once."""
    spec = state.subscription.delivery_spec
    carried = state.live_carried()
    if not carried or not spec.ordered:
        return False
    behind_in = [p for p, end in frontier.items() if state.positions.get(p, end) < end]

    def waits(partition: int) -> bool:
        position = state.positions[partition]
        held = carried.get((partition, position))
        if held is None or held.due_ms <= now:
            return False
        open_batch = spec.batch is not None and held.attempts == 0 and held.batch_last_offset is None
        return not (open_batch and frontier[partition] - position >= spec.batch.size)

    return bool(behind_in) and all(waits(p) for p in behind_in)
