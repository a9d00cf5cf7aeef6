"""The topics a job delivers: started, started again when they fail, and changed while the job runs.

Each topic of the configuration's ACTIVE subscriptions is a `TopicPipeline` (its shared query and catch-up). A
topic that cannot start (its Kafka topic does not exist yet, Kafka cannot be reached) or whose query fails is
started again alone with backoff (`supervision`), while the others go on. A configuration change (the watcher's)
applies completely: what needs Kafka is asked first, and a topic that cannot start yet is retried. Subscriptions'
positions come from the `StateBook`; a `latest` subscription whose start was delayed starts at the first
messages published since it was first seen. Moves (retransmissions) are applied here, to running and resting
subscriptions alike, and recorded applied.
"""

from __future__ import annotations

import logging
import threading
import time

from herald.config import HeraldConfig, Subscription
from herald.config.model import Topic
from herald.engine.context import EngineContext, now_ms, stamp_ms
from herald.engine.moves import applied_tables
from herald.engine.rounds import moved_rows
from herald.engine.state import StateBook, SubscriptionState
from herald.engine.supervision import QuerySupervisor, short_error
from herald.engine.topic import TopicPipeline
from herald.source.kafka_offsets import OffsetClient, partition_watermarks
from herald.storage import Slice

log = logging.getLogger(__name__)


class Topics:
    """lock guards the set of pipelines (the watcher, the move watcher and the supervisor change it)."""

    def __init__(self, context: EngineContext, config: HeraldConfig, only: list[str] | None, book: StateBook,
                 supervisor: QuerySupervisor, retries) -> None:
        self.context = context
        self.retries = retries  # herald.engine.retries.RetryDriver
        self.config = config
        self.only = only
        self.book = book
        self.supervisor = supervisor
        self.pipelines: dict[str, TopicPipeline] = {}
        self.lock = threading.RLock()
        self._unstarted: dict[str, list[Subscription]] = {}  # topics that could not start yet
        self._first_seen: dict[str, int] = {}  # subscription id -> when this run first saw it ACTIVE (epoch ms)
        self._delayed: set[str] = set()  # subscriptions whose start failed at least once

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
                                  move.move_id)
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
        """(lock held) Start delivering a topic. When it cannot start now (its Kafka topic does not exist yet,
        Kafka cannot be reached), it is tried again with backoff while the other topics go on."""
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
        self.pipelines[topic_name] = pipeline
        pipeline.catchup.start()
        try:
            pipeline.start()
        except Exception as error:  # noqa: BLE001 - restarted by the supervisor
            pipeline.start_error = short_error(error)
            self.topic_failed(topic_name, error)
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
        """Notice failed queries and start again those whose backoff has passed."""
        with self.lock:
            for topic_name, pipeline in list(self.pipelines.items()):
                if self.supervisor.failing(topic_name) is None:
                    error = pipeline.failure()
                    if error is not None:
                        self.topic_failed(topic_name, error)
                    elif pipeline.healthy:
                        self.supervisor.recovered(topic_name)
                    continue
                if self.supervisor.due(topic_name):
                    self.supervisor.restarted(topic_name)
                    try:
                        pipeline.restart()
                        log.info("%s: query started again from its checkpoint", topic_name)
                    except Exception as error:  # noqa: BLE001 - backs off further
                        self.topic_failed(topic_name, error)
            for topic_name, subscriptions in list(self._unstarted.items()):
                if self.supervisor.due(topic_name):
                    self.supervisor.restarted(topic_name)
                    if self.start_topic(topic_name, subscriptions) is not None:
                        log.info("%s started", topic_name)

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
            marks = partition_watermarks(self.context.client_config, kafka_topics) if kafka_topics else {}
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
                    pipeline.add(joiners[subscription.id])
                    log.info("%s: now delivered", subscription.id)

    def _delivered(self, subscription_id: str) -> bool:
        return any(subscription_id in pipeline.states for pipeline in self.pipelines.values())

    def stop_topic(self, topic_name: str) -> None:
        pipeline = self.pipelines.pop(topic_name)
        log.info("stopping topic %s", topic_name)
        pipeline.stop()
        pipeline.catchup.stop()
        self.supervisor.forget(topic_name)
        for state in pipeline.states.values():
            self.book.rest(state)


def by_topic(subscriptions: list[Subscription]) -> dict[str, list[Subscription]]:
    grouped: dict[str, list[Subscription]] = {}
    for subscription in subscriptions:
        grouped.setdefault(subscription.topicName, []).append(subscription)
    return grouped
