"""`herald run` and `jobs/deliver.py`: one streaming query per Kafka topic, shared by its ACTIVE subscriptions.

Beside the queries, on the driver: a catch-up thread per topic for subscriptions behind their query, the retry
driver for parked messages, the table writer, and (without `--once`) the configuration watcher.

With `once=True` each query processes what is available at the start (Trigger.AvailableNow), and the run
returns once every ACTIVE subscription has reached the end offsets that were current when it started (every
message delivered, discarded or parked) or is held at a message an ordered subscription is still retrying.
It then says how many messages are parked and when the next is due; the next run retries them.
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
from herald.engine.catchup import CatchUp
from herald.engine.context import EngineContext, now_ms
from herald.engine.positions import behind
from herald.engine.retries import RetryDriver
from herald.engine.rounds import position_rows
from herald.engine.session import get_or_create_session
from herald.engine.state import SubscriptionState, stored_held, stored_positions
from herald.engine.topic import TopicPipeline
from herald.source.kafka_offsets import partition_watermarks
from herald.source.stream import choose_connector
from herald.storage import Slice, TableWriter, open_store
from herald.storage.tables import OFFSETS

log = logging.getLogger(__name__)

START_BATCH_ID = -1  # offsets rows holding the position a subscription started from


class Runner:
    def __init__(self, config: HeraldConfig, only: list[str] | None = None, spark=None,
                 metrics_port: int | None = None) -> None:
        self.config = config
        self.only = only
        self.spark = spark
        self.context: EngineContext | None = None
        self.pipelines: dict[str, TopicPipeline] = {}
        self._stop = threading.Event()
        self._stored: dict[tuple[str, str], dict[int, int]] = {}
        self._held: dict = {}
        self._resting: dict[str, SubscriptionState] = {}  # suspended or removed while running
        self._lock = threading.RLock()  # the set of pipelines (the watcher changes it)
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
        context.retries = RetryDriver(context)
        context.retries.live_state = self.live_state
        self.context = context
        if self._metrics_port is not None:
            self._start_exporter(context)
        self._ensure_dead_letters()
        self._stored = stored_positions(store)
        self._held = stored_held(store)
        active = self.config.active_subscriptions(self.only)
        context.retries.load({s.id: self.config.topic_of(s).kafka_topic for s in self.config.subscriptions})
        context.retries.set_active(active)
        context.retries.start()
        by_topic: dict[str, list[Subscription]] = {}
        for subscription in active:
            by_topic.setdefault(subscription.topicName, []).append(subscription)
        for topic_name, subscriptions in by_topic.items():
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
                                           context.retries.parked_count, self.config.settings.metrics.prometheusHost)
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
            pipelines = list(self.pipelines.values())
            for pipeline in pipelines:
                if pipeline.move(move.subscription, move):
                    return
            resting = self._resting.get(move.subscription)
            if resting is not None:
                resting.positions.update(move.to_offsets)
                resting.carried = {}
            self._stored[(move.subscription, move.kafka_topic)] = {
                **self._stored.get((move.subscription, move.kafka_topic), {}), **move.to_offsets}
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

    def start_topic(self, topic_name: str, subscriptions: list[Subscription]) -> TopicPipeline:
        topic = self.config.topics[topic_name]
        states = [self.new_state(subscription) for subscription in subscriptions]
        pipeline = TopicPipeline(self.context, topic, states)
        pipeline.catchup = CatchUp(pipeline)
        pipeline.start()
        pipeline.catchup.start()
        self.pipelines[topic_name] = pipeline
        return pipeline

    def new_state(self, subscription: Subscription) -> SubscriptionState:
        """A subscription's state: where it is, from the offsets table, or where it starts (pinned there, so a
        `latest` subscription gets everything published after it was first seen, even across restarts)."""
        kafka_topic = self.config.topic_of(subscription).kafka_topic
        resting = self._resting.pop(subscription.id, None)
        if resting is not None and resting.subscription.topicName == subscription.topicName:
            resting.subscription = subscription
            return resting
        positions = dict(self._stored.get((subscription.id, kafka_topic), {}))
        marks = partition_watermarks(self.context.client_config, [kafka_topic])[kafka_topic]
        if not positions:
            which = 0 if subscription.startingOffsets == "earliest" else 1
            positions = {partition: pair[which] for partition, pair in marks.items()}
            self.context.writer.submit(Slice(f"start:{subscription.id}", START_BATCH_ID), [(OFFSETS, position_rows(
                subscription.id, kafka_topic, positions, f"start:{subscription.id}", START_BATCH_ID,
                dt.datetime.now(dt.timezone.utc)))])
            log.info("%s starts at the %s offsets %s", subscription.id, subscription.startingOffsets, positions)
        for partition, (low, _) in marks.items():
            positions.setdefault(partition, low)  # a partition added since: from its start
        state = SubscriptionState(subscription, positions=positions, carried=dict(self._held.get(subscription.id, {})))
        self._stored[(subscription.id, kafka_topic)] = positions
        return state

    # -- live configuration -----------------------------------------------------------------------------------
    def apply(self, config: HeraldConfig) -> None:
        """Apply a new configuration to the running job (from the watcher): topics and subscriptions added,
        removed, edited, suspended or activated. A removed or suspended subscription keeps its state here, so
        it continues from its position when it is back."""
        with self._lock:
            self._apply(config)

    def _apply(self, config: HeraldConfig) -> None:
        for section in ("kafka", "storage", "spark"):
            if getattr(config.settings, section) != getattr(self.config.settings, section):
                log.warning("herald.yaml: %s changed; that takes effect when the job restarts", section)
        self.config = config
        self.context.config = config
        self._ensure_dead_letters()
        wanted: dict[str, list[Subscription]] = {}
        for subscription in config.active_subscriptions(self.only):
            wanted.setdefault(subscription.topicName, []).append(subscription)
        for topic_name in list(self.pipelines):
            pipeline = self.pipelines[topic_name]
            if topic_name not in wanted or config.topics.get(topic_name) != pipeline.topic:
                self._stop_topic(topic_name)
        for topic_name, subscriptions in wanted.items():
            pipeline = self.pipelines.get(topic_name)
            if pipeline is None:
                log.info("starting topic %s", topic_name)
                self.start_topic(topic_name, subscriptions)
                continue
            ids = {subscription.id for subscription in subscriptions}
            for subscription_id in list(pipeline.states):
                if subscription_id not in ids:
                    state = pipeline.remove(subscription_id)
                    self._resting[subscription_id] = state
                    log.info("%s: no longer delivered (suspended or removed)", subscription_id)
            for subscription in subscriptions:
                if subscription.id in pipeline.states:
                    if pipeline.states[subscription.id].subscription != subscription:
                        pipeline.update(subscription)
                        log.info("%s: configuration changed", subscription.id)
                else:
                    pipeline.add(self.new_state(subscription))
                    log.info("%s: now delivered", subscription.id)
        self.context.retries.set_active(config.active_subscriptions(self.only))

    def _stop_topic(self, topic_name: str) -> None:
        pipeline = self.pipelines.pop(topic_name)
        log.info("stopping topic %s", topic_name)
        pipeline.stop()
        pipeline.catchup.stop()
        for state in pipeline.states.values():
            self._resting[state.id] = state

    # -- running ----------------------------------------------------------------------------------------------
    def run(self, once: bool = False, grace_s: float = 30.0) -> int:
        """Run until done (`once`) or interrupted; 0 when every query ended cleanly, 1 when one failed."""
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
            while not self._stop.is_set() and not self._failed():
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
            for pipeline in self.pipelines.values():
                pipeline.stop()
            return
        log.info("stopping: letting the rounds in progress finish (Ctrl-C again to stop now)")
        self._stop.set()

    def _failed(self) -> bool:
        with self._lock:
            return any(p.query is not None and not p.query.isActive and p.query.exception() is not None
                       for p in self.pipelines.values())

    def _done(self) -> bool:
        """--once: every query has read what was there at the start, every subscription has caught up (or is
        held at a message an ordered subscription keeps retrying), every message parked before the start and
        due has been tried again, and the tables are written."""
        deadline_s = self.config.settings.streaming.batch_deadline_s
        for pipeline in list(self.pipelines.values()):
            if pipeline.query.isActive:
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
        for pipeline in self.pipelines.values():
            query = pipeline.query
            while (query is not None and query.isActive and query.status.get("isTriggerActive")
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            pipeline.stop()
        for pipeline in self.pipelines.values():
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
        for pipeline in self.pipelines.values():
            for state in pipeline.states.values():
                if pipeline.frontier and behind(state.positions, pipeline.frontier):
                    print(f"{state.id} is held at {state.positions} by a message it is still retrying; "
                          "the next run continues from there")

    def _report_failures(self) -> int:
        failed = 0
        for pipeline in self.pipelines.values():
            error = pipeline.query.exception() if pipeline.query is not None else None
            if error is not None:
                failed += 1
                log.error("%s failed: %s", pipeline.kafka_topic, _short(error))
        return failed


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


def _short(error) -> str:
    """The root cause of a failed query: the last `SomethingError: ...` line of the (Java and Python) chain."""
    import re

    from herald.endpoint import mask_secrets

    lines = [line.strip() for line in str(getattr(error, "desc", None) or error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return mask_secrets(causes[-1] if causes else (lines[0] if lines else repr(error)))
