"""`herald run` and `jobs/deliver.py`: one streaming query reads every Kafka topic of the job's ACTIVE subscriptions.

Beside the query, on the driver: a catch-up thread per topic for subscriptions behind their query, the retry
driver for parked messages, the table writer, and (without `--once`) the configuration watcher. A topic that
fails, or cannot start, is started again alone with backoff while the others go on (`supervision`). One
job delivers from a storage path at a time: a second one exits at once, naming the first (`storage.lease`).

With `once=True` the query processes what is available at the start (Trigger.AvailableNow), and the run
returns once every ACTIVE subscription has reached the end offsets that were current when it started (every
message delivered, discarded or parked) or is held at a message an ordered subscription is still retrying.
It then says how many messages are parked and when the next is due; the next run retries them. A topic that
kept failing is given up: the run finishes the others and returns 1, naming it.
Otherwise everything runs until interrupted: the first Ctrl-C (or SIGTERM) lets the rounds in progress finish
(up to `grace_s` seconds) and stops; a second one stops at once. Either way nothing is lost: what was not
recorded is delivered again on the next start. A signal to the JVM of a session Herald built (spark-submit's,
whose child this Python is) stops the job the same way, instead of the JVM exiting under it (`signals`).
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import threading
import time

from herald.config import HeraldConfig
from herald.delivery.flow import FlowMode
from herald.engine.context import EngineContext, now_ms
from herald.engine.once import held, lag, rate_of, throttled
from herald.engine.round.pipeline import TopicPipeline
from herald.engine.round.positions import behind
from herald.engine.round.state import StateBook
from herald.engine.stored_state import StoredState
from herald.engine.triggers.retry_driver import RetryDriver
from herald.engine.triggers.supervision import QuerySupervisor
from herald.engine.triggers.topics import Topics, by_topic
from herald.engine.upkeep.control import ControlServer
from herald.engine.upkeep.moves import MoveWatcher
from herald.engine.upkeep.signals import JVM, PYTHON, JvmSignals, StopRequests
from herald.session import get_or_create_session, require_classic_session
from herald.source.kafka_offsets import partition_watermarks
from herald.source.stream import choose_connector
from herald.storage import TableWriter, open_store
from herald.storage.lease import LeaseHeld, StorageLease

log = logging.getLogger(__name__)


class Runner:
    def __init__(self, config: HeraldConfig, only: list[str] | None = None, spark=None,
                 metrics_port: int | None = None) -> None:
        self.config = config
        self.only = only
        self.spark = spark
        self.context: EngineContext | None = None
        self.topics: Topics | None = None
        self.retries: RetryDriver | None = None
        self.config_generation = 0  # configuration changes applied since the job started (tests wait on it)
        self._stop = threading.Event()
        self._stop_requests = StopRequests(self._stop_gracefully, self._stop_now, self._stop.is_set)
        self._owns_session = False  # Herald built the session: its JVM is this job's (spark-submit's, herald run's)
        self.watcher = None
        self.maintenance = None
        self.moves = None
        self.exporter = None
        self.dead_letters = None
        self.advisories = None  # the advisories Kafka topic's publisher (herald.yaml `advisories`)
        self._metrics_port = metrics_port if metrics_port is not None else config.settings.metrics.prometheusPort
        self._started_ms = 0
        self.lease: StorageLease | None = None
        self.control: ControlServer | None = None
        self._stopped_for: str | None = None
        self._tables_behind = False  # the table writer stopped with rounds unwritten: the run exits 1

    # -- starting ---------------------------------------------------------------------------------------------
    def start(self, once: bool) -> None:
        settings = self.config.settings
        if self.spark is None:
            from pyspark.sql import SparkSession

            self._owns_session = SparkSession.getActiveSession() is None  # not Databricks' (the platform's JVM)
            self.spark = get_or_create_session(settings.spark.master, settings.spark.conf, app_name="herald")
        require_classic_session(self.spark)  # raises ClassicSessionRequired on Spark Connect: no JVM here
        connector = choose_connector(self.spark, settings.kafka.connector)
        store = open_store(settings.storage.engine, self.config.storage_path, self.spark, settings.storage.options,
                           settings.storage.maintenanceRetentionHours)
        self.lease = StorageLease(store, on_lost=self._fail_stop)
        self.lease.acquire()  # raises LeaseHeld: another job delivers from this storage path
        self.lease.start()
        stored = StoredState.read(store)
        context = EngineContext(self.spark, self.config, connector, store, TableWriter(
            store, min_interval_s=settings.storage.commitIntervalMs / 1000,
            urgent_interval_s=settings.storage.urgentCommitMs / 1000, on_failed=self._fail_stop), once=once,
            on_unrecorded=self._fail_stop)
        context.catchup_slots = threading.Semaphore(max(1, context.parallelism // 2))
        active = self.config.active_subscriptions(self.only)
        self.retries = retries = RetryDriver(context, once=once, live_state=self._live_state)
        self.context = context
        book = StateBook(store, context.writer, stored.offsets, stored.held)
        self.topics = topics = Topics(context, self.config, self.only, book, QuerySupervisor(once), retries)
        context.priority.wakers.extend([retries.wake, topics.wake_catchups])
        context.discovery.wakers.extend([retries.wake, topics.wake_catchups])
        if settings.advisories is not None:
            from herald.engine.endpoints.advisories import AdvisoryPublisher

            self.advisories = AdvisoryPublisher(context.client_config, settings.advisories.topic)
            context.priority.listeners.append(self.advisories)
        if self._metrics_port is not None:
            self._start_exporter(context)
        self._ensure_dead_letters()
        context.discovery.configure(active)
        context.discovery.step()  # discovered sets: the first answers, awaited (each lookup within its timeoutMs)
        context.discovery.changed.append(lambda subscription_id, change: self._endpoints_changed())
        context.priority.configure(active)  # the pins (first ones recorded and told) before any round asks
        context.priority.start()  # picks up `herald unpin`, and retries a switch whose record failed
        context.discovery.start()
        if not once:  # a --once run sees no configuration change
            driver_host = self.spark.conf.get("spark.driver.host", "127.0.0.1")
            self.control = ControlServer(self.spark.conf.get("spark.driver.bindAddress", None) or driver_host,
                                         driver_host, settings.streaming.controlPort)
            self.control.publish(active, context.priority.pin_ids())
            self.control.start()
            context.control_url = self.control.url
            context.on_task_reports = self.control.note_reports
            context.priority.listeners.append(lambda advisory: self._publish_control())
            context.priority.changed.append(self._publish_control)  # a pin taken up late (§7), a group's change
        handed = {(move.subscription, move.move_id) for move in stored.moves if topics.apply_move(move)}
        retries.load({s.id: self.config.topic_of(s).kafka_topic for s in self.config.subscriptions}, stored.parked)
        retries.set_active(active)
        retries.start()
        with topics.lock:
            for topic_name, subscriptions in by_topic(active).items():
                topics.start_topic(topic_name, subscriptions)
            topics.regroup()  # one query reads them all
        if not once and settings.storage.maintenanceIntervalHours:
            from herald.storage.maintenance import PeriodicMaintenance

            self.maintenance = PeriodicMaintenance(store, settings.storage.maintenanceIntervalHours,
                                                   settings.storage.maintenanceRetentionHours,
                                                   settings.storage.history_retention())
            self.maintenance.start()
        if not once:
            from herald.engine.upkeep.config_watcher import ConfWatcher

            self.moves = MoveWatcher(store, topics.apply_move, settings.streaming.config_poll_s, handed)
            self.moves.start()

            self.watcher = ConfWatcher(self.config.conf_dir, self.config, self.apply,
                                       self.config.settings.streaming.config_poll_s)
            self.watcher.start()

    def _publish_control(self) -> None:
        """Tell running tasks which subscriptions (versions, pins) are delivered now."""
        if self.control is not None:
            with self.context.priority.lock:  # the pins and the versions told together, never an older pair
                self.control.publish(self.config.active_subscriptions(self.only), self.context.priority.pin_ids())

    def _endpoints_changed(self) -> None:
        """A discovered set changed (§7): the priority groups follow it."""
        self.context.priority.configure(self.config.active_subscriptions(self.only))

    def _live_state(self, subscription_id: str):
        """(topic lock, state) of a running subscription, or None (the retry driver starts from its flow)."""
        return self.topics.live_state(subscription_id) if self.topics is not None else None

    def _start_exporter(self, context: EngineContext) -> None:
        from herald.engine.upkeep.exporter import PrometheusExporter

        def end_offsets(topics: list[str]) -> dict[str, dict[int, int]]:
            marks = partition_watermarks(context.client_config, topics, 3.0)
            return {topic: {p: high for p, (_, high) in by_partition.items()} for topic, by_partition in marks.items()}

        self.exporter = PrometheusExporter(self._metrics_port, self.topics.positions_now, end_offsets,
                                           self.retries.parked_count, self.config.settings.metrics.prometheusHost,
                                           writer=context.writer, pins=context.priority.pins)
        context.round_listeners.append(self.exporter.observe)
        self.exporter.know(self.config.active_subscriptions(self.only))
        context.priority.listeners.append(self.exporter.advised)
        context.discovery.polled.append(self.exporter.polled)
        self.exporter.start()

    def _ensure_dead_letters(self) -> None:
        """Start the dead-letter publisher once some subscription has `onDiscard` (at start or added later)."""
        if self.dead_letters is None and any(s.onDiscard is not None for s in self.config.subscriptions):
            from herald.engine.upkeep.dead_letters import DeadLetterPublisher

            self.dead_letters = DeadLetterPublisher(self.context.client_config)
            self.context.round_listeners.append(self.dead_letters.observe)

    @property
    def pipelines(self) -> dict[str, TopicPipeline]:
        """The topics being delivered, by topic name."""
        return self.topics.pipelines if self.topics is not None else {}

    @property
    def supervisor(self) -> QuerySupervisor | None:
        return self.topics.supervisor if self.topics is not None else None

    def apply(self, config: HeraldConfig) -> None:
        """Apply a new configuration to the running job (from the watcher); see `Topics.apply`. Raises, changing
        nothing, when Kafka cannot be asked (the watcher tries again)."""
        with self.topics.lock:
            self.context.discovery.configure(config.active_subscriptions(self.only))  # before any round plans
            self.topics.apply(config)
            for section in ("kafka", "storage", "spark"):
                if getattr(config.settings, section) != getattr(self.config.settings, section):
                    log.warning("herald.yaml: %s changed; that takes effect when the job restarts", section)
            self.config = config
            self.context.config = config
            self._ensure_dead_letters()
            self.context.priority.configure(config.active_subscriptions(self.only))
            if self.exporter is not None:
                self.exporter.know(config.active_subscriptions(self.only))
            self.retries.set_active(config.active_subscriptions(self.only))
            self._publish_control()  # the rounds in progress learn of the change before the read is replaced
            self.topics.regroup()  # topics added, removed or edited: the read reads the new set
            self.config_generation += 1

    # -- running ----------------------------------------------------------------------------------------------
    def run(self, once: bool = False, grace_s: float = 30.0) -> int:
        """Run until done (`once`) or interrupted; 0 when every topic ran, 1 when some topic could not (its
        query kept failing, or could not start), when the job stopped itself (a lost lease, a round that could not
        be recorded) or when some round was not written to the tables before it stopped (storage down)."""
        skipped = [s.id for s in self.config.subscriptions if not s.active]
        if skipped:
            log.info("not running SUSPENDED subscriptions: %s", ", ".join(skipped))
        if not self.config.active_subscriptions(self.only):
            log.warning("no ACTIVE subscription to run%s", "" if once else " (yet): watching the configuration")
            if once:
                return 0
        self._started_ms = now_ms()
        try:
            self.start(once)
        except LeaseHeld as error:
            log.error("%s", error)
            print(f"not started: {error}")
            return 1
        except BaseException:
            self.shutdown(0.0)  # what did start stops, and the lease is given back
            raise
        previous, jvm_signals = {}, None
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
            if self._owns_session:  # until the job has stopped: the graceful stop needs the JVM
                jvm_signals = JvmSignals.install(self.spark, lambda: self._stop_requests.received(JVM))
        try:
            while not self._stop.is_set():
                self.topics.supervise()
                try:
                    self.topics.check_topic_ids()
                except Exception:  # noqa: BLE001 - a look at the topics' ids; the next one tries again
                    log.exception("checking the topics' ids failed")
                if once and self._done():
                    break
                self._stop.wait(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            try:
                self.shutdown(0.0 if self._stopped_for else grace_s)
            finally:
                if jvm_signals is not None:
                    jvm_signals.restore()
        if once:
            self._report_parked()
        if self._stopped_for is not None:
            return 1
        return self._exit_code(self._report_failures())

    def _exit_code(self, failures: int) -> int:
        """After a run that was not stopped for a reason: 1 when `failures` topics did not run to the end, or when
        some round was not written to the tables (storage did not take it before the writer closed, or it was
        handed over after: a part that outlived its stop deadline; the writer logged it), else 0."""
        unwritten = self._tables_behind or (self.context is not None and self.context.writer.abandoned > 0)
        if unwritten:
            print("the tables are behind: some rounds were not written before the job stopped; the next run "
                  "delivers their messages again")
        return 1 if failures or unwritten else 0

    def stop(self) -> None:
        """Ask a running `run()` to stop (as the first Ctrl-C does)."""
        self._stop.set()

    def _fail_stop(self, reason: str) -> None:
        """The job lost its storage lease, or a round could not be recorded: it writes nothing more (what it did
        since its last written round is done again by the next run) and stops now, with exit code 1."""
        log.error("%s: this job stops now and writes nothing more (exit code 1)", reason)
        self._stopped_for = reason
        if self.context is not None:
            self.context.writer.abandon()
            self.context.priority.freeze()
        self._stop.set()

    def _on_signal(self, signum, frame) -> None:
        self._stop_requests.received(PYTHON)

    def _stop_now(self) -> None:
        log.warning("second interrupt: stopping now")
        self._stop.set()
        for pipeline in list(self.pipelines.values()):
            pipeline.stop()
        read = self.topics.read if self.topics is not None else None
        if read is not None:
            read.stop()

    def _stop_gracefully(self) -> None:
        if not self._stop.is_set():  # one signal to both processes of the driver is told once
            log.info("stopping: letting the rounds in progress finish (Ctrl-C again to stop now)")
        self._stop.set()

    def _done(self) -> bool:
        """--once: the read has read what was there at its start, every subscription has caught up (or is
        held: at a message an ordered subscription keeps retrying, or by flow control slowing it past the run's
        patience, `throttled`), every message parked before the start and due has been tried again, and the
        tables are written. Topics given up do not count."""
        deadline_s = self.config.settings.streaming.batch_deadline_s
        flow = self.context.flow_settings
        given_up = self.supervisor.given_up()
        with self.topics.lock:
            if any(name not in given_up for name in self.topics.unstarted()):
                return False
            pipelines = [(name, p) for name, p in self.pipelines.items() if name not in given_up]
            read = self.topics.read
        if pipelines:  # the read of every topic left has read what was there at its start
            if read is None or read.failure() is not None or read.query is None or read.query.isActive:
                return False
            if any(read.pipelines.get(pipeline.kafka_topic) is not pipeline for _, pipeline in pipelines):
                return False  # a topic not read yet: the read is replaced at the next `supervise`
        # a pinned subscription whose pin changes hands is not throttled: its next endpoint starts a new flow state
        pins = self.context.priority.pin_ids()
        for name, pipeline in pipelines:
            if self.supervisor.failing(name):
                return False
            with pipeline.lock:
                for state in pipeline.states.values():
                    frontier = pipeline.frontier or {}
                    learnt_at_pin = pins.get(state.id, state.pin_id) == state.pin_id
                    if learnt_at_pin and throttled(state, frontier, deadline_s, flow):
                        continue  # its round in progress ends at its deadline when the run stops
                    if state.busy or (behind(state.positions, frontier) and not held(state, frontier, deadline_s)
                                      and not self.context.discovery.holds(state.id)):  # no endpoint: next run
                        return False
        return (self.retries.tried_since(self._started_ms, int(deadline_s * 1000))
                and self.context.writer.flush(1.0))  # everything else is done: write now, not at the interval

    def shutdown(self, grace_s: float = 30.0) -> None:
        deadline = time.monotonic() + grace_s
        if self.topics is not None:  # a regroup waiting for a micro-batch lets go of the topics' lock
            self.topics.stopping.set()
        if self.context is not None:  # a round waiting for storage to come back gives up at the deadline
            self.context.writer.stop_waiting_at(deadline)
        if self.watcher is not None:
            self.watcher.stop()
        if self.maintenance is not None:  # the table in progress ends on its own (below); no other starts
            self.maintenance.stop(timeout_s=0.0)
        if self.moves is not None:
            self.moves.stop()
        if self.context is not None:
            self.context.priority.stop()
            self.context.discovery.stop()
        with self.topics.lock if self.topics is not None else threading.RLock():
            pipelines = list(self.pipelines.values())
        if self.topics is not None:  # the micro-batch in progress finishes (up to the deadline), no other starts
            self.topics.stop_read(max(0.0, deadline - time.monotonic()))
        for pipeline in pipelines:
            pipeline.stop()
        for pipeline in pipelines:
            pipeline.catchup.stop()
        if self.context is not None:
            self.retries.stop()
            self.retries.close()  # parked messages are in the retries table for the next run
            # a job that lost the lease (its rounds would undo the holder's) or could not record a round writes
            # nothing more
            written = self.context.writer.close(0.0 if self._stopped_for else max(5.0, deadline - time.monotonic()))
            # a micro-batch that outlived the grace period still delivers: the closed writer refuses its round
            self._tables_behind = not written or (self.topics is not None and self.topics.delivering())
        if self.exporter is not None:
            self.exporter.stop()
        if self.dead_letters is not None:
            self.dead_letters.close(max(10.0, deadline - time.monotonic()))
        if self.advisories is not None:
            self.advisories.close(max(5.0, deadline - time.monotonic()))
        if self.control is not None:
            self.control.stop()
        try:  # the table in progress may take long: a second Ctrl-C here must not keep the lease from going back
            if self.maintenance is not None and not self.maintenance.stop(max(5.0, deadline - time.monotonic())):
                log.warning("a table's maintenance pass did not end before the job stopped; it is abandoned (nothing "
                            "is lost) and done again at the next pass")
        finally:
            if self.lease is not None:
                self.lease.release()

    def _report_parked(self) -> None:
        if self.dead_letters is not None and self.dead_letters.pending:
            print(f"{self.dead_letters.pending} dead letter(s) could not be published; they are in the undelivered "
                  "table and the next run does not publish them again")
        count, next_due_ms = self.retries.summary()
        if count:
            when = dt.datetime.fromtimestamp(next_due_ms / 1000, tz=dt.timezone.utc).isoformat(timespec="seconds")
            print(f"{count} message(s) parked for retry; the next is due at {when} (the next run retries them)")
        given_up = self.supervisor.given_up()
        for name, pipeline in self.pipelines.items():
            if name in given_up:
                continue
            for state in pipeline.states.values():
                if pipeline.frontier and behind(state.positions, pipeline.frontier):
                    if self.context.discovery.holds(state.id):
                        why = "it has no endpoint discovered (its lookups named none)"
                    elif state.flow.mode is not FlowMode.NORMAL:
                        why = (f"flow control: its subscriber keeps failing and is sent to at "
                               f"{rate_of(state, self.context.flow_settings):g} message(s) a second "
                               f"({state.flow.mode.value})")
                    else:
                        why = "a message it is still retrying"
                    left = lag(state.positions, pipeline.frontier)
                    print(f"{state.id} is held at {state.positions} with {left} message(s) left, by {why}; the next "
                          "run continues from there")
                    log.warning("%s is held with %d message(s) left (%s); the next run continues from %s", state.id,
                                left, why, state.positions)

    def _report_failures(self) -> int:
        """Log (and, for --once, print) the topics that were not running at the end; how many."""
        failed = self.supervisor.not_running() if self.supervisor is not None else {}
        for topic_name, error in sorted(failed.items()):
            log.error("%s could not be delivered: %s", topic_name, error)
            if self.context is not None and self.context.once:
                print(f"topic {topic_name} could not be finished: {error} (the next run continues from its "
                      "positions)")
        return len(failed)
