"""One Kafka topic: the states of its ACTIVE subscriptions, and the rounds that deliver its records to them.

The job's shared read (`herald.engine.triggers.shared_read`) reads every topic in one streaming query; each
micro-batch's range of a topic is read once, decoded once and filtered once for every subscription of the topic
(`projection`), then delivered in one job (`fanout`) for the subscriptions whose position is the read's
(`deliver_batch`). A subscription that is behind (new with `earliest`, re-activated, stopped early at a batch
deadline, moved by an operator) is left out and catches up on its own (`catchup`); it rejoins the shared read once it
reaches the read's position in the topic (the frontier). The topic's lock guards the states; a round marks its
subscriptions busy while it delivers.

Offsets that go back (a topic created again, a log cut) are the part in `herald.engine.round.log_check`.

The read's offsets are Spark's checkpoint; the subscriptions' positions are the offsets table. A read that
starts afresh starts a topic at its frontier or, new to the read, at the highest position of its subscriptions;
those behind it catch up.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable

from herald.config import Subscription
from herald.config.model import Topic
from herald.delivery.report import SUCCESS, Parked
from herald.engine.context import EngineContext, stamp_ms
from herald.engine.round import steps
from herald.engine.round.batch import BatchRound
from herald.engine.round.fanout import Participant
from herald.engine.round.log_check import LogChecks
from herald.engine.round.positions import behind
from herald.engine.round.resets import PendingReset
from herald.engine.round.result import SubscriptionOutcome, moved_rows, stub
from herald.engine.round.state import SubscriptionState
from herald.engine.upkeep import moves
from herald.storage import Slice
from herald.storage.tables import DELIVERED, DISCARDED, OFFSETS, RELEASED

log = logging.getLogger(__name__)


class TopicPipeline(LogChecks):
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

