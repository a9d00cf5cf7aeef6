"""`herald run` and `jobs/deliver.py`: one streaming query per Kafka topic, shared by its ACTIVE subscriptions.

Beside the queries, on the driver: a catch-up thread per topic for subscriptions behind their query, the retry
driver for parked messages, the table writer, and (without `--once`) the configuration watcher. A topic whose
query fails, or cannot start, is started again alone with backoff while the others go on (`supervision`).

With `once=True` each query processes what is available at the start (Trigger.AvailableNow), and the run
returns once every ACTIVE subscription has reached the end offsets that were current when it started (every
message delivered, discarded or parked) or is held at a message an ordered subscription is still retrying.
It then says how many messages are parked and when the next is due; the next run retries them. A topic that
kept failing is given up: the run finishes the others and returns 1, naming it.
Otherwise everything runs until interrupted: the first Ctrl-C (or SIGTERM) lets the rounds in progress finish
(up to `grace_s` seconds) and stops; a second one stops at once. Either way nothing is lost: what was not
recorded is delivered again on the next start.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import threading
import time

from herald.config import HeraldConfig, Subscription
from herald.config.model import Topic
from herald.engine.catchup import CatchUp
from herald.engine.context import EngineContext, now_ms
from herald.engine.positions import behind
from herald.engine.retries import RetryDriver
from herald.engine.session import get_or_create_session
from herald.engine.state import StateBook, SubscriptionState
from herald.engine.supervision import QuerySupervisor, short_error
from herald.engine.topic import TopicPipeline
from herald.source.kafka_offsets import OffsetClient, partition_watermarks
from herald.source.stream import choose_connector
from herald.storage import TableWriter, open_store

log = logging.getLogger(__name__)


class Runner:
    def __init__(self, config: HeraldConfig, only: list[str] | None = None, spark=None,
                 metrics_port: int | None = None) -> None:
        self.config = config
        self.only = only
        self.spark = spark
        self.context: EngineContext | None = None
        self.pipelines: dict[str, TopicPipeline] = {}
        self.book: StateBook | None = None
        self.supervisor = QuerySupervisor(once=False)
        self._unstarted: dict[str, list[Subscription]] = {}  # topics that could not start yet
        self._first_seen: dict[str, int] = {}  # subscription id -> when this run first saw it ACTIVE (epoch ms)
        self._delayed: set[str] = set()  # subscriptions whose start failed at least once
        self._stop = threading.Event()
        self._lock = threading.RLock()  # the set of pipelines (the watcher and the supervisor change it)
        self.watcher = None
        self.maintenance = None
        self.moves = None
        self.exporter = None
        self.dead_letters = None
        self._metrics_port = metrics_port if metrics_port is not None else config.settings.metrics.prometheusPort
        self._started_ms = 0

    # -- starting ---------------------------------------------------------------------------------------------
    def start(self, once: bool) -> None:
        settings = self.config.settings
        if self.spark is None:
            self.spark = get_or_create_session(settings.spark.master, settings.spark.conf, app_name="herald")
        connector = choose_connector(self.spark, settings.kafka.connector)
        store = open_store(settings.storage.engine, self.config.storage_path, self.spark, settings.storage.options)
        context = EngineContext(self.spark, self.config, connector, store, TableWriter(store), once=once)
        context.catchup_slots = threading.Semaphore(max(1, context.parallelism // 2))
        context.retries = RetryDriver(context, due_until_ms=self._started_ms if once else None)
        context.retries.live_state = self.live_state
        self.context = context
        self.supervisor = QuerySupervisor(once)
        if self._metrics_port is not None:
            self._start_exporter(context)
        self._ensure_dead_letters()
        self.book = StateBook(store, context.writer)
        active = self.config.active_subscriptions(self.only)
        context.retries.load({s.id: self.config.topic_of(s).kafka_topic for s in self.config.subscriptions})
        context.retries.set_active(active)
        context.retries.start()
        for topic_name, subscriptions in _by_topic(active).items():
            with self._lock:
                self.start_topic(topic_name, subscriptions)
        if not once and settings.storage.maintenanceIntervalHours:
            from herald.storage.maintenance import PeriodicMaintenance

            self.maintenance = PeriodicMaintenance(store, settings.storage.maintenanceIntervalHours,
                                                   settings.storage.maintenanceRetentionHours)
            self.maintenance.start()
        if not once:
            from herald.engine.moves import MoveWatcher
            from herald.engine.watcher import ConfWatcher

            self.moves = MoveWatcher(store, self.apply_move, settings.streaming.config_poll_s, now_ms())
            self.moves.start()

            self.watcher = ConfWatcher(self.config.conf_dir, self.config, self.apply,
                                       self.config.settings.streaming.config_poll_s)
            self.watcher.start()

    def _start_exporter(self, context: EngineContext) -> None:
        from herald.engine.exporter import PrometheusExporter

        def end_offsets(topics: list[str]) -> dict[str, dict[int, int]]:
            marks = partition_watermarks(context.client_config, topics, 3.0)
            return {topic: {p: high for p, (_, high) in by_partition.items()} for topic, by_partition in marks.items()}

        self.exporter = PrometheusExporter(self._metrics_port, self.positions_now, end_offsets,
                                           context.retries.parked_count, self.config.settings.metrics.prometheusHost,
                                           writer=context.writer)
        context.round_listeners.append(self.exporter.observe)
        self.exporter.start()

    def _ensure_dead_letters(self) -> None:
        """Start the dead-letter publisher once some subscription has `onDiscard` (at start or added later)."""
        if self.dead_letters is None and any(s.onDiscard is not None for s in self.config.subscriptions):
            from herald.engine.deadletter import DeadLetterPublisher

            self.dead_letters = DeadLetterPublisher(self.context.client_config)
            self.context.round_listeners.append(self.dead_letters.observe)

    def positions_now(self) -> dict[str, tuple[str, dict[int, int]]]:
        """subscription id -> (its Kafka topic, its positions now), for every subscription being delivered."""
        with self._lock:
            pipelines = list(self.pipelines.values())
        positions = {}
        for pipeline in pipelines:
            with pipeline.lock:
                for state in pipeline.states.values():
                    positions[state.id] = (pipeline.kafka_topic, dict(state.positions))
        return positions

    def apply_move(self, move) -> None:
        """An operator moved a subscription's position (`herald retransmit`): move it here too, running,
        suspended or not yet seen."""
        with self._lock:
            for pipeline in list(self.pipelines.values()):
                if pipeline.move(move.subscription, move):
                    return
            self.book.moved(move.subscription, move.kafka_topic, move.to_offsets)
        log.info("%s (not delivered now) moved to %s", move.subscription, move.to_offsets)

    def live_state(self, subscription_id: str):
        """(topic lock, state) of a running subscription, or None."""
        with self._lock:
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
            self._topic_failed(topic_name, error)
            return None
        self._unstarted.pop(topic_name, None)
        pipeline = TopicPipeline(self.context, topic, states)
        pipeline.catchup = CatchUp(pipeline)
        self.pipelines[topic_name] = pipeline
        pipeline.catchup.start()
        try:
            pipeline.start()
        except Exception as error:  # noqa: BLE001 - restarted by the supervisor
            pipeline.start_error = short_error(error)
            self._topic_failed(topic_name, error)
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

        state = self.book.state_for(subscription, kafka_topic, marks,
                                    since_ms=self._first_seen.get(subscription.id) if delayed else None,
                                    offsets_for_time=offsets_for_time)
        self._delayed.discard(subscription.id)
        return state

    # -- keeping every topic going ------------------------------------------------------------------------------
    def _topic_failed(self, topic_name: str, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else short_error(error)
        failure = self.supervisor.failed(topic_name, text)
        if failure.given_up:
            log.error("%s failed %d times: %s; this run gives it up and finishes the other topics", topic_name,
                      failure.failures, text)
        else:
            log.error("%s is not running: %s; starting it again in %.0f s (failure %d); the other topics go on",
                      topic_name, text, max(0.0, failure.retry_at - time.monotonic()), failure.failures)

    def _supervise(self) -> None:
        """Notice failed queries and start again those whose backoff has passed."""
        with self._lock:
            for topic_name, pipeline in list(self.pipelines.items()):
                if self.supervisor.failing(topic_name) is None:
                    error = pipeline.failure()
                    if error is not None:
                        self._topic_failed(topic_name, error)
                    elif pipeline.healthy:
                        self.supervisor.recovered(topic_name)
                    continue
                if self.supervisor.due(topic_name):
                    self.supervisor.restarted(topic_name)
                    try:
                        pipeline.restart()
                        log.info("%s: query started again from its checkpoint", topic_name)
                    except Exception as error:  # noqa: BLE001 - backs off further
                        self._topic_failed(topic_name, error)
            for topic_name, subscriptions in list(self._unstarted.items()):
                if self.supervisor.due(topic_name):
                    self.supervisor.restarted(topic_name)
                    if self.start_topic(topic_name, subscriptions) is not None:
                        log.info("%s started", topic_name)

    # -- live configuration -----------------------------------------------------------------------------------
    def apply(self, config: HeraldConfig) -> None:
        """Apply a new configuration to the running job (from the watcher): topics and subscriptions added,
        removed, edited, suspended or activated. A removed or suspended subscription keeps its state here, so
        it continues from its position when it is back. What needs Kafka is asked first: when Kafka cannot be
        asked, nothing changes and this raises (the watcher tries again); a topic that cannot start yet is
        started again with backoff, and the rest of the change applies."""
        with self._lock:
            self._apply(config)

    def _apply(self, config: HeraldConfig) -> None:
        wanted = _by_topic(config.active_subscriptions(self.only))
        now = now_ms()
        for subscriptions in wanted.values():
            for subscription in subscriptions:
                self._first_seen.setdefault(subscription.id, now)
        joining = {config.topics[name].kafka_topic for name, subscriptions in wanted.items()
                   if name in self.pipelines and config.topics.get(name) == self.pipelines[name].topic
                   and any(subscription.id not in self.pipelines[name].states for subscription in subscriptions)}
        try:
            marks = partition_watermarks(self.context.client_config, sorted(joining)) if joining else {}
        except Exception:
            self._delayed.update(s.id for subs in wanted.values() for s in subs if not self._delivered(s.id))
            raise
        for section in ("kafka", "storage", "spark"):
            if getattr(config.settings, section) != getattr(self.config.settings, section):
                log.warning("herald.yaml: %s changed; that takes effect when the job restarts", section)
        self.config = config
        self.context.config = config
        self._ensure_dead_letters()
        for topic_name in list(self.pipelines):
            pipeline = self.pipelines[topic_name]
            if topic_name not in wanted or config.topics.get(topic_name) != pipeline.topic:
                self._stop_topic(topic_name)
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
                    pipeline.add(self._state(subscription, pipeline.kafka_topic, marks[pipeline.kafka_topic]))
                    log.info("%s: now delivered", subscription.id)
        self.context.retries.set_active(config.active_subscriptions(self.only))

    def _delivered(self, subscription_id: str) -> bool:
        return any(subscription_id in pipeline.states for pipeline in self.pipelines.values())

    def _stop_topic(self, topic_name: str) -> None:
        pipeline = self.pipelines.pop(topic_name)
        log.info("stopping topic %s", topic_name)
        pipeline.stop()
        pipeline.catchup.stop()
        self.supervisor.forget(topic_name)
        for state in pipeline.states.values():
            self.book.rest(state)

    # -- running ----------------------------------------------------------------------------------------------
    def run(self, once: bool = False, grace_s: float = 30.0) -> int:
        """Run until done (`once`) or interrupted; 0 when every topic ran, 1 when some topic could not (its
        query kept failing, or could not start)."""
        skipped = [s.id for s in self.config.subscriptions if not s.active]
        if skipped:
            log.info("not running SUSPENDED subscriptions: %s", ", ".join(skipped))
        if not self.config.active_subscriptions(self.only):
            log.warning("no ACTIVE subscription to run%s", "" if once else " (yet): watching the configuration")
            if once:
                return 0
        self._started_ms = now_ms()
        self.start(once)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self._stop.is_set():
                self._supervise()
                if once and self._done():
                    break
                self._stop.wait(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.shutdown(grace_s)
        if once:
            self._report_parked()
        return 1 if self._report_failures() else 0

    def stop(self) -> None:
        """Ask a running `run()` to stop (as the first Ctrl-C does)."""
        self._stop.set()

    def _on_signal(self, signum, frame) -> None:
        if self._stop.is_set():
            log.warning("second interrupt: stopping now")
            for pipeline in list(self.pipelines.values()):
                pipeline.stop()
            return
        log.info("stopping: letting the rounds in progress finish (Ctrl-C again to stop now)")
        self._stop.set()

    def _done(self) -> bool:
        """--once: every query has read what was there at the start, every subscription has caught up (or is
        held at a message an ordered subscription keeps retrying), every message parked before the start and
        due has been tried again, and the tables are written. Topics given up do not count."""
        deadline_s = self.config.settings.streaming.batch_deadline_s
        given_up = self.supervisor.given_up()
        with self._lock:
            if any(name not in given_up for name in self._unstarted):
                return False
            pipelines = [(name, p) for name, p in self.pipelines.items() if name not in given_up]
        for name, pipeline in pipelines:
            if self.supervisor.failing(name) or pipeline.failure() is not None:
                return False
            if pipeline.query is None or pipeline.query.isActive:
                return False
            with pipeline.lock:
                for state in pipeline.states.values():
                    frontier = pipeline.frontier or {}
                    if state.busy or (behind(state.positions, frontier) and not _held(state, frontier, deadline_s)):
                        return False
        return self.context.retries.tried_since(self._started_ms) and self.context.writer.pending == 0

    def shutdown(self, grace_s: float = 30.0) -> None:
        deadline = time.monotonic() + grace_s
        if self.watcher is not None:
            self.watcher.stop()
        if self.maintenance is not None:
            self.maintenance.stop()
        if self.moves is not None:
            self.moves.stop()
        with self._lock:
            pipelines = list(self.pipelines.values())
        for pipeline in pipelines:
            query = pipeline.query
            while (query is not None and query.isActive and query.status.get("isTriggerActive")
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            pipeline.stop()
        for pipeline in pipelines:
            pipeline.catchup.stop()
        if self.context is not None:
            self.context.retries.stop()
            self.context.writer.close(max(5.0, deadline - time.monotonic()))
        if self.exporter is not None:
            self.exporter.stop()
        if self.dead_letters is not None:
            self.dead_letters.close(max(10.0, deadline - time.monotonic()))

    def _report_parked(self) -> None:
        if self.dead_letters is not None and self.dead_letters.pending:
            print(f"{self.dead_letters.pending} dead letter(s) could not be published; they are in the undelivered "
                  "table and the next run does not publish them again")
        count, next_due_ms = self.context.retries.summary()
        if count:
            when = dt.datetime.fromtimestamp(next_due_ms / 1000, tz=dt.timezone.utc).isoformat(timespec="seconds")
            print(f"{count} message(s) parked for retry; the next is due at {when} (the next run retries them)")
        given_up = self.supervisor.given_up()
        for name, pipeline in self.pipelines.items():
            if name in given_up:
                continue
            for state in pipeline.states.values():
                if pipeline.frontier and behind(state.positions, pipeline.frontier):
                    print(f"{state.id} is held at {state.positions} by a message it is still retrying; "
                          "the next run continues from there")

    def _report_failures(self) -> int:
        """Log (and, for --once, print) the topics that were not running at the end; how many."""
        failed = self.supervisor.not_running()
        for topic_name, error in sorted(failed.items()):
            log.error("%s could not be delivered: %s", topic_name, error)
            if self.context is not None and self.context.once:
                print(f"topic {topic_name} could not be finished: {error} (the next run continues from its "
                      "positions)")
        return len(failed)


def _by_topic(subscriptions: list[Subscription]) -> dict[str, list[Subscription]]:
    grouped: dict[str, list[Subscription]] = {}
    for subscription in subscriptions:
        grouped.setdefault(subscription.topicName, []).append(subscription)
    return grouped


def _held(state: SubscriptionState, frontier: dict[int, int], patience_s: float) -> bool:
    """An ordered subscription whose every partition behind `frontier` is stopped at a message (or batch) it has
    attempted and kept retrying for longer than `patience_s` since its first read: --once does not wait out its
    TTL. A message not attempted yet (a batch closed as the round ended, a subscription slowed by flow control)
    holds nothing: it is sent by the next catch-up round."""
    if not state.subscription.delivery_spec.ordered:
        return False
    carried, now = state.live_carried(), now_ms()
    for partition, end in frontier.items():
        position = state.positions.get(partition, end)
        if position >= end:
            continue
        blocking = carried.get((partition, position))
        if blocking is None or blocking.attempts == 0 or now - blocking.first_read_ms < patience_s * 1000:
            return False
    return True
