"""The retry driver: parked messages re-driven when due, on the driver, whether or not new messages arrive.

A message still being retried when its round ends (a subscription whose order is not promised) is parked:
its record and retry state go to the `retries` table and here. The driver wakes at the earliest due time and
runs a round over every ACTIVE subscription's due messages with the same sender as the tasks
(`TaskSender`, one lane per subscription, on the subscription's retry share of inflight and rate): each
message continues where it stopped (Hermes-Retry-Count keeps counting, Hermes-Message-Id is unchanged, the
TTL keeps running). What ends is recorded (DELIVERED, or DISCARDED with an undelivered row); what is still
retrying at the round's end is parked again with its new state. Like RocketMQ's retry queue, parked messages
stand outside the subscription's position.

The parked messages wait on the driver's disk, not in its memory (`herald.engine.triggers.parked.ParkedRegistry`). Each
subscription's due messages are re-driven in rounds of their own (at most `ROUND_MESSAGES` a round), up to
`PARALLEL_ROUNDS` at a time: a subscriber that holds its round to the deadline holds no other subscription's.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa

from herald.config import Subscription
from herald.delivery.flow import FlowMode, FlowState, FlowWindow
from herald.delivery.input import InputBatch
from herald.delivery.message import Record, RetryState
from herald.delivery.plan import LanePlan
from herald.delivery.policy import EndedBy
from herald.delivery.report import Discarded, Parked
from herald.delivery.sender import TaskSender
from herald.engine.context import EngineContext, now_ms, stamp_ms
from herald.engine.endpoints.pin_group import Pin, PinNews
from herald.engine.round import steps
from herald.engine.round.fanout import Participant
from herald.engine.round.owner import Round, RoundSource
from herald.engine.round.planner import lane_plan, named
from herald.engine.round.result import RETRY, RoundResult, SubscriptionOutcome, state_of_row
from herald.engine.round.state import SubscriptionState, stored_parked
from herald.engine.triggers.parked import ParkedMessage, ParkedRegistry
from herald.storage.tables import DELIVERED, DISCARDED, PARKED, epoch_ms

log = logging.getLogger(__name__)

_EARLY_MS = 50  # messages due this soon join a round that starts now
ROUND_MESSAGES = 10_000  # most messages of one subscription in one round (the rest wait for the next)
PARALLEL_ROUNDS = 4  # retry rounds at a time, each of one subscription's messages


class RetryDriver:
    """once: a `--once` run: each message is re-driven in at most one round of the run (due at the start, or
    parked by the run and due before it ends); parked again, it waits for the next run, so the run can end."""

    def __init__(self, context: EngineContext, once: bool = False,
                 live_state: Callable[[str], tuple | None] = lambda subscription_id: None) -> None:
        self.context = context
        self.once = once
        self._lock = threading.Lock()
        self._round_over = threading.Condition(self._lock)  # notified when a round ends
        self._registry = ParkedRegistry()  # the parked messages, on the driver's disk; a --once run marks tried
        self._active: dict[str, Subscription] = {}
        self._rounds = itertools.count(1)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: set[str] = set()  # subscriptions whose round is in progress
        self._closed = False  # stopped: its registry is gone
        self._summary: tuple[int, int | None] | None = None
        self._counts_at_close: dict[str, int] = {}  # what `parked_count` says once closed
        self._pool = ThreadPoolExecutor(PARALLEL_ROUNDS, thread_name_prefix="herald-retry-round")
        self._next_permit: dict[str, int] = {}  # subscription id -> when its rate allows a retry (epoch ms)
        # subscription id -> its retry rounds' open flow window, and when (monotonic s) it was that old
        self._windows: dict[str, tuple[FlowWindow, float]] = {}
        self._pin_of: dict[str, str] = {}  # subscription id -> the pin its last round went to (priority pinned)
        self.live_state = live_state
        """subscription id -> (its topic's lock, its running SubscriptionState), or None, so that a round starts
        from the subscription's flow state (one controller per subscription, as in Hermes: a subscriber slowed to
        heartbeat probes gets probes here too) and hands a change of mode back. The window its retry rounds
        count in is their own (`_windows`), carried from one retry round to the next as the reading path's is."""

    # -- the registry -----------------------------------------------------------------------------------------
    def load(self, topics: dict[str, str], rows: pa.Table | None = None) -> None:
        """Take in the messages parked by earlier runs (subscription id -> Kafka topic, for those that exist):
        `rows`, `stored_parked`'s answer when the caller read it already, else read here."""
        rows = rows if rows is not None else stored_parked(self.context.store)
        loaded = 0
        for batch in rows.to_batches(max_chunksize=10_000):  # to disk in batches: never every body in Python
            by_subscription: dict[tuple[str, str], list[tuple[Record, RetryState]]] = {}
            for row in batch.to_pylist():
                if row["state"] != PARKED or row["subscription"] not in topics:
                    continue
                record = Record(partition=row["partition"], offset=row["offset"],
                                timestamp_ms=epoch_ms(row["published_at"]) or 0, message_id=row["message_id"],
                                body=row["body"], avro=row["avro"], schema_id=row["schema_id"],
                                schema_version=row["schema_version"], key=row.get("key"), raw=row.get("raw_value"))
                # the Kafka topic it was read from (rows older than the column: the subscription's now)
                topic = row.get("kafka_topic") or topics[row["subscription"]]
                by_subscription.setdefault((row["subscription"], topic), []).append((record, state_of_row(row)))
            with self._lock:
                for (subscription_id, topic), items in by_subscription.items():
                    self._registry.put(subscription_id, topic, items)
                    loaded += len(items)
        if loaded:
            log.info("%d parked message(s) to retry", loaded)

    def set_active(self, subscriptions: list[Subscription]) -> None:
        """The subscriptions whose parked messages are re-driven (suspended ones wait)."""
        with self._lock:
            self._active = {subscription.id: subscription for subscription in subscriptions}
        self._wake.set()

    def park(self, subscription: Subscription, kafka_topic: str, parked: list[Parked]) -> None:
        with self._lock:
            if self._closed:  # a round that outlived the job's stop: its PARKED rows are for the next run
                return
            self._registry.put(subscription.id, kafka_topic, [(item.record, item.state) for item in parked])
        self._wake.set()

    def end_old_log(self, kafka_topic: str, firsts: dict[int, int], reason: str,
                    subscription: Subscription) -> tuple[SubscriptionOutcome | None, int]:
        """Kafka's log of `kafka_topic` went back (`herald.engine.round.resets`): its offsets from `firsts[partition]`
        on belong to new messages now. Takes the subscription's messages parked there out, now, and returns their
        DISCARDED outcome (`reason`, their bodies kept for the undelivered table; None when there were none) and the
        stamp (epoch ms) for its rows, taken under the same lock as the removal and as a retry round's stamp: a round
        that re-drove one of them before records its rows older; one that still holds one records nothing about it
        (`_resolve`). The caller (the reset, under its topic's lock) writes the rows."""
        with self._lock:
            stamp = stamp_ms()
            if self._closed:
                return None, stamp
            gone = self._registry.take_where(kafka_topic, firsts, [subscription.id]).get(subscription.id, [])
        return self._ended_by_reset(subscription, kafka_topic, gone, reason, stamp), stamp

    def ended_by_reset(self, subscription: Subscription, kafka_topic: str, messages: list, reason: str) \
            -> tuple[SubscriptionOutcome | None, int]:
        """`end_old_log` for messages of the old log that rounds recorded after the reset and never parked
        (`TopicPipeline.park`): their DISCARDED outcome and its rows' stamp, taken as `end_old_log` takes it."""
        with self._lock:
            stamp = stamp_ms()
        return self._ended_by_reset(subscription, kafka_topic, list(messages), reason, stamp), stamp

    @staticmethod
    def _ended_by_reset(subscription: Subscription, kafka_topic: str, gone: list, reason: str,
                        stamp: int) -> SubscriptionOutcome | None:
        """The DISCARDED outcome of parked messages (`ParkedMessage` or `Parked`: a record and its retry state) a
        reset ended (None: none)."""
        if not gone:
            return None
        outcome = SubscriptionOutcome(subscription, kafka_topic=kafka_topic)
        for message in gone:
            record, state = message.record, message.state
            outcome.discarded.append(Discarded(
                record.partition, record.offset, record.message_id or "", reason, EndedBy.RESET,
                state.last_status, state.attempts, record.body, record.timestamp_ms, stamp, raw_value=record.raw,
                schema_id=record.schema_id, schema_version=record.schema_version, key=record.key))
            outcome.resolved[(record.partition, record.offset)] = (record, DISCARDED)
        outcome.counters.discarded = len(gone)
        log.warning("%s: %d parked message(s) of %s end DISCARDED: %s", subscription.id, len(gone), kafka_topic,
                    reason)
        return outcome

    def parked_count(self, subscription_id: str) -> int:
        with self._lock:
            return self._counts_at_close.get(subscription_id, 0) if self._closed \
                else self._registry.count(subscription_id)

    def tried_since(self, since_ms: int, patience_ms: int) -> bool:
        """True when no round is running and every message of an ACTIVE subscription that was due at `since_ms`
        (epoch ms; a `--once` run's start) has been tried again, except those of a subscription whose rate (or
        flow control, probing a failing subscriber) makes its next attempt wait more than `patience_ms`: they
        wait for the next run."""
        with self._lock:
            if self._running:
                return False
            wait_until = now_ms() + patience_ms
            return not any(self._registry.untried_due_by(sid, since_ms) for sid in self._registry.subscriptions()
                           if sid in self._active and not self.context.discovery.holds(sid)  # no endpoint: next run
                           and self._next_permit.get(sid, 0) <= wait_until)

    def summary(self) -> tuple[int, int | None]:
        """(parked messages, the earliest next attempt in epoch ms, or None)."""
        with self._lock:
            return (self._summary or (0, None)) if self._closed else (self._registry.total(), self._registry.earliest())

    # -- the thread -------------------------------------------------------------------------------------------
    def wake(self) -> None:
        """Look for due messages now (a held subscription may deliver again)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="herald-retries", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the rounds in progress park what they have not finished."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._pool.shutdown(wait=True)

    def close(self) -> None:
        """(after `stop`) Delete the parked messages' file: they are in the retries table for the next run."""
        with self._lock:
            if not self._closed:
                self._summary = (self._registry.total(), self._registry.earliest())  # what `summary` says now
                self._counts_at_close = {sid: self._registry.count(sid) for sid in self._registry.subscriptions()}
                self._closed = True
                self._registry.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:  # what is due and the rounds taking it, at once
                due = self._due(PARALLEL_ROUNDS - len(self._running))
                self._running.update(due)
            if not due:
                self._wake.wait(self._sleep_s())
                self._wake.clear()
                continue
            for subscription_id, messages in due.items():
                self._pool.submit(self._round_of, subscription_id, messages)

    def _round_of(self, subscription_id: str, messages: list[ParkedMessage]) -> None:
        """One subscription's retry round, on a thread of the pool; the driver loop looks again when it ends."""
        try:
            self.run_round({subscription_id: messages})
        except Exception:  # noqa: BLE001 - the driver must outlive one bad round; the messages stay parked
            log.exception("%s: retry round failed; its messages stay parked and are tried again in 5 s",
                          subscription_id)
            self._postpone({subscription_id: messages}, 5000)
        finally:
            with self._lock:
                self._running.discard(subscription_id)
                self._round_over.notify_all()
            self._wake.set()

    def _sleep_s(self) -> float:
        """Seconds until a subscription not in a round has a message due (at most 1)."""
        with self._lock:
            dues = []
            for sid in self._registry.subscriptions():
                if sid not in self._active or sid in self._running or self.context.holds(sid):
                    continue  # held: what ends the hold wakes us; a round's end too
                next_due = self._registry.next_due(sid, untried_only=self.once)
                if next_due is not None:
                    dues.append(max(next_due, self._next_permit.get(sid, 0)))
        if not dues:
            return 1.0
        return min(1.0, max(0.0, (min(dues) - now_ms()) / 1000))

    def due_now(self) -> dict[str, list[ParkedMessage]]:
        """ACTIVE subscription id -> its parked messages due now (and allowed by its rate), for a round."""
        with self._lock:
            return self._due(len(self._active))

    def _due(self, rounds: int) -> dict[str, list[ParkedMessage]]:
        """(lock held) The due messages (at most `ROUND_MESSAGES` each) of at most `rounds` subscriptions not in a
        round now, those whose messages have waited longest first: chosen by their earliest due time, and only
        their messages read."""
        horizon = now_ms() + _EARLY_MS
        earliest = []
        for sid in self._registry.subscriptions():
            if sid not in self._active or sid in self._running or self._next_permit.get(sid, 0) > horizon \
                    or self.context.holds(sid):  # held: its pin changes hands, or it has no endpoint (§7)
                continue
            next_due = self._registry.next_due(sid, untried_only=self.once)
            if next_due is not None and next_due <= horizon:
                earliest.append((next_due, sid))
        return {sid: self._registry.due(sid, horizon, ROUND_MESSAGES, untried_only=self.once)
                for _, sid in sorted(earliest)[:max(0, rounds)]}

    def _postpone(self, due: dict[str, list[ParkedMessage]], delay_ms: int) -> None:
        later = now_ms() + delay_ms
        with self._lock:
            for subscription_id, messages in due.items():
                self._registry.postpone(subscription_id, messages, later)

    def _hand_back_flow(self, subscription_id: str, flow: FlowState, pin_id: str | None) -> None:
        """The round's controller changed mode (its probes succeeded, or its attempts failed): so does the
        subscription's. Its rate stays the reading path's, which holds the larger share. A round planned with
        the pin `pin_id` hands nothing back to a state that has moved to another pin since (a new endpoint starts
        a flow state of its own, `SubscriptionState.pinned_to`)."""
        live = self.live_state(subscription_id)
        if live is None:
            return
        lock, state = live
        with lock:
            if pin_id is not None and state.pin_id != pin_id:
                return
            if state.flow.mode is not flow.mode:
                state.flow = replace(state.flow, mode=flow.mode,
                                     rate_per_s=flow.rate_per_s if flow.mode is not FlowMode.NORMAL else None)

    def _window_now(self, subscription_id: str, now_s: float) -> FlowWindow:
        """The open window of the subscription's retry rounds at `now_s` (monotonic s): older by the time since
        the last one ended."""
        window, at_s = self._windows.get(subscription_id, (FlowWindow(), now_s))
        return replace(window, elapsed_ms=window.elapsed_ms + max(0, round((now_s - at_s) * 1000)))

    def _resolve(self, subscription_id: str, due: list[ParkedMessage], lane, outcome: SubscriptionOutcome,
                 targets: tuple = (), pin_lost: bool = False) -> None:
        """(lock held) Record what the round did to each of a subscription's `due` messages, and only that:
        delivered or discarded (it leaves the registry with a terminal row), attempted and still retrying (parked
        again with its new state, its BROADCAST endpoints named from the round's `targets`), or never attempted
        (a stop came first: it stays parked as it was, no row). A message the registry no longer holds as the
        round took it (a topic reset ended it, a round of the topic parked it again) gets no row from this round,
        nor an undelivered one. `pin_lost`: the round's pinned endpoint lost its pin meanwhile: a `--once` run
        re-drives its messages again, at the next pin."""
        delivered = set(lane.delivered)
        ended = {(item.partition, item.offset) for item in lane.discarded}
        again = {(item.record.partition, item.record.offset): replace(item, state=named(item.state, targets))
                 for item in lane.parked}
        registry = self._registry
        gone = set()
        for message in due:
            key = (message.record.partition, message.record.offset)
            if not registry.same(subscription_id, message):  # taken out meanwhile: its rows are another's
                gone.add(key)
                continue
            item = again.get(key)
            if item is not None:  # some endpoint still to reach, or still retrying
                if (item.state.attempts != message.state.attempts
                        or _progress(item.state) != _progress(message.state)):
                    outcome.parked.append(item)
                    registry.update(subscription_id, message, item.state, tried=self.once and not pin_lost)
                continue
            if key in ended:
                outcome.resolved[key] = (message.record, DISCARDED)
                registry.remove(subscription_id, message)
            elif key in delivered:
                outcome.resolved[key] = (message.record, DELIVERED)
                registry.remove(subscription_id, message)
        if gone:
            outcome.discarded = [item for item in outcome.discarded if (item.partition, item.offset) not in gone]
        outcome.counters.parked = len(outcome.parked)

    def run_round(self, due: dict[str, list[ParkedMessage]]) -> RoundResult:
        """Re-drive `due` (subscription id -> messages) once (`RetryRound`); record and return what happened."""
        return Round(self.context, RetryRound(self, due)).run()


