"""Endpoint lists (ANYCAST round-robin) and endpoint templates end to end: real broker, Spark, two HTTP
subscribers and Delta tables."""

from __future__ import annotations

import base64

import pytest

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def test_anycast_spreads_over_the_endpoints_and_a_retry_moves_on(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    documents = [{"i": i, **({"replies": [[503], [200]]} if i == 4 else {})} for i in range(12)]
    produce(broker.bootstrap_servers, topic_name, documents)
    with ScriptedSubscriber() as one, ScriptedSubscriber() as two:
        endpoints = [one.url.replace("http://", "http://ann:pw-one@") + "/one", two.url + "/two"]
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"spread": {
            "endpoints": endpoints, "subscriptionPolicy": {"messageBackoff": 50, "inflightSize": 1}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    first_one = {r.json()["i"] for r in one.requests if r.headers["Hermes-Retry-Count"] == "0"}
    first_two = {r.json()["i"] for r in two.requests if r.headers["Hermes-Retry-Count"] == "0"}
    assert first_one | first_two == set(range(12)) and not first_one & first_two
    assert abs(len(first_one) - len(first_two)) <= 1, "first attempts take turns"
    retried = sorted((r for r in one.requests + two.requests if r.json()["i"] == 4), key=lambda r: r.at)
    # the subscribers script answers per path: 503 at each endpoint's first sight of it, then 200
    assert [r.headers["Hermes-Retry-Count"] for r in retried] == ["0", "1", "2"]
    assert [r.path for r in retried] in (["/one", "/two", "/one"], ["/two", "/one", "/two"]), \
        "each retry went to the other endpoint"
    assert {r.headers.get("Authorization") for r in one.requests} == {
        "Basic " + base64.b64encode(b"ann:pw-one").decode()}
    assert all("Authorization" not in r.headers for r in two.requests), "credentials stay with their endpoint"


def test_a_template_endpoint_is_filled_per_message_and_a_message_without_the_field_is_undelivered(
        broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"order": {"id": "A 1"}}, {"order": {}}, {"order": {"id": 42}}])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoint": sub.url + "/orders/{order.id}/events"}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sorted(r.path for r in sub.requests) == ["/orders/42/events", "/orders/A%201/events"]
    config = load_config(conf)
    (row,) = readout.undelivered(config, config.subscription(f"{topic_name}.orders"), limit=5)
    assert row["reason"] == "Endpoint template placeholder {order.id}: the message has no such field"
    assert row["attempts"] == 0 and row["offset"] == 1
