"""Endpoint lists (ANYCAST round-robin) and endpoint templates end to end: real broker, Spark, two HTTP
subscribers and Delta tables."""

from __future__ import annotations

import base64
import json
import time

import pytest

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import RETRIES, UNDELIVERED
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import Received, Reply, ScriptedSubscriber

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


def test_broadcast_reaches_every_endpoint_retries_only_the_failing_one_and_records_each_miss(
        broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": 0}, {"i": 1}, {"i": 2}])

    def scripted(request: Received) -> Reply:
        i = request.json()["i"]
        if request.path == "/two" and i == 0:
            return Reply([500, 500, 200][min(request.attempt, 2)])
        return Reply(400 if request.path == "/two" and i == 2 else 200)

    with ScriptedSubscriber(scripted) as one, ScriptedSubscriber(scripted) as two:
        endpoints = [one.url + "/one", two.url.replace("http://", "http://bob:pw-two@") + "/two"]
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"fan": {
            "endpoints": endpoints, "mode": "BROADCAST", "subscriptionPolicy": {"messageBackoff": 50}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sorted(r.json()["i"] for r in one.requests) == [0, 1, 2], "every message reached the healthy endpoint"
    assert sorted(r.json()["i"] for r in two.requests) == [0, 0, 0, 1, 2]
    assert [r.headers["Hermes-Retry-Count"] for r in sorted(two.requests, key=lambda r: r.at)
            if r.json()["i"] == 0] == ["0", "1", "2"]
    config = load_config(conf)
    subscription = config.subscription(f"{topic_name}.fan")
    figures = readout.metrics(config, subscription)
    assert (figures["delivered"], figures["discarded"]) == (2, 1)
    (row,) = DeltaRsStore(config.storage_path).read(UNDELIVERED, subscription.id).to_pylist()
    masked = two.url.replace("http://", "http://bob:*****@") + "/two"
    assert (row["offset"], row["http_status"], row["endpoint"]) == (2, 400, masked)
    assert "pw-two" not in json.dumps(row, default=str)


def test_a_broadcast_message_parked_at_one_endpoint_is_retried_there_only(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": 0, "replies": [[503], [503], [503], [200]]}, {"i": 1}])
    with ScriptedSubscriber(lambda request: Reply()) as one, ScriptedSubscriber() as two:  # one: always 200
        endpoints = [one.url + "/one", two.url + "/two"]
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"fan": {
            "endpoints": endpoints, "mode": "BROADCAST", "subscriptionPolicy": {"messageBackoff": 400}},
        }, settings={"streaming": {"parkAfterMs": 100}})
        runner = Runner(load_config(conf), spark=spark)
        assert runner.run(once=True) == 0
        runs = 1
        while sum(1 for r in two.requests if r.json()["i"] == 0) < 4 and runs < 6:
            time.sleep(0.5)
            assert Runner(load_config(conf), spark=spark).run(once=True) == 0
            runs += 1
    first = [r for r in sorted(one.requests + two.requests, key=lambda r: r.at) if r.json()["i"] == 0]
    assert [r.path for r in first].count("/one") == 1
    assert [r.headers["Hermes-Retry-Count"] for r in first if r.path == "/two"] == ["0", "1", "2", "3"]
    assert sorted(r.json()["i"] for r in one.requests) == [0, 1], "the endpoint that answered is not sent again"
    rows = DeltaRsStore(str(tmp_path / "storage")).read(RETRIES, f"{topic_name}.fan").to_pylist()
    parked = [row for row in rows if row["state"] == "PARKED"]
    assert parked and all(json.loads(row["targets"])[0][0] == 1 and len(json.loads(row["targets"])) == 1
                          for row in parked), "only endpoint 1 (/two) is left to reach"
    assert max(rows, key=lambda row: row["recorded_at"])["state"] == "DELIVERED"
