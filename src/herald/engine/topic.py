"""One Kafka topic: the streaming query its ACTIVE subscriptions share, and their states.

Each micro-batch is read once, decoded once and filtered once for every subscription (`projection`), then
delivered in one job (`fanout`) for the subscriptions whose position is the query's. A subscription that is
behind (new with `earliest`, re-activated, stopped early at a batch deadline, moved by an operator) is left out
and catches up on its own (`catchup`); it rejoins the shared query once it reaches the query's position
(the frontier). The topic's lock guards the states; a round marks its subscriptions busy while it delivers.

The query's offsets are Spark's checkpoint (`<storage>/checkpoints/topics/<kafka topic>`); the subscriptions'
positions are the offsets table. A new checkpoint starts at the highest position of the topic's subscriptions;
those behind it catch up.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable

from herald.config import Subscription
from herald.config.model import Topic
from herald.engine import checkpoint as checkpoints
from herald.engine import moves
from herald.engine import round_steps as steps
from herald.engine.catchup import CatchUp
from herald.engine.context import EngineContext, stamp_ms
from herald.engine.fanout import Participant
from herald.engine.positions import behind
from herald.engine.rounds import STREAM, RoundResult, SubscriptionOutcome, moved_rows, stub
from herald.engine.state import SubscriptionState
from herald.engine.supervision import short_error
from herald.source.kafka_offsets import partition_watermarks
from herald.source.stream import open_kafka_stream
from herald.storage import Slice
from herald.delivery.report import SUCCESS
from herald.storage.tables import DELIVERED, DISCARDED, OFFSETS, RELEASED

log = logging.getLogger(__name__)


def checkpoint_location(storage_path: str, kafka_topic: str) -> str:
    return f"{storage_path.rstrip('/')}/checkpoints/topics/{kafka_topic}"


class TopicPipeline:
    """`retries`: the retry driver (`herald.engine.retries.RetryDriver`): it gets the rounds' parked messages and
    says how many of a subscription's in-flight slots they hold."""

    def __init__(self, context: EngineContext, topic: Topic, states: Iterable[SubscriptionState], retries) -> None:
        self.context = context
        self.retries = retries
        self.topic = topic
        self.kafka_topic = topic.kafka_topic
        self.lock = threading.RLock()
        self.states: dict[str, SubscriptionState] = {state.id: state for state in states}
        self.frontier: dict[int, int] | None = None  # where the shared query is: the end of its last batch
        self.batch_in_progress = False
        self._moved: list = []  # (move, subscription, carried keys it dropped): written after the round's rows
        self.query = None
        self.checkpoint = checkpoint_location(context.config.storage_path, self.kafka_topic)
        self._first_start: dict[int, int] | None = None
        self._replay_possible = True  # the first batch of a run may be a replay: clear its slices in full
        self._started = threading.Event()
        self._writer = ""
        self.catchup = CatchUp(self)  # started with the query, by `Topics`
        self.start_error: str | None = None  # why the query could not start (the runner starts it again)
        self.healthy = False  # the query completed a micro-batch since it (re)started
        self.stopping = False  # the job is stopping: a micro-batch that starts now delivers nothing

    # -- subscriptions ----------------------------------------------------------------------------------------
    @property
    def subscriptions(self) -> list[Subscription]:
        """The ACTIVE subscriptions, in the order of the projection's `targets` indices."""
        return [state.subscription for state in self.states.values()]

    def add(self, state: SubscriptionState) -> None:
        with self.lock:
            state.catching_up = self.frontier is not None and behind(state.positions, self.frontier)
            state.topic_end = self.frontier or {}
            self.states[state.id] = state

    def remove(self, subscription_id: str) -> SubscriptionState | None:
        """Stop delivering a subscription (suspended or deleted); a round delivering it now finishes first."""
        with self.lock:
            return self.states.pop(subscription_id, None)

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
        and it catches up when the move put it behind the query. Its rows are written by `flush_moves`."""
        state.positions.update(move.to_offsets)
        dropped, state.carried = set(state.carried), {}
        state.idle = None
        state.catching_up = self.frontier is not None and behind(state.positions, self.frontier)
        self._moved.append((move, state.subscription, dropped))
        log.info("%s moved to %s (retransmission from %s)", state.id, move.to_offsets, move.date.isoformat())

    def flush_moves(self) -> None:
        """Write the positions of the moves applied since the last call, after the rounds' own rows, and mark
        the moves applied."""
        with self.lock:
            moved, self._moved = self._moved, []
        for move, subscription, dropped in moved:
            stamp = stamp_ms()
            self.context.writer.submit(Slice(move.writer, move.move_id), moves.applied_tables(
                move, moved_rows(subscription, dropped, stamp, move.writer, move.move_id), stamp))
        if moved and self.catchup is not None:
            self.catchup.wake()

    def update(self, subscription: Subscription) -> None:
        """A new version of a subscription's file: its next round uses it."""
        with self.lock:
            state = self.states.get(subscription.id)
            if state is not None:
                state.subscription = subscription

    # -- the shared query -------------------------------------------------------------------------------------
    def start(self) -> None:
        context = self.context
        settings = context.config.settings
        starting = self._starting_offsets()
        frontier = self._committed_frontier() or starting
        with self.lock:
            self.frontier = frontier
            for state in self.states.values():
                state.topic_end = frontier
                if not state.busy:  # a round delivering it (catch-up, on a restart) sets it when it ends
                    state.catching_up = behind(state.positions, frontier)
        raw = open_kafka_stream(
            context.spark, context.connector, settings.kafka.bootstrapServers, settings.kafka.properties,
            self.kafka_topic, json.dumps({self.kafka_topic: {str(p): o for p, o in sorted(starting.items())}}),
            settings.streaming.maxOffsetsPerTrigger,
        )
        writer = (raw.writeStream.queryName(f"herald:{self.kafka_topic}")
                  .option("checkpointLocation", self.checkpoint).foreachBatch(self.handle_batch))
        if context.once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=settings.streaming.triggerInterval)
        self.query = writer.start()
        self._writer = f"stream:{self.query.id}"  # the checkpoint's query id: the same after a restart
        self._started.set()
        log.info("%s: one query for %d subscription(s)", self.kafka_topic, len(self.states))

    def failure(self) -> str | None:
        """Why the topic's query is not running (it failed, or could not start), or None."""
        if self.start_error is not None:
            return self.start_error
        query = self.query
        if query is not None and not query.isActive:
            error = query.exception()
            if error is not None:
                return short_error(error)
        return None

    def restart(self) -> None:
        """Start the query again from its checkpoint, after it failed. Its first micro-batch may replay the one
        that failed, which then replaces whatever that one wrote."""
        self.stop()
        self.stopping = False
        self.start_error = None
        self.healthy = False
        self._replay_possible = True
        self._started.clear()
        try:
            self.start()
        except Exception as error:
            self.start_error = short_error(error)
            raise

    def _starting_offsets(self) -> dict[int, int]:
        """Where a new checkpoint starts: per partition, the highest position of the topic's subscriptions (a
        partition without one starts at its earliest offset). Subscriptions behind it catch up on their own, so
        an up-to-date subscription never waits for another one's backlog to be read first."""
        marks = partition_watermarks(self.context.client_config, [self.kafka_topic])[self.kafka_topic]
        starting = {}
        for partition, (low, high) in marks.items():
            positions = [state.positions[partition] for state in self.states.values() if partition in state.positions]
            starting[partition] = min(max(max(positions), low), high) if positions else low
        if not checkpoints.has_offsets(self.context.spark, self.checkpoint):
            self._first_start = starting
        return starting

    def _committed_frontier(self) -> dict[int, int] | None:
        last = checkpoints.last_committed(self.context.spark, self.checkpoint)
        if last is None:
            return None
        return checkpoints.logged_offsets(self.context.spark, self.checkpoint, last, self.kafka_topic)

    def handle_batch(self, batch_df, batch_id: int) -> None:
        """`foreachBatch`: deliver the micro-batch to the subscriptions at the query's position."""
        self._started.wait()
        if self.stopping:  # its rows stay behind every position: the next run (or catch-up) reads them again
            log.info("%s batch %d: not delivered, the job is stopping", self.kafka_topic, batch_id)
            return
        context = self.context
        ranges = checkpoints.batch_ranges(context.spark, self.checkpoint, batch_id, self.kafka_topic,
                                          self._first_start)
        if self._replay_possible and self._recorded_before(batch_id):
            # written whole before a crash or a stop that came before Spark's commit: its subscriptions are past
            # it (those that are not catch up); delivering it again would replace its rows with an empty round's
            log.info("%s batch %d: recorded before the restart; not delivered again", self.kafka_topic, batch_id)
            with self.lock:
                self._set_frontier(ranges)
            self._replay_possible = False
            return
        started = time.monotonic()
        with self.lock:
            ends = {partition: end for partition, (_, end) in ranges.items()}
            for state in self.states.values():
                for partition in ranges:  # a partition added to the topic: every subscription from its start
                    state.positions.setdefault(partition, 0)
                state.topic_end = ends
            subscriptions = self.subscriptions
            participants = self._participants(subscriptions, ranges)
            self.batch_in_progress = True
        results: list[SubscriptionOutcome] = []
        try:
            if participants and any(start < end for start, end in ranges.values()):
                results = steps.deliver(context, self.topic, subscriptions, participants, batch_df, ranges,
                                        max_tasks=context.parallelism, shared=True)
            else:
                results = [SubscriptionOutcome(p.state.subscription, flow_state=p.state.flow,
                                               positions={q: max(p.state.positions.get(q, e), e)
                                                          for q, (_, e) in ranges.items()})
                           for p in participants]
        finally:
            with self.lock:
                stamp = self.apply(participants, results)
                self._set_frontier(ranges)
                self.batch_in_progress = False
            steps.release_pins(context, participants, results)
        steps.record(context, RoundResult(STREAM, self._writer, batch_id, self.kafka_topic, context.cluster, results),
                     time.monotonic() - started, stamp, possible_replay=self._replay_possible, park=self.retries.park)
        self._replay_possible = False
        self.healthy = True
        self.flush_moves()
        if self.catchup is not None:
            self.catchup.wake()
        counted = sum(r.counters.delivered for r in results), sum(r.counters.discarded for r in results)
        log.info("%s batch %d: %d subscription(s), delivered %d, discarded %d, %d behind, in %.1f s",
                 self.kafka_topic, batch_id, len(participants), *counted,
                 sum(1 for s in self.states.values() if s.catching_up), time.monotonic() - started)

    def _set_frontier(self, ranges: dict[int, tuple[int, int]]) -> None:
        """(lock held) The query is now at the end of `ranges`; the subscriptions behind it catch up."""
        self.frontier = {p: e for p, (_, e) in ranges.items()}
        for state in self.states.values():  # stopped early, or added (activated) during the batch
            state.topic_end = self.frontier
            if not state.busy and not state.catching_up and behind(state.positions, self.frontier):
                state.catching_up = True

    def _recorded_before(self, batch_id: int) -> bool:
        """True when the offsets table holds this query's positions for micro-batch `batch_id` (written last of a
        round's tables: the whole round was recorded), or when this process handed that round to the table
        writer and it is not written yet (a query restarted within storage.commitIntervalMs of the round: its
        replay would deliver nothing, and its empty slice would replace the round's PARKED and undelivered rows)."""
        part = Slice(self._writer, batch_id)
        if self.context.writer.holds(part):  # asked first: once it says False, the commit is visible
            return True
        return self.context.store.sql(OFFSETS, f"SELECT * FROM {OFFSETS} WHERE {part.predicate} LIMIT 1").num_rows > 0

    def _participants(self, subscriptions: list[Subscription], ranges: dict[int, tuple[int, int]]) -> list[Participant]:
        """The subscriptions at the query's position (lock held); those behind are sent to catch up."""
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
        return steps.participants(self.context, chosen, self.retries.parked_count)

    # -- shared by the query and catch-up ---------------------------------------------------------------------
    def apply(self, participants: list[Participant], results: list[SubscriptionOutcome]) -> int:
        """Take a round's outcomes into the states (lock held). Its parked messages go to the retry driver only
        once the round's rows are handed to the writer (`record`), so that a retry round's rows about them are
        always written after their PARKED rows.

        Returns the stamp (epoch ms) of the round's rows, taken here, before its subscriptions are free and before
        the moves asked during the round are applied: a move written by another thread before this round is
        recorded, or the subscriptions' next round recorded first, is still newer than the round's rows."""
        stamp = stamp_ms()
        by_id = {result.subscription.id: result for result in results}
        for participant in participants:
            state = participant.state
            state.busy = False
            result = by_id.get(state.id)
            if result is None:
                continue
            state.flow = result.flow_state
            for partition, offset in result.positions.items():
                state.positions[partition] = max(state.positions.get(partition, offset), offset)
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

    def stop(self) -> None:
        self.stopping = True
        if self.query is not None and self.query.isActive:
            self.query.stop()

