"""The Prometheus exporter on synthetic rounds (no Spark, no Kafka): counters add up the rounds' counters,
gauges follow the last round, lag and parked are asked at scrape time, and a Kafka failure never breaks a
scrape."""

from __future__ import annotations

from herald.config.model import Subscription
from herald.delivery.flow import FlowMode, FlowState
from herald.delivery.report import LaneCounters
from herald.engine.round.result import RoundResult, SubscriptionOutcome
from herald.engine.upkeep.exporter import PrometheusExporter
from tests.support.prometheus import samples


def subscription(name: str, delivery_type: str = "SERIAL") -> Subscription:
    return Subscription(topicName="g.t", name=name, endpoint="http://127.0.0.1:9/", deliveryType=delivery_type)


def outcome(name: str, delivery_type: str = "SERIAL", **counts) -> SubscriptionOutcome:
    return SubscriptionOutcome(subscription(name, delivery_type), counters=LaneCounters(**counts),
                               flow_state=FlowState(FlowMode.NORMAL, 42.5, 0))


def test_counters_sum_the_rounds_and_gauges_follow_the_last_one():
    positions = {"g.t.a": ("g_t", {0: 5, 1: 7}), "g.t.b": ("g_t", {0: 10, 1: 10})}
    exporter = PrometheusExporter(0, lambda: positions, lambda topics: {"g_t": {0: 10, 1: 12}},
                                  parked=lambda sid: 3 if sid == "g.t.a" else 0, host="127.0.0.1")
    exporter.start()
    try:
        exporter.observe(RoundResult("stream", "w", 1, "g_t", "c", [
            outcome("a", read=10, matched=8, delivered=6, discarded=1, attempts=9, codes_2xx=6, codes_5xx=2,
                    codes_4xx=1, inflight_peak=4),
            outcome("b", read=10, matched=0), outcome("c", "BATCH", read=300, matched=300, delivered=200,
                                                      discarded=100, batches_delivered=2, batches_discarded=1)]), 0.8)
        exporter.observe(RoundResult("retry", "r", 1, "", "c", [
            outcome("a", delivered=1, attempts=1, codes_2xx=1, timeouts=0, inflight_peak=1)]), 0.2)
        found = samples(exporter)
    finally:
        exporter.stop()
    a, b = (("subscription", "g.t.a"),), (("subscription", "g.t.b"),)
    assert found[("herald_delivered_total", a)] == 7 and found[("herald_attempts_total", a)] == 10
    assert found[("herald_filtered_total", a)] == 2 and found[("herald_filtered_total", b)] == 10
    assert found[("herald_discarded_total", a)] == 1
    c = "g.t.c"
    assert found[("herald_batches_total", (("outcome", "delivered"), ("subscription", c)))] == 2
    assert found[("herald_batches_total", (("outcome", "discarded"), ("subscription", c)))] == 1
    assert found[("herald_delivered_total", (("subscription", c),))] == 200, "messages, not batches"
    assert not any(name == "herald_batches_total" and ("subscription", "g.t.a") in labels for name, labels in found)
    assert found[("herald_answers_total", (("class", "2xx"), ("subscription", "g.t.a")))] == 7
    assert found[("herald_answers_total", (("class", "5xx"), ("subscription", "g.t.a")))] == 2
    assert found[("herald_inflight_messages", a)] == 4, "a retry round does not replace the reading path's figure"
    assert found[("herald_flow_rate_per_second", a)] == 42.5
    assert found[("herald_lag_messages", (("partition", "0"), ("subscription", "g.t.a")))] == 5
    assert found[("herald_lag_messages", (("partition", "1"), ("subscription", "g.t.a")))] == 5
    assert found[("herald_lag_messages", (("partition", "1"), ("subscription", "g.t.b")))] == 2
    assert found[("herald_parked_messages", a)] == 3 and found[("herald_parked_messages", b)] == 0
    stream = (("kind", "stream"), ("topic", "g_t"))
    assert found[("herald_round_duration_seconds_count", stream)] == 1
    assert found[("herald_round_duration_seconds_sum", stream)] == 0.8
    assert found[("herald_round_duration_seconds_bucket", (("kind", "stream"), ("le", "1.0"), ("topic", "g_t")))] == 1
    assert found[("herald_round_duration_seconds_bucket", (("kind", "stream"), ("le", "0.5"), ("topic", "g_t")))] == 0


def test_a_kafka_failure_leaves_the_lag_out_of_the_scrape_not_the_scrape():
    asked = []

    def unreachable(topics):
        asked.append(topics)
        raise RuntimeError("no broker")

    exporter = PrometheusExporter(0, lambda: {"g.t.a": ("g_t", {0: 1})}, unreachable, parked=lambda sid: 0,
                                  host="127.0.0.1", lag_cache_s=0)
    exporter.start()
    try:
        exporter.observe(RoundResult("stream", "w", 1, "g_t", "c", [outcome("a", delivered=2)]), 0.1)
        found = samples(exporter)
    finally:
        exporter.stop()
    assert asked and found[("herald_delivered_total", (("subscription", "g.t.a"),))] == 2
    assert not any(name == "herald_lag_messages" for name, _ in found)


def test_discovery_polls_are_counted_by_result_and_exist_at_0_from_the_first_scrape():
    discovering = Subscription.model_validate({"topicName": "g.t", "name": "d", "endpoints": {
        "discovery": {"urls": ["http://lookup:4161/lookup?topic=t"]}}})
    exporter = PrometheusExporter(0, lambda: {}, lambda topics: {}, parked=lambda sid: 0, host="127.0.0.1")
    exporter.know([discovering, subscription("plain")])
    exporter.start()
    try:
        first = samples(exporter)
        exporter.polled("g.t.d", "ok")
        exporter.polled("g.t.d", "ok")
        exporter.polled("g.t.d", "failed")
        later = samples(exporter)
    finally:
        exporter.stop()
    polls = "herald_discovery_polls_total"
    assert first[(polls, (("result", "ok"), ("subscription", "g.t.d")))] == 0
    assert first[(polls, (("result", "failed"), ("subscription", "g.t.d")))] == 0
    assert not any(name == polls and ("subscription", "g.t.plain") in labels for name, labels in first)
    assert later[(polls, (("result", "ok"), ("subscription", "g.t.d")))] == 2
    assert later[(polls, (("result", "failed"), ("subscription", "g.t.d")))] == 1
