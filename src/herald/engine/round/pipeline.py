"""One Kafka topic: the states of its ACTIVE subscriptions, and the rounds that deliver its records to them.

The job's shared read (`herald.engine.triggers.shared_read`) reads every topic in one streaming query; each
micro-batch's range of a topic is read once, decoded once and filtered once for every subscription of the topic
(`projection`), then delivered in one job (`fanout`) for the subscriptions whose position is the read's
(`deliver_batch`). A subscription that is behind (new with `earliest`, re-activated, stopped early at a batch
deadline, moved by an operator) is left out and catches up on its own (`catchup`); it rejoins the shared read once it
reaches the read's position in the topic (the frontier). The topic's lock guards the states; a round marks its
subscriptions busy while it delivers.

The read's offsets are Spark's checkpoint; the subscriptions' positions are the offsets table. A read that
starts afresh starts a topic at its frontier or, new to the read, at the highest position of its subscriptions;
those behind it catch up.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from herald.config import Subscription
from herald.config.model import Topic
from herald.delivery.report import SUCCESS, Parked
from herald.engine.context import EngineContext, now_ms, stamp_ms
from herald.engine.round import steps
from herald.engine.round.batch import BatchRound
from herald.engine.round.fanout import Participant
from herald.engine.round.positions import behind
from herald.engine.round.resets import PendingReset, TopicReset, find_reset, known_ends, reset_subscription, went_back
from herald.engine.round.result import (
    SubscriptionOutcome,
    moved_rows,
    parked_discard_tables,
    reset_tables,
    reset_writer,
    stub,
)
from herald.engine.round.state import SubscriptionState
from herald.engine.upkeep import moves
from herald.source.kafka_offsets import partition_watermarks
from herald.storage import Slice
from herald.storage.tables import DELIVERED, DISCARDED, OFFSETS, RELEASED

log = logging.getLogger(__name__)


class TopicPipeline:
    """`retries`: the retry driver (`herald.engine.triggers.retry_driver.RetryDriver`): it gets the rounds' parked
    messages and says how many of a subscription's in-flight slots they hold."""

    def __init__(self, context: EngineContext, topic: Topic, states: Iterable[SubscriptionState], retries) -> None:
        self.context = context
        self.retries = retries
        self.topic = topic
        self.kafka_topic = topic.kafka_topic
        self.lock = threading.RLock()
        self.states: dict[str, SubscriptionState] = {state.id: state for state in states}
        self.frontier: dict[int, int] | None = None  # where the shared read is in the topic: its last batch's end
        self.topic_id: str | None = None  # Kafka's id of the topic the frontier is in, when known
        self.cuts: dict[int, int] = {}  # per partition, times `check_log` lowered the frontier to Kafka's log
        # partitions Kafka no longer lists (the topic created again with fewer) -> the end the read had there
        self.unlisted: dict[int, int] = {}
        # (topic id, cuts) when the read's last micro-batch ended (or the read started): a micro-batch planned on
        # the log before a `check_log` since then may have read the old log (`batch_ended`)
        self._log_at_last_batch: tuple[str | None, dict[int, int]] = (None, {})
        self._held: dict[int, int] = {}  # partitions `batch_ended` held at `check_log`'s frontier -> the batch's end
        self._batches_ended = 0  # `batch_ended` calls: `settle_frontier` moves only the latest one's held ends
        self.batch_in_progress = False
        # (slice, stamp -> its tables, urgent, new, the round tokens it waits for): moves and resets, after rounds'
        # rows
        self._moved: list = []
        # subscription id -> round token -> the messages rounds applied (`apply`) are to park and have not handed
        # to the retry driver yet (`parking_ended`)
        self._unparked: dict[str, dict[int, list[Parked]]] = {}
        # ids of the messages of `_unparked` a reset claimed (the old log's) -> where their round puts them (`park`)
        self._claimed: dict[int, list[Parked]] = {}
        self._tokens = itertools.count(1)
        self.read = None  # the shared read (engine.triggers.shared_read.SharedRead) reading the topic now, if any
        self.replay_possible = True  # the first batch of a read may be a replay: clear its slices in full
        self.catchup = None  # its `CatchUp` (herald.engine.triggers.catchup), made and started by `Topics`
        self.round_error: str | None = None  # why its last round failed (its subscriptions catch up on it)
        self.failed_rounds = 0  # its rounds (micro-batch or catch-up) that failed since one succeeded
        self.healthy = False  # delivered a micro-batch since it joined its read
        self.stopping = False  # the job is stopping (or the topic leaves it): a micro-batch delivers nothing

    # -- subscriptions ----------------------------------------------------------------------------------------
    @property
    def subscriptions(self) -> list[Subscription]:
        """The ACTIVE subscriptions, in the order of the projection's `targets` indices."""
        return [state.subscription for state in self.states.values()]

    def add(self, state: SubscriptionState, marks: dict[int, tuple[int, int]] | None = None,
            topic_id: str | None = None, seen: dict[int, int] | None = None) -> None:
        """Deliver one more subscription. marks / topic_id: Kafka's offsets and id of the topic now, to see whether
        the log its positions are in went back while it was not delivered (`check_log`). When Kafka's log ends
        below the read's frontier (cut, not just past what `marks` saw), every subscription is checked, not the
        joiner alone: once the frontier is lowered to the cut, no micro-batch would show it to the others.
        seen: the frontier before `marks` were read (`frontier_copy`; None: not taken)."""
        if marks is not None:
            marks, cut, seen = self._below_frontier(marks, seen)
            with self.lock:
                states = list(self.states.values()) + [state] if cut else [state]
            self.check_log(marks, topic_id, states=states, seen=seen)
        with self.lock:
            state.catching_up = self.frontier is not None and behind(state.positions, self.frontier)
            state.topic_end = self.frontier or {}
            self.states[state.id] = state

    def _below_frontier(self, marks: dict[int, tuple[int, int]], seen: dict[int, int] | None
                        ) -> tuple[dict[int, tuple[int, int]], bool, dict[int, int]]:
        """(Kafka's watermarks to check a joiner with, whether Kafka's log ends below the read's frontier, the
        frontier they are to be compared with: `check_log`'s `seen`). When
        `marks` (read before) end a partition below the frontier, they are read again: `marks` alone cannot tell,
        as a micro-batch may have ended past them since; one never ends past Kafka's end, so watermarks read
        after the frontier that are below it are a log that went back (cut, or the topic created again). When
        Kafka cannot say now: `marks` with their ends raised to the frontier, and False (no cut is taken from
        them: the next micro-batch's ends, or the periodic id check, find one)."""
        frontier = self.frontier_copy()

        def below(found) -> bool:
            return any(partition in frontier and high < frontier[partition] for partition, (_, high) in found.items())

        before = frontier if seen is None else seen  # what `marks` may have seen of the frontier
        if not below(marks):
            return marks, False, before
        try:
            now = self.kafka_marks()
        except Exception as error:  # noqa: BLE001 - see above
            log.info("%s: Kafka's offsets cannot be read again now (%s)", self.kafka_topic, error)
            return {p: (low, max(high, frontier.get(p, high))) for p, (low, high) in marks.items()}, False, before
        return now, below(now), frontier

    def frontier_copy(self) -> dict[int, int]:
        """The read's frontier now (empty: none yet), for `check_log`'s `seen`."""
        with self.lock:
            return dict(self.frontier or {})

    def kafka_marks(self) -> dict[int, tuple[int, int]]:
        """Kafka's (low, high) watermarks of the topic's partitions now."""
        return partition_watermarks(self.context.client_config, [self.kafka_topic])[self.kafka_topic]

    def remove(self, subscription_id: str) -> SubscriptionState | None:
        """Stop delivering a subscription (suspended or deleted); a round delivering it now finishes first. A
        state that names no topic id takes the one the job knows now, which its positions are in (`_reset_of`
        reads it so while it is here): should the topic be created again before it comes back, the id it brings
        back tells its positions are in the old log."""
        with self.lock:
            state = self.states.pop(subscription_id, None)
            if state is not None and state.topic_id is None:
                state.topic_id = self.topic_id
            return state

    def move(self, subscription_id: str, move) -> bool:
        """Move a subscription's position (a retransmission); at once when no round delivers it, else when
        its round is over. False when the subscription is not here, or the move is in another Kafka topic (made
        before its topic's `kafkaTopic` changed: it moves the positions it had there)."""
        with self.lock:
            state = self.states.get(subscription_id)
            if state is None or move.kafka_topic != self.kafka_topic:
                return False
            if state.busy:
                state.pending_moves.append(move)
            else:
                self._move(state, move)
        self.flush_moves()
        return True

    def _move(self, state: SubscriptionState, move) -> None:
        """(lock held) The state moves; its retry states are dropped (the messages are delivered again as new),
        and it catches up when the move put it behind the query. Its rows are written by `flush_moves`. A
        `TopicReset` (`_reset`) is applied the same way."""
        if isinstance(move, PendingReset):
            self._reset(state, move)
            return
        state.positions.update(move.to_offsets)
        state.rows_topic_id = None  # the move's rows name no topic id: the next round's rows name it again
        dropped, state.carried = set(state.carried), {}
        state.idle = None
        state.catching_up = self.frontier is not None and behind(state.positions, self.frontier)
        subscription = state.subscription
        self._moved.append((Slice(move.writer, move.move_id), lambda stamp: moves.applied_tables(
            move, moved_rows(subscription, dropped, stamp, move.writer, move.move_id, move.kafka_topic), stamp),
            False, False, frozenset()))
        log.info("%s moved to %s (retransmission from %s)", state.id, move.to_offsets, move.date.isoformat())

    def flush_moves(self) -> None:
        """Write the positions of the moves and resets applied since the last call, after the rounds' own rows,
        and mark the moves applied. A reset's end of what rounds that read the old log park after their `apply`
        waits until those rounds have parked (`parking_ended`); their own calls then write it."""
        with self.lock:
            unparked = {token for rounds in self._unparked.values() for token in rounds}
            moved = [item for item in self._moved if not item[4] & unparked]
            self._moved = [item for item in self._moved if item[4] & unparked]
        for part, tables_at, urgent, new, _ in moved:  # new: a slice of its own (a reset's), appended
            tables = tables_at(stamp_ms())
            if tables:
                self.context.writer.submit(part, tables, urgent=urgent, new=new)
        if moved and self.catchup is not None:
            self.catchup.wake()

    # -- offsets that go back (engine/round/resets.py) -----------------------------------------------------------
    def check_log(self, marks: dict[int, tuple[int, int]], topic_id: str | None,
                  read_at: dict[int, int] | None = None,
                  states: list[SubscriptionState] | None = None,
                  seen: dict[int, int] | None = None) -> dict[int, int] | None:
        """Kafka's log of the topic now: `marks` (partition -> (low, high)) and its id (None: not given). Every
        subscription (of `states`, None: the topic's; all of them, `states` too, when the id is not the one the
        job knows) whose log went back (the topic created again, or a
        partition cut) goes on from the new log, and it is recorded (`_reset`; a subscription a round delivers
        now, once that round is over); the read's frontier, and `read_at` (where a checkpoint left the read),
        are kept within the log. Returns `read_at` so kept. seen: the read's frontier when `marks` were read (a
        copy taken before reading them; None: the frontier now, `marks` read after the last micro-batch ended): a
        micro-batch may end past `marks` after they were read, so the frontier is compared with them as it was
        then (a partition lowered where they are below that, left out where they do not list one it had)."""
        found_ms = now_ms()
        with self.lock:
            if states is not None and topic_id and topic_id != self.topic_id:
                # not the id the job knows (or the first it learns: the others' rows may name another): every
                # subscription of the topic is looked at, not `states` alone
                states = list(self.states.values()) + [s for s in states if s.id not in self.states]
            states = list(self.states.values()) if states is None else states
            then = (self.frontier or {}) if seen is None else seen

            now = self.frontier or {}

            def known(state: SubscriptionState, offsets: dict[int, int]) -> dict[int, int]:
                """What `offsets` (a position, an end seen) of `state` say of the log as `marks` saw it: a
                micro-batch that ended since they were read (`seen`) may have moved those of the read's
                subscriptions past `marks`, in the same log, up to its end (the frontier now): those are taken
                as of `seen`. A joiner's, or one past the frontier (joined at Kafka's end, moved), no
                micro-batch moved: as they are."""
                if seen is None or state.id not in self.states:
                    return offsets
                return {p: min(offset, then[p]) if p in then and offset <= now.get(p, -1) else offset
                        for p, offset in offsets.items()}
            # what the job knows of the log, for the subscriptions whose id says nothing
            unsure = [s for s in states if not ((s.topic_id or self.topic_id) and topic_id)]
            shared = known_ends(then, read_at, *[known(s, s.positions) for s in unsure],
                                *[known(s, s.topic_end) for s in unsure])
            found = {state.id: self._reset_of(state, marks, topic_id, shared, found_ms, known) for state in states}
            resets = [reset for reset in found.values() if reset is not None]
            if resets:
                log.warning("%s; %d subscription(s) go on from the new offsets; what they had not read of the old "
                            "ones is recorded LOST", resets[0].describe(), len(resets))
            if self.topic_id is None and any(
                    (reset := found.get(state.id)) is not None and reset.was_id and reset.was_id != topic_id
                    for state in states if state.id in self.states):
                # the first id the job learns says the log the read was in with its subscriptions is an old one:
                # a micro-batch in flight read it (`batch_ended`)
                for partition in self.frontier or {}:
                    self.cuts[partition] = self.cuts.get(partition, 0) + 1
            if marks:  # a partition Kafka does not list is not in the topic (any more): out of the frontier
                for partition, end in {**(read_at or {}), **then, **(self.frontier or {})}.items():
                    if partition not in marks and (partition in then or partition in (read_at or {})):
                        self.unlisted[partition] = end
            if self.frontier is not None:
                within = {}
                for partition, end in self.frontier.items():
                    if partition in marks:
                        high = marks[partition][1]
                        within[partition] = min(end, high) if high < then.get(partition, end) else end
                    elif partition not in self.unlisted:  # new since `marks` were read
                        within[partition] = end
                    if within.get(partition, -1) < end:  # a micro-batch in flight read the old log there
                        self.cuts[partition] = self.cuts.get(partition, 0) + 1
                self.frontier = within
            for state in states:
                reset = found.get(state.id)
                if reset is None:
                    state.topic_id = topic_id or state.topic_id
                    continue
                pending = PendingReset(reset, dict(state.positions))
                if state.busy:  # its round ends first (`apply`); a newer reset takes the place of one waiting
                    state.topic_id = state.topic_id or self.topic_id  # its positions are in the old log until then
                    state.pending_moves = [m for m in state.pending_moves if not isinstance(m, PendingReset)]
                    state.pending_moves.append(pending)
                else:
                    self._reset(state, pending)
            self.topic_id = topic_id or self.topic_id
        self.flush_moves()
        return None if read_at is None else {p: min(o, marks[p][1]) for p, o in read_at.items() if p in marks}

    def listed(self, ranges: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """A micro-batch's `ranges` of the topic without the partitions Kafka stopped listing (`check_log`): a
        source that keeps one (Herald's Python source) gives it empty ranges at the end it had, and a batch Spark
        planned before the topic was created again may hold a range of its old log. Those are left out (the end
        they reach remembered), and any other range of such a partition is taken only once Kafka lists it again
        (added again: its new log, read from its start); Kafka is asked then, outside the lock."""
        with self.lock:
            if not self.unlisted:
                return ranges
            doubtful = [p for p, (start, end) in ranges.items()
                        if p in self.unlisted and not start == end == self.unlisted[p]]
        listed_now: set[int] = set()
        answered = True
        if doubtful:
            try:
                listed_now = set(self.kafka_marks())
            except Exception as error:  # noqa: BLE001 - left out this time: asked again at its next range
                answered = False
                log.info("%s: whether Kafka lists partition(s) %s again cannot be told now (%s)", self.kafka_topic,
                         doubtful, error)
        with self.lock:
            kept = {}
            for partition, (start, end) in ranges.items():
                if partition in self.unlisted and partition not in listed_now:
                    if answered and start >= self.unlisted[partition]:  # the old log's: its next ranges go on from
                        self.unlisted[partition] = end  # there (one that went back, a new log Kafka's answer may
                    continue  # not show yet, and one Kafka was not asked about, are asked about again)
                self.unlisted.pop(partition, None)
                kept[partition] = (start, end)
            return kept

    def went_back(self, ends: dict[int, int]) -> bool:
        """True when a micro-batch ends a partition below the read's frontier: Kafka's offsets went back, and
        the caller asks Kafka about the topic (`check_log`)."""
        with self.lock:
            return self.frontier is not None and bool(went_back(ends, self.frontier))

    def _reset_of(self, state: SubscriptionState, marks, topic_id: str | None, shared: dict[int, int],
                  found_ms: int, known: Callable) -> TopicReset | None:
        """(lock held) The reset of one subscription's log, if any: by topic id when the id its positions are in
        (or, when its rows named none, the topic's as the job knew it) and the one Kafka gives now are known, else
        by Kafka's end offsets against all the job knows of the log (`shared`). `known`: its offsets as `marks`
        can judge them (`check_log`): they tell whether there is a reset; how far the old log went (what it
        lost) is all it knows."""
        known_id = state.topic_id or self.topic_id
        judged = known_ends(known(state, state.positions), known(state, state.topic_end))
        ends = known_ends(state.positions, state.topic_end)
        if not (known_id and topic_id):
            judged, ends, known_id, topic_id = known_ends(shared, judged), known_ends(shared, ends), None, None
        reset = find_reset(self.kafka_topic, judged, known_id, marks, topic_id, found_ms)
        if reset is None or judged == ends:
            return reset
        full = find_reset(self.kafka_topic, ends, known_id, marks, topic_id, found_ms)
        return replace(reset, partitions={p: full.partitions[p] for p in reset.partitions})

    def _reset(self, state: SubscriptionState, pending: PendingReset) -> None:
        """(lock held) One subscription goes on from the new log. What it had not read of the old log is lost
        from where it was when the reset was found (`pending.positions`). Its parked messages in the old log are
        taken out of the retry driver now, under this lock, before any round can read the new log for it: their
        DISCARDED rows and the reset's rows are one slice, stamped then, so a new message parked at one of their
        offsets later is always newer. The slice is written by `flush_moves`."""
        reset = pending.reset
        outcome = reset_subscription(reset, state.positions, state.carried, lost_from=pending.positions)
        ended, stamp = self.retries.end_old_log(
            self.kafka_topic, {p: part.first_gone for p, part in reset.partitions.items()},
            f"Kafka topic {self.kafka_topic}: {reset.describe()}; the offset of this parked message belongs to a "
            "message of the new log now", state.subscription)
        state.positions.update(outcome.positions)
        state.carried = {key: value for key, value in state.carried.items() if key not in outcome.dropped}
        state.topic_end = dict(state.topic_end)  # it may be the frontier itself (`set_frontier`): not changed here
        for partition, part in reset.partitions.items():
            if partition in state.topic_end:
                state.topic_end[partition] = min(state.topic_end[partition], part.high)
        state.idle = None
        state.topic_id = reset.topic_id or state.topic_id
        state.rows_topic_id = None  # its rows name the id for the partitions reset only: the next round's, for all
        state.catching_up = self.frontier is not None and behind(state.positions, self.frontier)
        tables = reset_tables(state.subscription, reset, outcome, stamp, self.context.cluster, pending.positions,
                              ended)
        self._moved.append((Slice(reset_writer(state.id), reset.found_ms), lambda _: tables, True, True,
                            frozenset()))
        # rounds applied and not parked yet (the one this reset waited for, or one that ended just before) park
        # what they read of the old log after this: those messages, exactly, end once those rounds have parked
        rounds = self._unparked.get(state.id, {})
        firsts = {p: part.first_gone for p, part in reset.partitions.items()}
        late = [item for items in rounds.values() for item in items
                if item.record.offset >= firsts.get(item.record.partition, math.inf)]
        if late:
            subscription = state.subscription
            reason = (f"Kafka topic {self.kafka_topic}: {reset.describe()}; the offset of this parked message belongs "
                      "to a message of the new log now")
            ended: list[Parked] = []  # filled by `park` as their rounds hand them over: they are never parked
            for item in late:
                self._claimed[id(item)] = ended

            def parked_since(_):
                outcome, late_stamp = self.retries.ended_by_reset(subscription, self.kafka_topic, ended, reason)
                return [] if outcome is None else parked_discard_tables(
                    subscription, outcome, late_stamp, self.context.cluster, f"reset-parked:{subscription.id}",
                    reset.found_ms)
            self._moved.append((Slice(f"reset-parked:{subscription.id}", reset.found_ms), parked_since, True, True,
                                frozenset(rounds)))
        log.info("%s: %s goes on from %s (was at %s)%s", state.id, self.kafka_topic, outcome.positions,
                 {p: pending.positions.get(p) for p in outcome.positions},
                 "; lost " + ", ".join(f"{p}: {a}..{b - 1}" for p, a, b in outcome.lost) if outcome.lost else "")

    def update(self, subscription: Subscription) -> None:
        """A new version of a subscription's file: its next round uses it."""
        with self.lock:
            state = self.states.get(subscription.id)
            if state is not None:
                state.subscription = subscription

    # -- the shared read -------------------------------------------------------------------------------------
    @property
    def query(self):
        """The streaming query reading the topic now (the shared read's), or None."""
        read = self.read
        return read.query if read is not None else None

    def failure(self) -> str | None:
        """Why the read of the topic is not running (it failed, or could not start), or None."""
        read = self.read
        return read.failure() if read is not None else None

    def starting_offsets(self, marks: dict[int, tuple[int, int]]) -> dict[int, int]:
        """Where a read that starts afresh starts the topic, per partition: at its frontier (where the last read
        had delivered it to); for a topic new to the read, at the highest position of its subscriptions (a
        partition without one at its earliest offset). Subscriptions behind it catch up on their own, so an
        up-to-date subscription never waits for another one's backlog to be read first. Within what Kafka holds:
        a range deleted below it is found by catch-up (LOST rows). `marks`: partition -> (low, high) watermarks."""
        with self.lock:
            frontier = dict(self.frontier or {})
            positions = [dict(state.positions) for state in self.states.values()]
        starting = {}
        for partition, (low, high) in marks.items():
            if partition in frontier:
                wanted = frontier[partition]
            else:
                known = [position[partition] for position in positions if partition in position]
                wanted = max(known) if known else low
            starting[partition] = min(max(wanted, low), high)
        return starting

    def joined(self, read, frontier: dict[int, int]) -> None:
        """`read` now reads the topic, from `frontier` on."""
        with self.lock:
            self.read = read
            self.frontier = dict(frontier)
            self._log_at_last_batch = (self.topic_id, dict(self.cuts))
            for partition in frontier:  # the read knows it: Kafka lists it (`check_log` left it out otherwise)
                self.unlisted.pop(partition, None)
            self.replay_possible = True
            self.healthy = False
            for state in self.states.values():
                state.topic_end = self.frontier
                if not state.busy:  # a round delivering it (catch-up, on a restart) sets it when it ends
                    state.catching_up = behind(state.positions, self.frontier)

    def passed(self, ranges: dict[int, tuple[int, int]]) -> None:
        """A micro-batch of the read had nothing of this topic to deliver (`ranges` empty): the read is at their
        end (a replayed batch whose start is unknown: subscriptions behind it catch up), and the next batch is
        not a replay for it."""
        with self.lock:
            self.batch_ended(ranges)
        self.replay_possible = False

    def round_failed(self, ranges: dict[int, tuple[int, int]], error: str) -> None:
        """Its round of a micro-batch failed: the read is past `ranges` anyway; the subscriptions that did not
        record them are behind and catch up on them."""
        with self.lock:
            self.batch_ended(ranges)
        self.round_error = error
        self.failed_rounds += 1

    def round_succeeded(self) -> None:
        self.failed_rounds = 0

    def deliver_batch(self, batch_df, batch_id: int, ranges: dict[int, tuple[int, int]], writer: str,
                      may_replay: bool = True) -> None:
        """Deliver the topic's `ranges` (partition -> [start, end)) of the read's micro-batch `batch_id` (its rows:
        `batch_df`) to the subscriptions at the read's position, in a Spark job of its own; its rows are written
        as `writer`'s. (The read delivers the rounds of several topics in one job: `begin_batch`, `finish_batch`.)
        may_replay: as `begin_batch`."""
        context = self.context
        batch = self.begin_batch(batch_id, ranges, writer, may_replay=may_replay)
        if batch is not None:
            self.finish_batch(batch, lambda: steps.run_alone(context, self.topic, batch.subscriptions, batch.plan,
                                                             batch_df, ranges))

    def begin_batch(self, batch_id: int, ranges: dict[int, tuple[int, int]], writer: str,
                    tasks: int | None = None, may_replay: bool = True) -> BatchRound | None:
        """A round of the batch up to its Spark job (`Round.begin`): the subscriptions taking part are chosen (busy
        from now on) and their `TaskPlan` made for `tasks` tasks (None: a task per partition of `ranges`, at most
        Spark's parallelism) (`BatchRound.plan`; None when there is nothing to send).
        None when the batch is not delivered (the job is stopping, or it was recorded before a restart). The
        caller runs the job, then calls `finish_batch`, or `abandon_batch` when it delivers the batch again
        another way. may_replay: False when the read knows the batch never ran before (`SharedRead.may_replay`):
        then it was not recorded, and its round is new to the tables."""
        if self.stopping:  # its rows stay behind every position: the next run (or catch-up) reads them again
            log.info("%s batch %d: not delivered, the job is stopping", self.kafka_topic, batch_id)
            return None
        if not may_replay:
            self.replay_possible = False
        if self.replay_possible and self._recorded_before(batch_id, writer):
            # written whole before a crash or a stop that came before Spark's commit: its subscriptions are past
            # it (those that are not catch up); delivering it again would replace its rows with an empty round's
            log.info("%s batch %d: recorded before the restart; not delivered again", self.kafka_topic, batch_id)
            with self.lock:
                self.batch_ended(ranges)
            self.replay_possible = False
            return None
        batch = BatchRound(self, batch_id, ranges, writer, tasks)
        batch.round.begin()
        return batch

    def finish_batch(self, batch: BatchRound, reports: Callable[[], list]) -> None:
        """Take the outcome of `batch`'s Spark job into the states and record the round (`Round.finish`).
        `reports` returns the job's task reports for the round (it is not called when the round sends nothing);
        when it raises, the subscriptions taking part are behind the frontier and catch up on the batch, and this
        raises too."""
        batch.reports = reports
        batch.round.finish()

    def abandon_batch(self, batch: BatchRound) -> None:
        """`batch`'s Spark job failed, and the batch is delivered again (`deliver_batch`): its subscriptions are
        free at the positions they had (the frontier does not move), their pins given back and the moves asked
        meanwhile applied. Nothing of the failed job is recorded."""
        batch.round.abandon()
        self.flush_moves()

    def batch_ended(self, ranges: dict[int, tuple[int, int]], batch_id: int | None = None) -> None:
        """(lock held) A micro-batch of the read ended at the end of `ranges`: the frontier moves there, but where
        Kafka's log went back since the read's last micro-batch ended (the topic's id changed: every partition;
        else the partitions `check_log` lowered the frontier of), as Spark may have planned this one before: its
        ends may be in the old log, and the frontier stays where `check_log` put it, within the new one (a
        partition `check_log` left out stays out, its end in the old log remembered: `listed`)."""
        topic_id, cuts = self._log_at_last_batch
        recreated = topic_id is not None and self.topic_id != topic_id
        old_log = {p for p in ranges if recreated or self.cuts.get(p, 0) != cuts.get(p, 0)}
        if old_log:
            log.info("%s batch %s: the topic's log went back since the read's last micro-batch; the read's frontier "
                     "stays in the new log for partition(s) %s", self.kafka_topic, batch_id, sorted(old_log))
        frontier = self.frontier or {}
        for partition in old_log & set(self.unlisted):
            self.unlisted[partition] = ranges[partition][1]
        self.set_frontier({p: (start, frontier[p] if p in old_log else end) for p, (start, end) in ranges.items()
                           if p not in old_log or p in frontier})
        self._log_at_last_batch = (self.topic_id, dict(self.cuts))
        self._held = {p: ranges[p][1] for p in old_log if p not in self.unlisted}
        self._batches_ended += 1

    def settle_frontier(self) -> None:
        """After a micro-batch whose ends `batch_ended` held (outside the lock): Kafka's end offsets read now,
        after the reset, bound how far the read is in the new log. The read goes on from the batch's end in
        whichever log Kafka has (or, past that log's end, from its end), so the frontier of a held partition moves
        to the lower of the two: the subscriptions sent to the new log's start catch up on all the read will not
        give them, without waiting for the topic's next micro-batch (none comes while it is quiet), and never
        past what Kafka holds. Nothing when the log went back again meanwhile, another micro-batch ended, or Kafka
        cannot say now (the next micro-batch moves the frontier)."""
        with self.lock:
            held, ended, log_at = dict(self._held), self._batches_ended, self._log_at_last_batch
        if not held:
            return
        try:
            marks = self.kafka_marks()
        except Exception as error:  # noqa: BLE001 - see above
            log.info("%s: Kafka's offsets cannot be read now (%s); the frontier moves with the next micro-batch",
                     self.kafka_topic, error)
            return
        with self.lock:
            if ended != self._batches_ended or (self.topic_id, self.cuts) != log_at or self.frontier is None:
                return
            frontier = dict(self.frontier)
            for partition, end in held.items():
                if partition in marks:
                    frontier[partition] = max(frontier.get(partition, 0), min(end, marks[partition][1]))
            self._held = {}
            self.set_frontier({p: (end, end) for p, end in frontier.items()})
            self._log_at_last_batch = (self.topic_id, dict(self.cuts))
        if self.catchup is not None:
            self.catchup.wake()

    def set_frontier(self, ranges: dict[int, tuple[int, int]]) -> None:
        """(lock held) The query is now at the end of `ranges`; the subscriptions behind it catch up."""
        self.frontier = {p: e for p, (_, e) in ranges.items()}
        for state in self.states.values():  # stopped early, or added (activated) during the batch
            state.topic_end = self.frontier
            if not state.busy and not state.catching_up and behind(state.positions, self.frontier):
                state.catching_up = True

    def _recorded_before(self, batch_id: int, writer: str) -> bool:
        """True when the offsets table holds this query's positions for micro-batch `batch_id` (written last of a
        round's tables: the whole round was recorded; a round that moved no position wrote none, and its replay
        delivers it again to subscriptions still at its start), or when this process handed that round to the table
        writer and it is not written yet (a query restarted within storage.commitIntervalMs of the round: its
        replay would deliver nothing, and its empty slice would replace the round's PARKED and undelivered rows)."""
        part = Slice(writer, batch_id)
        if self.context.writer.holds(part):  # asked first: once it says False, the commit is visible
            return True
        return self.context.store.sql(OFFSETS, f"SELECT * FROM {OFFSETS} WHERE {part.predicate} LIMIT 1").num_rows > 0

    def claim_participants(self, subscriptions: list[Subscription],
                           ranges: dict[int, tuple[int, int]]) -> list[Participant]:
        """The subscriptions at the query's position (lock held), marked busy; those behind are sent to catch up."""
        chosen = []
        for index, subscription in enumerate(subscriptions):
            state = self.states[subscription.id]
            if state.busy or state.catching_up:
                continue
            if any(state.positions.get(p, start) < start for p, (start, _) in ranges.items()):
                state.catching_up = True
                continue
            state.busy = True
            chosen.append((index, state))
        return steps.participants(self.context, chosen, self.retries.parked_count)  # failing, frees them

    # -- shared by the query and catch-up ---------------------------------------------------------------------
    def apply(self, participants: list[Participant], results: list[SubscriptionOutcome],
              topic_id: str | None = None) -> int:
        """Take a round's outcomes into the states (lock held). Its parked messages go to the retry driver only
        once the round's rows are handed to the writer (`record`), so that a retry round's rows about them are
        always written after their PARKED rows; until its caller says so (`parking_ended`), a reset's end of the
        old log's parked messages waits (`flush_moves`).

        `topic_id`: the Kafka topic id the round's rows carry (the one it was planned with; None: none).

        Returns the stamp (epoch ms) of the round's rows, taken here, before its subscriptions are free and before
        the moves asked during the round are applied: a move written by another thread before this round is
        recorded, or the subscriptions' next round recorded first, is still newer than the round's rows."""
        token = next(self._tokens)
        for result in results:
            if result.parked:
                result.parking = token
                self._unparked.setdefault(result.subscription.id, {})[token] = list(result.parked)
        try:
            return self._take(participants, results, topic_id)
        except BaseException:  # never taken in: nothing will park, nothing waits for it
            self._forget_parking(results)
            raise

    def _take(self, participants: list[Participant], results: list[SubscriptionOutcome],
              topic_id: str | None) -> int:
        """(lock held) `apply`'s work."""
        stamp = stamp_ms()
        by_id = {result.subscription.id: result for result in results}
        for participant in participants:
            state = participant.state
            state.busy = False
            result = by_id.get(state.id)
            if result is None:
                continue
            state.take_flow(result.flow_state, time.monotonic())
            before = dict(state.positions)
            for partition, offset in result.positions.items():
                state.positions[partition] = max(state.positions.get(partition, offset), offset)
            result.positions = self._to_write(state, before, result.positions, topic_id)
            before = set(state.carried)
            for item in result.carried:
                state.carried[(item.partition, item.offset)] = item.state
            state.carried = state.live_carried()
            ended = {(partition, offset): how for partition, offset, how in result.ended_carried}
            parked = {(item.record.partition, item.record.offset) for item in result.parked}
            for key in before - set(state.carried) - parked:  # passed by the position: a terminal row
                how = ended.get(key)
                result.resolved[key] = (stub(*key), DELIVERED if how == SUCCESS else DISCARDED if how else RELEASED)
        for participant in participants:  # a move asked for during the round supersedes its positions
            moves_asked, participant.state.pending_moves = participant.state.pending_moves, []
            for move in moves_asked:  # in the order they were asked: each is applied, and recorded applied
                self._move(participant.state, move)
        return stamp

    def parking_ended(self, results: list[SubscriptionOutcome]) -> None:
        """The round whose `results` were applied has handed its parked messages to the retry driver (or never
        will: it was not recorded); the caller then calls `flush_moves`."""
        with self.lock:
            self._forget_parking(results)

    def park(self, subscription: Subscription, kafka_topic: str, parked: list[Parked]) -> None:
        """A recorded round's parked messages to the retry driver (`steps.record`), but those a reset claimed while
        the round was recording: they are the old log's, and end with the reset's rows (`_reset`). Under the lock,
        as a reset takes parked messages out under it: none falls between the two."""
        with self.lock:
            keep = []
            for item in parked:
                claim = self._claimed.pop(id(item), None)
                if claim is None:
                    keep.append(item)
                else:
                    claim.append(item)
            if keep:
                self.retries.park(subscription, kafka_topic, keep)

    def _forget_parking(self, results: list[SubscriptionOutcome]) -> None:
        """(lock held)"""
        for result in results:
            if result.parking:
                rounds = self._unparked.get(result.subscription.id, {})
                for item in rounds.pop(result.parking, []):
                    self._claimed.pop(id(item), None)
                if not rounds:
                    self._unparked.pop(result.subscription.id, None)
                result.parking = 0

    def _to_write(self, state: SubscriptionState, before: dict[int, int], covered: dict[int, int],
                  topic_id: str | None) -> dict[int, int]:
        """(lock held) The positions a round's offsets rows hold: those of the partitions it `covered` that moved
        from where they were `before` it; all of them when the state's rows do not name `topic_id`, the Kafka topic
        id the round's rows carry (an id learnt since, or rows a move or a reset wrote). A position that stayed has
        its newest row already: a row for it would only grow the table (docs/design.md §8)."""
        if topic_id is not None and state.rows_topic_id != topic_id:
            state.rows_topic_id = topic_id
            return {partition: state.positions[partition] for partition in covered}
        return {partition: state.positions[partition] for partition in covered
                if before.get(partition) != state.positions[partition]}

    def stop(self) -> None:
        """Deliver nothing more (the job stops, or the topic leaves it); the read is stopped by `Topics`."""
        self.stopping = True

