"""The delivery loop of one Spark task (SERIAL): read, send, classify, retry or discard, report.

One loop owns all policy; worker threads only perform HTTP attempts. The loop:

1. takes records from the task's input while fewer than `inflight` messages are in flight (a message stays
   in flight from when it is read until it is delivered or discarded, retries included, as in Hermes);
2. starts attempts that are due, within the hard rate cap and the adaptive controller's rate and
   concurrency, discarding a message whose TTL has passed before it could be tried;
3. classifies each finished attempt and delivers, schedules a retry (backoff or Retry-After) or discards.

It returns when every record read is delivered or discarded, so the micro-batch may then be committed.
Time comes from an injectable monotonic `clock` and `sleep` (seconds) and `wall_clock_ms` (epoch milliseconds).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from herald.delivery.flow import FlowController, RateCap
from herald.delivery.headers import attempt_headers
from herald.delivery.message import Delivery, Record
from herald.delivery.outcome import Outcome, TransportFailure, Verdict, classify
from herald.delivery.plan import DeliveryPlan
from herald.delivery.policy import TTL_ELAPSED, GiveUp, Retry
from herald.delivery.report import Discarded, TaskReport
from herald.delivery.transport import HttpAnswer, HttpTransport

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5  # longest single wait of the loop when nothing else bounds it


def _now_ms() -> int:
    return int(time.time() * 1000)


class PartitionSender:
    """Delivers one task's records under `plan`; use once per task."""

    def __init__(
        self,
        plan: DeliveryPlan,
        transport: HttpTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ms: Callable[[], int] = _now_ms,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.plan = plan
        self.transport = transport or HttpTransport(plan.request_timeout_s, plan.socket_timeout_s)
        self.clock = clock
        self.wall_clock_ms = wall_clock_ms
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.report = TaskReport()
        self._due: list[tuple[float, int, Delivery]] = []  # heap by due time
        self._sequence = itertools.count()
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        self._in_flight = 0  # read, not yet delivered or discarded
        self._open_requests = 0

    def run(self, records: Iterable[Record]) -> TaskReport:
        plan, counters = self.plan, self.report.counters
        counters.started_ms = self.wall_clock_ms()
        flow = FlowController(plan.rate_per_s, plan.flow_settings, plan.flow_state, self.clock())
        cap = RateCap(flow.rate_per_s)
        source = iter(records)
        exhausted = False
        with ThreadPoolExecutor(max_workers=max(1, plan.inflight), thread_name_prefix="herald-send") as workers:
            while True:
                if flow.adjust(self.clock()):
                    cap.set_rate(flow.rate_per_s)
                if not exhausted:
                    exhausted = self._admit(source)
                wait_s = self._dispatch(workers, flow, cap, self.clock())  # reading may have blocked
                if exhausted and self._in_flight == 0:
                    break
                self._collect(flow, wait_s)
        self.transport.close()
        counters.finished_ms = self.wall_clock_ms()
        self.report.flow_state = flow.state()
        return self.report

    # -- 1. reading ---------------------------------------------------------------------------------------
    def _admit(self, source) -> bool:
        """Take records while there is room in flight; True when the input is exhausted.

        Each record's TTL starts when it is taken: reading the input may block while Spark fetches more.
        """
        counters = self.report.counters
        while self._in_flight < self.plan.inflight:
            record = next(source, None)
            if record is None:
                return True
            now = self.clock()
            counters.read += 1
            self.report.saw(record.topic, record.partition, record.offset)
            if record.error is not None:
                self._discard(Delivery(record, record.message_id, first_read_at=now, due_at=now),
                              f"Message could not be decoded: {record.error}", in_flight=False)
                continue
            if not record.matched:
                counters.filtered += 1
                continue
            delay_s = 0.0
            if self.plan.sending_delay_s > 0:
                age_s = max(0.0, (self.wall_clock_ms() - record.timestamp_ms) / 1000)
                delay_s = max(0.0, self.plan.sending_delay_s - age_s)
            delivery = Delivery(record, record.message_id, first_read_at=now, due_at=now + delay_s)
            self._schedule(delivery)
            self._in_flight += 1
            counters.inflight_peak = max(counters.inflight_peak, self._in_flight)
        return False

    def _schedule(self, delivery: Delivery) -> None:
        heapq.heappush(self._due, (delivery.due_at, next(self._sequence), delivery))

    # -- 2. sending ---------------------------------------------------------------------------------------
    def _dispatch(self, workers: ThreadPoolExecutor, flow: FlowController, cap: RateCap, now: float) -> float:
        """Start due attempts; return how long the loop may wait before something else becomes due."""
        wait_s = _IDLE_WAIT_S
        while self._due and self._open_requests < flow.concurrency(self.plan.inflight):
            due_at, _, delivery = self._due[0]
            if due_at > now:
                return min(wait_s, due_at - now)
            if now > self.plan.retry.deadline(delivery.first_read_at):
                heapq.heappop(self._due)
                last = f"; last: {delivery.last_reason}" if delivery.last_reason else ""
                self._discard(delivery, f"{TTL_ELAPSED}{last}")
                continue
            permit_wait_s = cap.try_acquire(now)
            if permit_wait_s > 0:
                return min(wait_s, permit_wait_s)
            heapq.heappop(self._due)
            self._open_requests += 1
            self.report.counters.attempts += 1
            workers.submit(self._attempt, delivery, delivery.attempts, now)
            delivery.attempts += 1
        return wait_s

    def _attempt(self, delivery: Delivery, retry_count: int, started_at: float) -> None:
        """Worker thread: one HTTP attempt; the result goes back to the loop."""
        record = delivery.record
        schema = self.plan.schema_headers
        headers = attempt_headers(self.plan.headers, delivery.message_id, retry_count,
                                  schema_id=record.schema_id if schema else None,
                                  schema_version=record.schema_version if schema else None)
        body = record.value or b""
        try:
            result = self.transport.post(self.plan.url, body, headers)
        except BaseException as error:  # noqa: BLE001 - handed to the loop, which re-raises it
            result = error
        self._finished.put((delivery, started_at, result))

    # -- 3. answers ---------------------------------------------------------------------------------------
    def _collect(self, flow: FlowController, wait_s: float) -> None:
        """Wait up to `wait_s` for finished attempts and handle all that are ready."""
        if self._open_requests == 0:
            self.sleep(wait_s)
            return
        try:
            item = self._finished.get(timeout=max(wait_s, 0.0005))
        except queue.Empty:
            return
        while True:
            self._handle(flow, *item)
            try:
                item = self._finished.get_nowait()
            except queue.Empty:
                return

    def _handle(self, flow: FlowController, delivery: Delivery, started_at: float, result) -> None:
        self._open_requests -= 1
        if isinstance(result, BaseException):
            raise result
        outcome = self._classify(result)
        counters = self.report.counters
        category = outcome.category.value
        setattr(counters, category, getattr(counters, category) + 1)
        flow.record(outcome.slows, started_at)
        delivery.last_status = outcome.status
        delivery.last_reason = outcome.reason
        if outcome.verdict is Verdict.DELIVERED:
            delivery.finish("delivered")
            self._in_flight -= 1
            counters.delivered += 1
            return
        now = self.clock()
        step = self.plan.retry.after_failure(
            outcome, delivery.attempts, delivery.first_read_at, delivery.backoff_s, now, self.rng
        )
        if isinstance(step, Retry):
            delivery.due_at, delivery.backoff_s = step.due_at, step.backoff_s
            self._schedule(delivery)
        else:
            assert isinstance(step, GiveUp)
            self._discard(delivery, step.reason)

    def _classify(self, result: HttpAnswer | TransportFailure) -> Outcome:
        if isinstance(result, TransportFailure):
            return classify(failure=result)
        return classify(
            result.status, result.retry_after, retry_client_errors=self.plan.retry.retry_client_errors,
            oauth=self.plan.oauth,
        )

    def _discard(self, delivery: Delivery, reason: str, in_flight: bool = True) -> None:
        """Give the message up: counted, and reported for the undelivered table. `in_flight`: it held a place."""
        delivery.finish("discarded")
        if in_flight:
            self._in_flight -= 1
        self.report.counters.discarded += 1
        record = delivery.record
        self.report.discarded.append(
            Discarded(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                message_id=delivery.message_id,
                reason=reason,
                http_status=delivery.last_status,
                attempts=delivery.attempts,
                message=record.text.encode() if record.text is not None else record.value,
                published_ms=record.timestamp_ms,
                discarded_ms=self.wall_clock_ms(),
                raw_value=record.raw,
                schema_id=record.schema_id,
                schema_version=record.schema_version,
            )
        )
        log.debug("discarded %s/%s/%s: %s", record.topic, record.partition, record.offset, reason)
