"""The topics a job delivers: read together, started again when they fail, and changed while the job runs.

Each topic of the configuration's ACTIVE subscriptions is a `TopicPipeline` (its subscriptions' states and its
catch-up); all of them are read by one streaming query, the shared read (`herald.engine.triggers.shared_read`). When the
set of topics changes, the read is replaced by one over the new set (`regroup`). A topic that cannot start (its Kafka
topic does not exist yet, Kafka cannot be reached) or that makes the read fail (deleted from Kafka) leaves the read and
is started again alone with backoff (`supervision`), joining the read when it can, while the others go on; a read that
fails for no topic of its own is started again from its checkpoint with backoff. A configuration change (the watcher's)
applies completely: what needs Kafka is asked first, and a topic that cannot start yet is retried. Subscriptions'
positions come from the `StateBook`; a `latest` subscription whose start was delayed starts at the first messages
published since it was first seen. Moves (retransmissions) are applied here, to running and resting subscriptions alike,
and recorded applied.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from herald.config import HeraldConfig, Subscription
from herald.config.model import Topic
from herald.engine.context import EngineContext, now_ms, stamp_ms
from herald.engine.round.pipeline import TopicPipeline
from herald.engine.round.result import moved_rows
from herald.engine.round.state import StateBook, SubscriptionState
from herald.engine.triggers import checkpoint as checkpoints
from herald.engine.triggers.catchup import CatchUp
from herald.engine.triggers.shared_read import SharedRead, read_root
from herald.engine.triggers.supervision import ONCE_RESTARTS, QuerySupervisor, short_error
from herald.engine.upkeep.moves import applied_tables
from herald.source.kafka_offsets import OffsetClient, UnknownTopicError, partition_watermarks, topic_ids
from herald.storage import Slice

log = logging.getLogger(__name__)


class Topics:
    """lock guards the set of pipelines (the watcher, the move watcher and the supervisor change it)."""

    def __init__(self, context: EngineContext, config: HeraldConfig, only: list[str] | None, book: StateBook,
                 supervisor: QuerySupervisor, retries) -> None:
        self.context = context
        self.retries = retries  # herald.engine.triggers.retry_driver.RetryDriver
        self.config = config
        self.only = only
        self.book = book
        self.supervisor = supervisor
        self.pipelines: dict[str, TopicPipeline] = {}
        self.read: SharedRead | None = None  # the query reading every topic in `pipelines`
        self.lock = threading.RLock()
        self._unstarted: dict[str, list[Subscription]] = {}  # topics that could not start yet
        self._first_seen: dict[str, int] = {}  # subscription id -> when this run first saw it ACTIVE (epoch ms)
        self._delayed: set[str] = set()  # subscriptions whose start failed at least once
        self._read_once = False  # a read was started in this run (a later one over another set starts afresh)
        self.stopping = threading.Event()  # the job stops: a regroup waiting for a micro-batch gives up (no lock)
        self._next_id_check = 0.0  # monotonic s: `check_topic_ids`

    def unstarted(self) -> list[str]:
        """Topics that could not start yet (tried again by `supervise`)."""
        return list(self._unstarted)

    def positions_now(self) -> dict[str, tuple[str, dict[int, int]]]:
        """subscription id -> (its Kafka topic, its positions now), for every subscription being delivered."""
        with self.lock:
            pipelines = list(self.pipelines.values())
        positions = {}
        for pipeline in pipelines:
            with pipeline.lock:
                for state in pipeline.states.values():
                    positions[state.id] = (pipeline.kafka_topic, dict(state.positions))
        return positions

    def apply_move(self, move) -> bool:
        """An operator moved a subscription's position (`herald retransmit`): move it here too, running,
        suspended or not started yet, and record it applied. False when the subscription is not this job's."""
        if not self._ours(move.subscription):
            return False
        with self.lock:
            for pipeline in list(self.pipelines.values()):
                if pipeline.move(move.subscription, move):
                    return True
            dropped = self.book.moved(move.subscription, move.kafka_topic, move.to_offsets)
            stamp = stamp_ms()
            released = moved_rows(self.config.subscription(move.subscription), dropped, stamp, move.writer,
                                  move.move_id, move.kafka_topic)
            self.context.writer.submit(Slice(move.writer, move.move_id), applied_tables(move, released, stamp))
        log.info("%s (not delivered now) moved to %s", move.subscription, move.to_offsets)
        return True

    def _ours(self, subscription_id: str) -> bool:
        """True for a subscription of this job's configuration (of those it was asked to run, with `only`)."""
        return any(s.id == subscription_id for s in self.config.subscriptions) and (
            not self.only or subscription_id in self.only)

    def live_state(self, subscription_id: str):
        """(topic lock, state) of a running subscription, or None."""
        with self.lock:
            pipelines = list(self.pipelines.values())
        for pipeline in pipelines:
            with pipeline.lock:
                state = pipeline.states.get(subscription_id)
            if state is not None:
                return pipeline.lock, state
        return None

    def start_topic(self, topic_name: str, subscriptions: list[Subscription]) -> TopicPipeline | None:
        """(lock held) Start delivering a topic: it joins the read at the next `regroup`. When it cannot start
        now (its Kafka topic does not exist yet, Kafka cannot be reached), it is tried again with backoff while
        the other topics go on."""
        topic = self.config.topics[topic_name]
        now = now_ms()
        for subscription in subscriptions:
            self._first_seen.setdefault(subscription.id, now)
        try:
            states = self._states(topic, subscriptions)
        except Exception as error:  # noqa: BLE001 - this topic waits and is tried again; the others go on
            self._unstarted[topic_name] = subscriptions
            self._delayed.update(subscription.id for subscription in subscriptions)
            self.topic_failed(topic_name, error)
            return None
        self._unstarted.pop(topic_name, None)
        for state in states:
            self.book.joined(state)
        pipeline = TopicPipeline(self.context, topic, states, self.retries)
        pipeline.catchup = CatchUp(pipeline)
        self.pipelines[topic_name] = pipeline
        pipeline.catchup.start()
        return pipeline

    def _states(self, topic: Topic, subscriptions: list[Subscription]) -> list[SubscriptionState]:
        """The states `subscriptions` of `topic` start from (see `StateBook`); raises when Kafka cannot say
        which partitions the topic has."""
        kafka_topic = topic.kafka_topic
        marks = partition_watermarks(self.context.client_config, [kafka_topic])[kafka_topic]
        return [self._state(subscription, kafka_topic, marks) for subscription in subscriptions]

    def _state(self, subscription: Subscription, kafka_topic: str, marks) -> SubscriptionState:
        delayed = subscription.id in self._delayed

        def offsets_for_time(since_ms: int) -> dict[int, int]:
            with OffsetClient(self.context.client_config) as client:
                return client.offsets_for_time(kafka_topic, since_ms)

        return self.book.state_for(subscription, kafka_topic, marks,
                                   since_ms=self._first_seen.get(subscription.id) if delayed else None,
                                   offsets_for_time=offsets_for_time)

    # -- keeping every topic going ------------------------------------------------------------------------------
    def topic_failed(self, topic_name: str, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else short_error(error)
        failure = self.supervisor.failed(topic_name, text)
        if failure.given_up:
            log.error("%s failed %d times: %s; this run gives it up and finishes the other topics", topic_name,
                      failure.failures, text)
        else:
            log.error("%s is not running: %s; starting it again in %.0f s (failure %d); the other topics go on",
                      topic_name, text, max(0.0, failure.retry_at - time.monotonic()), failure.failures)

    def supervise(self) -> None:
        """Notice a failed read or a topic gone from it, take the topics that caused it out of the read (they are
        started again alone, with backoff), start again what is due, and regroup the read when its set changed.
        With `--once`, a topic whose rounds keep failing (`ONCE_RESTARTS` in a row) is given up."""
        with self.lock:
            read = self.read
            if read is not None:
                for kafka_topic, why in list(read.gone.items()):  # deleted from Kafka: the read goes on without it
                    name = self._name_of(kafka_topic)
                    if name is not None:
                        self._leave(name, why)
                error = read.failure()
                if error is not None and not read.failure_handled:
                    read.failure_handled = True
                    self._read_failed(error)
                elif error is None and read.healthy:
                    for name in self._read_names():
                        self.supervisor.recovered(name)
            if self.context.once:
                for name, pipeline in self.pipelines.items():
                    if pipeline.failed_rounds > ONCE_RESTARTS and name not in self.supervisor.given_up():
                        log.error("%s: %d rounds in a row failed (%s); this run gives it up and finishes the other "
                                  "topics", name, pipeline.failed_rounds, pipeline.round_error)
                        self.supervisor.give_up(name, pipeline.round_error or "its rounds failed")
            for topic_name, subscriptions in list(self._unstarted.items()):
                if self.supervisor.due(topic_name):
                    self.supervisor.restarted(topic_name)
                    if self.start_topic(topic_name, subscriptions) is not None:
                        log.info("%s started: it joins the read", topic_name)
            given_up = self.supervisor.given_up()
            names = [name for name in self._read_names() if name not in given_up]
            if names and self.read is not None and self.read.failure() is not None and all(
                    self.supervisor.due(name) or self.supervisor.failing(name) is None for name in names):
                self.regroup(again=True)
                return
            self.regroup()

    def check_topic_ids(self) -> None:
        """Every `configPollMs`, ask Kafka for the ids of the topics read: one deleted and created again while the
        job runs, whose new log grew past where the read was before the job looked, shows only there (its end
        offsets never went back), and goes on from its new start (`TopicPipeline.check_log`). A topic whose id the
        job does not know yet (Kafka did not say when it started) is asked too: its subscriptions' rows may name
        the id their positions are in. Kafka is asked without the topics' lock; a broker that gives no ids, or
        cannot answer, changes nothing."""
        now = time.monotonic()
        if now < self._next_id_check:
            return
        self._next_id_check = now + self.context.config.settings.streaming.config_poll_s
        with self.lock:
            pipelines = {pipeline.kafka_topic: pipeline for pipeline in self.pipelines.values()}
        if not pipelines:
            return
        seen = {topic: pipeline.frontier_copy() for topic, pipeline in pipelines.items()}  # before Kafka is asked
        found = topic_ids(self.context.client_config, list(pipelines))
        changed = [topic for topic, topic_id in found.items() if topic_id != pipelines[topic].topic_id]
        if not changed:
            return
        try:
            marks = partition_watermarks(self.context.client_config, changed, 10.0)
        except Exception as error:  # noqa: BLE001 - deleted again, or Kafka cannot say: asked again next time
            log.info("topic ids changed for %s, but their offsets cannot be read now: %s", changed, short_error(error))
            return
        for topic in changed:
            pipelines[topic].check_log(marks[topic], found[topic], seen=seen[topic])

    def _read_names(self) -> list[str]:
        """(lock held) The topics the current read reads (by topic name), that are still delivered."""
        read = self.read
        if read is None:
            return []
        return [name for name, pipeline in self.pipelines.items()
                if read.pipelines.get(pipeline.kafka_topic) is pipeline]

    def _name_of(self, kafka_topic: str) -> str | None:
        """(lock held) The name of the topic read from `kafka_topic` by the current read, if any."""
        return next((name for name in self._read_names() if self.pipelines[name].kafka_topic == kafka_topic), None)

    def _read_failed(self, error: str) -> None:
        """(lock held) The read failed (or could not start): the topics Kafka does not know (one metadata request
        for all), or the only ones the error names, leave the read (started again alone, with backoff) and the
        others are read again at once; when no topic is to blame (a lost broker, a Python worker), every topic of
        the read waits for the backoff and the read starts again from its checkpoint."""
        names = self._read_names()
        by_kafka_topic = {self.pipelines[name].kafka_topic: name for name in names}
        blamed: dict[str, str] = {}
        try:
            partition_watermarks(self.context.client_config, list(by_kafka_topic), 10.0)
        except UnknownTopicError as unknown:
            blamed = {by_kafka_topic[t]: short_error(unknown) for t in unknown.missing if t in by_kafka_topic}
        except Exception:  # noqa: BLE001 - Kafka cannot say (down?): no topic is blamed for it
            pass
        if not blamed:
            named = [name for kafka_topic, name in by_kafka_topic.items() if re.search(
                rf"(?<![\w.-]){re.escape(kafka_topic)}(?![\w.])", error)]
            if 0 < len(named) < len(names):
                blamed = {name: error for name in named}
        for name, why in blamed.items():
            self._leave(name, why if why == error else f"{why} (the read failed: {error})")
        if not blamed:
            for name in names:
                self.topic_failed(name, error)

    def _leave(self, topic_name: str, why: str) -> None:
        """(lock held) A topic that fails leaves the read; it is started again alone, with backoff."""
        if topic_name not in self.pipelines:
            return
        subscriptions = [state.subscription for state in self.pipelines[topic_name].states.values()]
        self.stop_topic(topic_name)
        self._unstarted[topic_name] = subscriptions
        self.topic_failed(topic_name, why)

    def regroup(self, again: bool = False) -> None:
        """(lock held) Make the read read every topic in `pipelines`: when the set differs from the read's (or
        `again`: the same set after a failure, from its checkpoint), stop the read once its micro-batch in
        progress is delivered and start one over the set; nothing when the set is the read's. A read that cannot
        start is dealt with by `supervise`. A topic `--once` gave up is not read again."""
        given_up = self.supervisor.given_up()
        wanted = {pipeline.kafka_topic: pipeline for name, pipeline in self.pipelines.items() if name not in given_up}
        current = self.read
        if not again and current is not None and set(current.pipelines) == set(wanted) \
                and all(current.pipelines[t] is p for t, p in wanted.items()):
            return
        if current is None and not wanted:
            return
        if current is not None:
            if not self._stop_read(current, None):
                return  # the job stops meanwhile: its shutdown stops this read, within its grace period
            self.read = None
        if not wanted:
            return
        first = current is None and not self._read_once
        resume = first or (again and current is not None and set(current.pipelines) == set(wanted))
        read = SharedRead(self.context, wanted, resume=resume)
        self.read = read
        self._read_once = True
        try:
            read.start()
        except Exception as error:  # noqa: BLE001 - `supervise` finds whom to blame, or backs off
            read.start_error = short_error(error)
            log.error("the read of %d topic(s) could not start: %s", len(wanted), read.start_error)
            return
        for name in self._read_names():  # a failure before this read is over (a read failed, or a topic)
            if name not in given_up:
                self.supervisor.restarted(name)
        self._forget_other_checkpoints(read.checkpoint)

    def _forget_other_checkpoints(self, keep: str) -> None:
        """Other reads' checkpoints are stale once this one runs (positions are the offsets table), and so are
        the per-topic ones of Herald before the shared read (`<storage>/checkpoints/topics`)."""
        spark, storage = self.context.spark, self.context.config.storage_path
        root = read_root(storage)
        try:
            stale = [f"{root}/{name}" for name in checkpoints.children(spark, root) if f"{root}/{name}" != keep]
            for path in [*stale, f"{storage.rstrip('/')}/checkpoints/topics"]:
                checkpoints.remove(spark, path)
        except Exception as error:  # noqa: BLE001 - a stale checkpoint costs space only; tried at the next read
            log.warning("could not delete stale checkpoints under %s: %s", root, short_error(error))

    def stop_read(self, grace_s: float) -> None:
        """(the job stops) Let the read's micro-batch in progress be delivered, up to `grace_s`, and stop it."""
        with self.lock:
            read = self.read
        if read is not None:
            self._stop_read(read, grace_s)

    def delivering(self) -> bool:
        """A micro-batch of the shared read is still being delivered (its round can no longer be recorded once
        the table writer has closed)."""
        with self.lock:
            read = self.read
        return read is not None and not read.wait_idle(0)

    def _stop_read(self, read: SharedRead, grace_s: float | None) -> bool:
        """Deliver no new micro-batch (nor a topic's round not started yet), wait for the rounds in progress (as
        long as they take when `grace_s` is None: a new read must not start beside them) and stop the query.
        False, the query not stopped, when the job began stopping while it waited with no grace of its own (this
        waits under `lock`, which the shutdown takes: a micro-batch held by storage that is down must not hold
        a Ctrl-C)."""
        read.closing = True
        patience_s = self.context.config.settings.streaming.batch_deadline_s
        waited_s = 0.0
        while not read.wait_idle(min(1.0, patience_s) if grace_s is None else max(0.0, grace_s - waited_s)):
            if grace_s is not None:
                break
            if self.stopping.is_set():
                return False
            waited_s += min(1.0, patience_s)
            if waited_s % patience_s < 1.0:
                log.warning("waiting for the micro-batch in progress to be delivered (%.0f s so far)", waited_s)
        try:
            read.stop()
        except Exception as error:  # noqa: BLE001 - stopped or failed: either way it reads nothing more
            log.warning("stopping the read: %s", short_error(error))
        return True

    def wake_catchups(self) -> None:
        """Let every topic's catch-up look for work now (a held subscription may deliver again)."""
        for pipeline in list(self.pipelines.values()):
            pipeline.catchup.wake()

    # -- live configuration -----------------------------------------------------------------------------------
    def apply(self, config: HeraldConfig) -> None:
        """(lock held) Deliver `config`'s ACTIVE subscriptions: topics and subscriptions added, removed, edited,
        suspended or activated. A removed or suspended subscription keeps its state in the book, so it continues
        from its position when it is back. What needs Kafka is asked first: when Kafka cannot be asked, nothing
        changes and this raises (the watcher tries again); a topic that cannot start yet is started again with
        backoff, and the rest of the change applies."""
        wanted = by_topic(config.active_subscriptions(self.only))
        now = now_ms()
        for subscriptions in wanted.values():
            for subscription in subscriptions:
                self._first_seen.setdefault(subscription.id, now)
        joining = {name: [s for s in subscriptions if s.id not in self.pipelines[name].states]
                   for name, subscriptions in wanted.items()
                   if name in self.pipelines and config.topics.get(name) == self.pipelines[name].topic}
        try:  # what needs Kafka first: when it fails, nothing has changed and the watcher tries again
            kafka_topics = sorted({self.pipelines[name].kafka_topic for name, joiners in joining.items() if joiners})
            seen = {name: self.pipelines[name].frontier_copy() for name, joiners in joining.items() if joiners}
            marks = partition_watermarks(self.context.client_config, kafka_topics) if kafka_topics else {}
            kafka_ids = topic_ids(self.context.client_config, kafka_topics)
            joiners = {s.id: self._state(s, self.pipelines[name].kafka_topic, marks[self.pipelines[name].kafka_topic])
                       for name, subscriptions in joining.items() for s in subscriptions}
        except Exception:
            self._delayed.update(s.id for subs in wanted.values() for s in subs if not self._delivered(s.id))
            raise
        self.config = config
        self.context.config = config
        for topic_name in list(self.pipelines):
            pipeline = self.pipelines[topic_name]
            if topic_name not in wanted or config.topics.get(topic_name) != pipeline.topic:
                self.stop_topic(topic_name)
        for topic_name in list(self._unstarted):
            if topic_name not in wanted:
                del self._unstarted[topic_name]
                self.supervisor.forget(topic_name)
        for topic_name, subscriptions in wanted.items():
            pipeline = self.pipelines.get(topic_name)
            if pipeline is None:
                if topic_name in self._unstarted:
                    self._unstarted[topic_name] = subscriptions  # started with these when it can
                    continue
                log.info("starting topic %s", topic_name)
                self.start_topic(topic_name, subscriptions)
                continue
            ids = {subscription.id for subscription in subscriptions}
            for subscription_id in list(pipeline.states):
                if subscription_id not in ids:
                    self.book.rest(pipeline.remove(subscription_id))
                    log.info("%s: no longer delivered (suspended or removed)", subscription_id)
            for subscription in subscriptions:
                if subscription.id in pipeline.states:
                    if pipeline.states[subscription.id].subscription != subscription:
                        pipeline.update(subscription)
                        log.info("%s: configuration changed", subscription.id)
                else:
                    self.book.joined(joiners[subscription.id])
                    pipeline.add(joiners[subscription.id], marks[pipeline.kafka_topic],
                                 kafka_ids.get(pipeline.kafka_topic), seen=seen.get(topic_name))
                    log.info("%s: now delivered", subscription.id)

    def _delivered(self, subscription_id: str) -> bool:
        return any(subscription_id in pipeline.states for pipeline in self.pipelines.values())

    def stop_topic(self, topic_name: str) -> None:
        """(lock held) Stop delivering a topic; the read leaves it at the next `regroup`."""
        pipeline = self.pipelines.pop(topic_name)
        log.info("stopping topic %s", topic_name)
        pipeline.stop()
        pipeline.catchup.stop()
        self.supervisor.forget(topic_name)
        for subscription_id in list(pipeline.states):
            self.book.rest(pipeline.remove(subscription_id))


def by_topic(subscriptions: list[Subscription]) -> dict[str, list[Subscription]]:
    grouped: dict[str, list[Subscription]] = {}
    for subscription in subscriptions:
        grouped.setdefault(subscription.topicName, []).append(subscription)
    return grouped
