"""Prometheus metrics of a running `herald run`, served on the driver (`--metrics-port` or
`metrics.prometheusPort`), fed from the same round summaries as the metrics table, so the two agree.

Per subscription (label `subscription`, the id `group.topic.name`):

- counters `herald_read_total`, `herald_delivered_total`, `herald_discarded_total`, `herald_filtered_total`,
  `herald_parked_total`, `herald_attempts_total`, `herald_lost_total` (offsets retention deleted unread),
  `herald_answers_total{class=2xx|3xx|4xx|5xx|timeout|other}`
  and, for BATCH subscriptions, `herald_batches_total{outcome=delivered|discarded}`:
  the sums of the metrics table's rows written since this process started (Prometheus counters start at 0 when
  the job restarts, as usual);
- gauges `herald_inflight_messages` (the most messages in flight at once in its last round),
  `herald_flow_rate_per_second` (the adaptive controller's sending rate after its last round, attempts per
  second), `herald_parked_messages` (parked retries now) and `herald_lag_messages{partition}` (Kafka's end
  offset minus its position, asked of Kafka at scrape time, at most every `lag_cache_s` seconds);
- the table writer: gauge `herald_table_writer_pending_rounds` (rounds waiting to be written) and counter
  `herald_table_writer_wait_seconds_total` (seconds delivery waited because storage was behind);
- histogram `herald_round_duration_seconds{topic, kind}`: how long each round took, from the micro-batch's
  start (or the catch-up or retry round's) to its rows handed to the writer; kind is stream, catchup or retry;
- priority pinned: gauge `herald_pinned_endpoint{endpoint}` (1 for the endpoint pinned now, password masked)
  and counter `herald_pin_advisories_total{type=pinned|unpinned, reason}`;
- discovery (docs/design.md §7): counter `herald_discovery_polls_total{result=ok|failed}`, one per lookup
  polled (a failure: no answer, an HTTP error, or garbage).

Every counter of every ACTIVE subscription exists, at 0, from the first scrape (`know`), so that `rate()` and
`increase()` work from the start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

ANSWER_CLASSES = {"2xx": "codes_2xx", "3xx": "codes_3xx", "4xx": "codes_4xx", "5xx": "codes_5xx",
                  "timeout": "timeouts", "other": "other_errors"}
_COUNTED = {"read": "Messages of the subscription's range read", "delivered": "Messages delivered",
            "discarded": "Messages discarded (undelivered rows)", "filtered": "Messages its filters passed over",
            "parked": "Messages parked for retry", "attempts": "Delivery attempts",
            "lost": "Offsets of its range Kafka deleted (retention) before they were read"}
_ROUND_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)

Positions = Callable[[], dict[str, tuple[str, dict[int, int]]]]
"""subscription id -> (its Kafka topic, partition -> position) for every subscription the job holds."""
EndOffsets = Callable[[list[str]], dict[str, dict[int, int]]]
"""Kafka topics -> partition -> end offset (high watermark)."""


class PrometheusExporter:
    """Counts rounds (`observe`, a round listener) and serves them with lag and parked gauges asked at scrape
    time. `port` 0 picks a free port (see `port` after `start`)."""

    def __init__(self, port: int, positions: Positions, end_offsets: EndOffsets,
                 parked: Callable[[str], int], host: str = "0.0.0.0", lag_cache_s: float = 5.0,
                 writer=None, pins: Callable[[], dict[str, str | None]] = dict) -> None:
        self.registry = CollectorRegistry()
        self._requested = (host, port)
        self.port: int | None = None
        self._server = None
        self._counters = {name: Counter(f"herald_{name}", text, ["subscription"], registry=self.registry)
                          for name, text in _COUNTED.items()}
        self._answers = Counter("herald_answers", "Answers to attempts, by class", ["subscription", "class"],
                                registry=self.registry)
        self._batches = Counter("herald_batches", "BATCH subscriptions: batches that ended, by outcome",
                                ["subscription", "outcome"], registry=self.registry)
        self._inflight = Gauge("herald_inflight_messages", "Most messages in flight at once in the last round",
                               ["subscription"], registry=self.registry)
        self._flow_rate = Gauge("herald_flow_rate_per_second", "The adaptive controller's rate after the last round",
                                ["subscription"], registry=self.registry)
        self._rounds = Histogram("herald_round_duration_seconds", "Duration of a delivery round", ["topic", "kind"],
                                 buckets=_ROUND_BUCKETS_S, registry=self.registry)
        self._advisories = Counter("herald_pin_advisories", "Priority pinned: pins given (pinned) and given up "
                                   "(unpinned), by reason", ["subscription", "type", "reason"], registry=self.registry)
        self._polls = Counter("herald_discovery_polls", "Discovery: lookups polled, by result (ok, failed)",
                              ["subscription", "result"], registry=self.registry)
        self.registry.register(_LiveCollector(positions, end_offsets, parked, lag_cache_s, writer, pins))

    def observe(self, result, duration_s: float) -> None:
        """A round's outcome (`herald.engine.round.result.RoundResult`) and its duration in seconds."""
        for outcome in result.outcomes:
            sid, counters = outcome.subscription.id, outcome.counters
            for name, counter in self._counters.items():
                counter.labels(sid).inc(getattr(counters, name))
            for label, field in ANSWER_CLASSES.items():
                self._answers.labels(sid, label).inc(getattr(counters, field))
            if outcome.subscription.deliveryType == "BATCH":
                self._batches.labels(sid, "delivered").inc(counters.batches_delivered)
                self._batches.labels(sid, "discarded").inc(counters.batches_discarded)
            if result.kind != "retry":
                self._inflight.labels(sid).set(counters.inflight_peak)
            self._flow_rate.labels(sid).set(outcome.flow_state.rate_per_s)
        self._rounds.labels(result.kafka_topic or "-", result.kind).observe(duration_s)

    def know(self, subscriptions) -> None:
        """The ACTIVE subscriptions: each gets its counters at 0 (Prometheus practice: a series exists before
        its first event)."""
        from herald.engine.endpoints.pin_group import PINNED, REASONS, UNPINNED

        for subscription in subscriptions:
            sid = subscription.id
            for counter in self._counters.values():
                counter.labels(sid)
            for label in ANSWER_CLASSES:
                self._answers.labels(sid, label)
            if subscription.deliveryType == "BATCH":
                for outcome in ("delivered", "discarded"):
                    self._batches.labels(sid, outcome)
            if subscription.priority is not None:
                for kind in (PINNED, UNPINNED):
                    for reason in REASONS:
                        self._advisories.labels(sid, kind, reason)
            if subscription.discovery is not None:
                for result in ("ok", "failed"):
                    self._polls.labels(sid, result)

    def polled(self, subscription_id: str, result: str) -> None:
        """A lookup of a discovering subscription was polled: result "ok" or "failed" (a discovery listener)."""
        self._polls.labels(subscription_id, result).inc()

    def advised(self, advisory) -> None:
        """A pin given or given up (`herald.engine.endpoints.pin_group.Advisory`, a priority listener)."""
        self._advisories.labels(advisory.subscription, advisory.type, advisory.reason).inc()

    def start(self) -> None:
        host, port = self._requested
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port
        log.info("Prometheus metrics on http://%s:%d/metrics", host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _LiveCollector:
    """Gauges asked for at scrape time: lag per partition and parked retries. A failure to reach Kafka leaves
    the lag out of that scrape (logged once a minute), never the scrape itself."""

    def __init__(self, positions: Positions, end_offsets: EndOffsets, parked: Callable[[str], int],
                 cache_s: float, writer=None, pins: Callable[[], dict[str, str | None]] = dict) -> None:
        self._positions, self._end_offsets, self._parked, self._cache_s = positions, end_offsets, parked, cache_s
        self._writer = writer  # herald.storage.TableWriter, or None
        self._pins = pins  # subscription id -> its pinned endpoint (masked), None while it changes hands
        self._lock = threading.Lock()
        self._ends: dict[str, dict[int, int]] = {}
        self._asked_at = float("-inf")
        self._warned_at = float("-inf")

    def describe(self):
        return []  # dynamic: nothing to check at registration

    def collect(self):
        positions = self._positions()
        lag = GaugeMetricFamily("herald_lag_messages", "Kafka's end offset minus the subscription's position",
                                labels=["subscription", "partition"])
        ends = self._end_offsets_cached(sorted({topic for topic, _ in positions.values()}))
        for sid, (topic, by_partition) in sorted(positions.items()):
            for partition, end in sorted(ends.get(topic, {}).items()):
                lag.add_metric([sid, str(partition)], max(0, end - by_partition.get(partition, end)))
        yield lag
        parked = GaugeMetricFamily("herald_parked_messages", "Messages parked for retry now", labels=["subscription"])
        for sid in sorted(positions):
            parked.add_metric([sid], self._parked(sid))
        yield parked
        pinned = GaugeMetricFamily("herald_pinned_endpoint", "Priority pinned: 1 for the endpoint pinned now "
                                   "(password masked)", labels=["subscription", "endpoint"])
        for sid, endpoint in sorted(self._pins().items()):
            if endpoint is not None:
                pinned.add_metric([sid, endpoint], 1)
        yield pinned
        if self._writer is not None:
            yield GaugeMetricFamily("herald_table_writer_pending_rounds", "Rounds waiting to be written to the "
                                    "tables", value=self._writer.pending)
            yield CounterMetricFamily("herald_table_writer_wait_seconds", "Seconds delivery waited because the "
                                      "tables were behind (storage slow or down)", value=self._writer.waited_s)

    def _end_offsets_cached(self, topics: list[str]) -> dict[str, dict[int, int]]:
        with self._lock:
            now = time.monotonic()
            if now - self._asked_at >= self._cache_s or set(topics) - set(self._ends):
                try:
                    self._ends = self._end_offsets(topics) if topics else {}
                    self._asked_at = now
                except Exception as error:  # noqa: BLE001 - the scrape goes on without the lag
                    if now - self._warned_at >= 60:
                        log.warning("Prometheus: the lag is left out, Kafka could not be asked: %s", error)
                        self._warned_at = now
                    return {}
            return self._ends