class RetryRound(RoundSource):
    """One retry round of `driver`'s parked messages `due` (subscription id -> messages), re-driven on the driver
    (`herald.engine.round.owner.Round` runs it). A subscription that waits (no endpoint discovered, its pin changing
    hands: docs/design.md §6, §7) is postponed, not planned. Its pins go back before its outcomes are taken
    (`pins_back_first`): a pin the round's own news moved is lost to it (`RetryDriver._resolve`). Its parked
    messages stay in the driver's registry (`_resolve`, under the driver's lock): none is handed over (`park`)."""

    pins_back_first = True

    def __init__(self, driver: RetryDriver, due: dict[str, list[ParkedMessage]]) -> None:
        self.driver, self.due = driver, due
        self.report = None  # the sender's report, once delivered (`deliver` returned)
        self.rows = 0  # messages sent to the round

    def choose(self) -> list[Participant]:
        driver = self.driver
        with driver._lock:
            active = [driver._active[sid] for sid in self.due if sid in driver._active]
        chosen = steps.participants(driver.context, enumerate(SubscriptionState(s) for s in active), plan=self._plan,
                                    wait=lambda state: driver._postpone({state.id: self.due[state.id]}, 1000))
        return [replace(member, index=index) for index, member in enumerate(chosen)]  # lanes 0, 1 ...

    def _plan(self, state: SubscriptionState, pin: Pin | str | None, endpoints) -> LanePlan:
        """A subscription's lane: from its running state's flow (a new pin starts its own) and lag, with the
        retry rounds' own next permit and window."""
        driver, context, subscription = self.driver, self.driver.context, state.subscription
        messages = self.due[subscription.id]
        live = driver.live_state(subscription.id)
        if isinstance(pin, Pin) and driver._pin_of.get(subscription.id, pin.pin_id) != pin.pin_id:
            driver._next_permit.pop(subscription.id, None)  # a new pin: the old one's slowing is not its
            driver._windows.pop(subscription.id, None)
        if isinstance(pin, Pin):
            driver._pin_of[subscription.id] = pin.pin_id
            if live is not None:
                with live[0]:
                    live[1].pinned_to(pin.pin_id)
        flow = live[1].flow if live else FlowState()
        state.flow = FlowState(flow.mode, flow.rate_per_s, driver._next_permit.get(subscription.id, 0),
                               driver._window_now(subscription.id, time.monotonic()))
        if live is not None:  # its lag counts in its pending messages (priority overflow)
            with live[0]:
                state.positions, state.topic_end = dict(live[1].positions), dict(live[1].topic_end)
        return lane_plan(state, context.flow_settings, len(messages), retries=True, providers=context.oauth_providers,
                         pin=pin, endpoints=endpoints, former=context.former_endpoint,
                         resume={(m.record.partition, m.record.offset): m.state for m in messages})

    def deliver(self, participants: list[Participant]) -> list[SubscriptionOutcome]:
        driver, context = self.driver, self.driver.context
        rows = [(m.record, (member.index,)) for member in participants for m in self.due[member.state.id]]
        self.rows = len(rows)
        plan = steps.task_plan(context, "", {member.index: member.plan for member in participants})
        report = TaskSender(plan, stop=driver._stop.is_set).run([InputBatch(rows)])
        outcomes = []
        for member in participants:
            lane = report.lanes[member.index]
            outcomes.append(SubscriptionOutcome(
                member.state.subscription, counters=lane.counters, flow_state=lane.flow_state,
                discarded=lane.discarded, traced=lane.traced, pending=member.plan.pending,
                kafka_topic=_topic_of(self.due[member.state.id]),
                pin_news=PinNews(*lane.pin_news) if lane.pin_news is not None else None))
        self.report = report
        return outcomes

    def take(self, participants: list[Participant], results: list[SubscriptionOutcome]) -> int:
        """(pins given back) What each message became, and the rows' stamp, under the driver's lock: a reset's end
        of a message (`end_old_log`, stamped under this lock) is either older than these rows or not in them."""
        if self.report is None:
            return 0  # not delivered: nothing to take, and the round is not recorded
        driver, report = self.driver, self.report
        current_pins = driver.context.priority.pin_ids()
        for member in participants:
            lane, sid, pin, planned = report.lanes[member.index], member.state.id, member.pin, member.plan.flow_state
            if (lane.flow_state.mode is not planned.mode  # the round's controller decided a mode: a window closed
                    or lane.flow_state.window.number != planned.window.number):
                driver._hand_back_flow(sid, lane.flow_state, pin.pin_id if isinstance(pin, Pin) else None)
            permit_in_ms = lane.flow_state.permit_in_ms  # a duration from the round's end, as tasks report it
            driver._next_permit[sid] = now_ms() + permit_in_ms if permit_in_ms else 0
            driver._windows[sid] = (lane.flow_state.window, time.monotonic())
        with driver._lock:
            stamp = stamp_ms()
            for member, outcome in zip(participants, results):
                pin = member.pin
                pin_lost = isinstance(pin, Pin) and current_pins.get(member.state.id) != pin.pin_id
                driver._resolve(member.state.id, self.due[member.state.id], report.lanes[member.index], outcome,
                                member.plan.targets, pin_lost)
        return stamp

    def result(self, results: list[SubscriptionOutcome]) -> RoundResult:
        context = self.driver.context
        self.batch_id = next(self.driver._rounds)
        return RoundResult(RETRY, f"retry:{context.run_id}", self.batch_id, "", context.cluster, results)

    def after(self, results: list[SubscriptionOutcome], started: float) -> None:
        ended = sum(len(o.resolved) + len(o.parked) for o in results)
        log.info("retry round %d: %d message(s), %d delivered, %d discarded, %d parked again, %d not attempted "
                 "(still parked)", self.batch_id, self.rows, sum(o.counters.delivered for o in results),
                 sum(o.counters.discarded for o in results), sum(len(o.parked) for o in results), self.rows - ended)


def _topic_of(messages: list[ParkedMessage]) -> str | None:
    """The Kafka topic a subscription's parked messages were read from (its rows name it; None when mixed)."""
    topics = {message.kafka_topic for message in messages}
    return topics.pop() if len(topics) == 1 else None


def _progress(state: RetryState) -> list[tuple]:
    """A BROADCAST state's progress at each endpoint it still owes, whatever that endpoint's place in a round."""
    return [(target.endpoint or target.index, target.attempts, target.due_ms) for target in state.targets]
