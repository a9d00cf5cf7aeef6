"""Dead-letter topics (beyond Hermes, as Kafka Connect users expect): a subscription's `onDiscard: {topic}`
also publishes every message it discards to that Kafka topic, from the driver.

Each dead letter keeps the original record's key and value (the exact bytes read: a JSON topic's value, an
AVRO topic's wire bytes) and carries headers saying why and where from (`HEADERS`). The undelivered table
remains the record: a dead letter that cannot be published loses nothing, is counted (`failed_total`) and
logged, and is tried again after the next round (at most `MAX_PENDING` wait: past that, while Kafka stays
unreachable, the oldest are dropped and counted, `dropped_total`: their undelivered rows stay). A letter still in
flight when a flush gives up is not forgotten: its delivery report, whenever it comes, counts it or puts it back
in line. Publishing uses the producer's own retries for up to 30 s,
spaced by librdkafka's exponential backoff with jitter from 1 s (seeds/002's initial backoff) up to 10 s, and
an idempotent producer, so a retried send is not written twice; what is still not published then waits for
the next round. A micro-batch replayed after a crash may
publish its dead letters again (at least once, like the deliveries themselves).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

HEADERS = ("herald.reason", "herald.http.status", "herald.ended.by", "herald.subscription", "herald.endpoint",
           "herald.batch.id", "herald.original.topic", "herald.original.partition", "herald.original.offset", "id")
"""The headers of a dead letter (herald.http.status, herald.endpoint (BROADCAST) and herald.batch.id (BATCH:
the Hermes-Batch-Id) only when known; `id` is the message id, Hermes-Message-Id)."""

PRODUCER_SETTINGS = {
    "enable.idempotence": True,
    "retry.backoff.ms": 1000,  # seeds/002: initial backoff 1 s, growing exponentially (jittered by librdkafka)
    "retry.backoff.max.ms": 10_000,
    "delivery.timeout.ms": 30_000,  # how long one dead letter is retried before it waits for the next round
}


MAX_PENDING = 100_000
"""Most dead letters waiting to be published (while their Kafka is unreachable); the oldest go first past it."""


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def dead_letters(result) -> list[DeadLetter]:
    """The dead letters of a round (`herald.engine.round.result.RoundResult`): one per discard of a subscription with
    `onDiscard` (for BROADCAST, one per endpoint that missed the message)."""
    letters = []
    for outcome in result.outcomes:
        target = outcome.subscription.onDiscard
        if target is None:
            continue
        for item in outcome.discarded:
            headers = [("herald.reason", item.reason), ("herald.http.status", item.http_status),
                       ("herald.ended.by", item.ended_by), ("herald.subscription", outcome.subscription.id),
                       ("herald.endpoint", item.endpoint), ("herald.batch.id", item.batch_id),
                       ("herald.original.topic", result.kafka_topic or None),
                       ("herald.original.partition", item.partition), ("herald.original.offset", item.offset),
                       ("id", item.message_id)]
            letters.append(DeadLetter(
                target.topic, item.key, item.raw_value if item.raw_value is not None else item.message,
                tuple((name, str(value).encode("utf-8")) for name, value in headers if value is not None)))
    return letters


class DeadLetterPublisher:
    """A round listener (`observe`) that publishes dead letters on its own thread, so a slow or unreachable
    Kafka never holds a round. `producer_factory` builds a confluent-kafka Producer from a config dict."""

    def __init__(self, client_config: dict[str, str], producer_factory: Callable[[dict], object] | None = None,
                 flush_timeout_s: float = 45.0) -> None:
        if producer_factory is None:
            from confluent_kafka import Producer as producer_factory  # noqa: N813
        self._producer = producer_factory({**client_config, **PRODUCER_SETTINGS})
        self._flush_timeout_s = flush_timeout_s
        self._pending: deque[DeadLetter] = deque()
        self._failed: deque[DeadLetter] = deque()  # failed or refused: published first at the next round
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.published_total = 0
        self.failed_total = 0  # publishes that failed (each is tried again after the next round)
        self.dropped_total = 0  # letters dropped past MAX_PENDING (their undelivered rows stay)
        self._in_flight = 0  # handed to the producer, no delivery report yet
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="herald-dead-letters", daemon=True)
        self._thread.start()

    def observe(self, result, duration_s: float) -> None:
        letters = dead_letters(result)
        with self._lock:
            self._pending.extend(letters)
            self._bound()
            if self._pending or self._failed:
                self._idle.clear()
                self._wake.set()

    def _bound(self) -> None:
        """(lock held) At most MAX_PENDING letters wait: the oldest beyond go, counted and logged."""
        over = len(self._failed) + len(self._pending) - MAX_PENDING
        if over > 0:
            for _ in range(over):
                (self._failed or self._pending).popleft()
            self.dropped_total += over
            log.warning("%d dead letter(s) dropped: %d wait for their Kafka already (their undelivered rows stay)",
                        over, MAX_PENDING)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._failed) + len(self._pending)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every dead letter handed over has been tried once more (True when none is left)."""
        self._wake.set()
        self._idle.wait(timeout_s)
        return self.pending == 0

    def close(self, timeout_s: float = 10.0) -> None:
        self.drain(timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._producer = None  # let librdkafka's threads go with it
        if self.pending:
            log.warning("%d dead letter(s) not published (they are in the undelivered table)", self.pending)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                batch = [*self._failed, *self._pending]
                self._failed, self._pending = deque(), deque()
            if batch:
                self._publish(batch)
            with self._lock:
                if not self._wake.is_set() and not self._in_flight:
                    self._idle.set()

    def _publish(self, batch: list[DeadLetter]) -> None:
        """Hand `batch` to the producer and flush. Each letter's delivery report counts it, or puts it back first
        in line for the next round, whenever it comes (during this flush or a later one)."""
        errors: list[str] = []

        def on_delivery(letter: DeadLetter):
            def report(error, _message) -> None:
                with self._lock:
                    self._in_flight -= 1
                    if error is None:
                        self.published_total += 1
                        return
                    self.failed_total += 1
                    self._failed.append(letter)  # first in line at the next round, in the order sent
                    errors.append(str(error))
            return report

        refused = []
        for letter in batch:
            try:
                self._producer.produce(letter.topic, value=letter.value, key=letter.key, headers=list(letter.headers),
                                       on_delivery=on_delivery(letter))
                with self._lock:
                    self._in_flight += 1
            except Exception as error:  # noqa: BLE001 - a full queue, a closed producer: kept for later
                refused.append(letter)
                errors.append(str(error))
            self._producer.poll(0)
        remaining = self._producer.flush(self._flush_timeout_s)
        with self._lock:
            self.failed_total += len(refused)
            self._failed.extend(refused)
            self._bound()
        if remaining:
            errors.append(f"{remaining} still in flight after {self._flush_timeout_s:g} s (their reports count "
                          "them when they come)")
        if errors:
            log.warning("dead letters not published yet, tried again after the next round: %s", errors[0])
