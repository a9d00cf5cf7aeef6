"""Priority groups end to end (pinned endpoints): real broker, Spark, real HTTP subscribers, Delta tables.

A pinned subscription sends everything to one endpoint; when that endpoint has refused for `timeoutMs` the pin
moves to the next one, after the old one's last request ended, with no message lost and a new Herald-Pin-Id."""

from __future__ import annotations

import json

import pytest

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import open_store
from tests.integration.test_deadletter_e2e import read_back
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import Received, Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _advisories(conf) -> list[dict]:
    config = load_config(conf)
    store = open_store("deltalake", config.storage_path)
    return sorted(store.read("advisories").to_pylist(), key=lambda row: row["timestamp"])


def test_a_pin_that_refuses_for_its_timeout_moves_to_the_next_endpoint_losing_nothing(
        broker, spark, topic_name, tmp_path):
    advisories_topic = f"{topic_name}.advisories"
    broker.create_topics({topic_name: 2, advisories_topic: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(40)])
    with ScriptedSubscriber(lambda request: Reply(503)) as primary, ScriptedSubscriber() as standby:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoints": [primary.url.replace("http://", "http://ops:pw-primary@") + "/orders",
                          standby.url + "/orders"],
            "priority": {"policy": "pinned", "timeoutMs": 1500},
            "subscriptionPolicy": {"messageBackoff": 100, "inflightSize": 4, "messageTtl": 300}}},
            settings={"advisories": {"topic": advisories_topic}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0  # re-drives what the old pin failed
    assert primary.requests, "the first endpoint was pinned first"
    delivered = sorted(r.json()["i"] for r in standby.requests)
    assert set(delivered) == set(range(40)), "every message reached the new pin"
    old_pin = {r.headers["Herald-Pin-Id"] for r in primary.requests}
    new_pin = {r.headers["Herald-Pin-Id"] for r in standby.requests}
    assert len(old_pin) == 1 and len(new_pin) == 1 and old_pin != new_pin
    assert max(r.at for r in primary.requests) < min(r.at for r in standby.requests), \
        "no request to the new pin before the old pin's last one"
    rows = _advisories(conf)
    assert [(row["type"], row["reason"]) for row in rows] == [
        ("pinned", "start"), ("unpinned", "timeout"), ("pinned", "timeout")]
    assert (rows[1]["timestamp"] - rows[0]["timestamp"]).total_seconds() >= 1.5, "the pin held for its timeout"
    assert rows[0]["endpoint"] == rows[1]["endpoint"] == primary.url.replace("http://", "http://ops:*****@") + \
        "/orders", "the password is masked"
    assert rows[2]["endpoint"] == standby.url + "/orders" and rows[2]["pin_id"] in new_pin
    config = load_config(conf)
    assert readout.undelivered(config, config.subscription(f"{topic_name}.orders"), limit=5) == []
    published = [json.loads(m.value()) for m in read_back(broker.bootstrap_servers, advisories_topic, 3)]
    assert [(a["type"], a["reason"]) for a in published] == [
        ("io.herald.advisory.v1.pinned", "start"), ("io.herald.advisory.v1.unpinned", "timeout"),
        ("io.herald.advisory.v1.pinned", "timeout")]
    assert published[2]["pinned_id"] == rows[2]["pin_id"] and "pw-primary" not in str(published)


def test_an_ordered_pinned_subscription_keeps_its_order_across_the_switch(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(12)])

    def primary_reply(request: Received) -> Reply:
        return Reply(200 if request.json()["i"] < 5 else 500)

    with ScriptedSubscriber(primary_reply) as primary, ScriptedSubscriber() as standby:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoints": [primary.url + "/a", standby.url + "/b"],
            "priority": {"policy": "pinned", "timeoutMs": 1000},
            "subscriptionPolicy": {"messageBackoff": 100, "inflightSize": 1, "messageTtl": 300}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    accepted = [r.json()["i"] for r in primary.requests if r.json()["i"] < 5]
    assert accepted == [0, 1, 2, 3, 4]
    assert {r.json()["i"] for r in primary.requests} == {0, 1, 2, 3, 4, 5}, "the old pin only retried message 5"
    assert [r.json()["i"] for r in standby.requests] == list(range(5, 12)), "in order from where the old pin stopped"
    assert standby.requests[0].headers["Hermes-Retry-Count"] != "0", "message 5 kept its retry count"


def test_the_pin_survives_kill_9_and_herald_unpin_moves_it_while_running(broker, spark, topic_name, tmp_path,
                                                                          capsys):
    import os
    import signal
    import subprocess
    import sys

    from herald.cli import main
    from tests.support.herald_env import wait_until
    from tests.support.running import RunningHerald

    broker.create_topics({topic_name: 2})
    subscription_id = f"{topic_name}.orders"
    with ScriptedSubscriber(lambda r: Reply(delay_ms=30)) as primary, ScriptedSubscriber() as standby:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoints": [primary.url + "/orders", standby.url + "/orders"],
            "priority": {"policy": "pinned"}, "subscriptionPolicy": {"inflightSize": 2}}},
            settings={"streaming": {"maxOffsetsPerTrigger": 10}})
        job = subprocess.Popen([sys.executable, "-m", "herald", "run", "--conf", str(conf)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(30)])
            assert wait_until(lambda: len(primary.requests) >= 8, timeout_s=180), job.stderr.read1().decode()
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and Python workers, at once
            job.wait()
        first_pin = {r.headers["Herald-Pin-Id"] for r in primary.requests}
        assert len(first_pin) == 1
        with RunningHerald(conf, spark) as running:  # the restarted job
            assert wait_until(lambda: {r.json()["i"] for r in primary.requests} >= set(range(30)), timeout_s=180), \
                "the restarted job delivers the rest to the same pin"
            assert {r.headers["Herald-Pin-Id"] for r in primary.requests} == first_pin, "same pin id after kill -9"
            capsys.readouterr()
            assert main(["unpin", "--conf", str(conf), subscription_id, "--json"]) == 0
            assert json.loads(capsys.readouterr().out)["pinId"] in first_pin
            assert wait_until(lambda: running.runner.context.priority.pin_ids().get(subscription_id)
                              not in first_pin, timeout_s=60), "the running job took the unpin (at its next poll)"
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(30, 50)])
            assert wait_until(lambda: {r.json()["i"] for r in primary.requests + standby.requests}
                              >= set(range(50)), timeout_s=180), "delivered after the unpin"
    assert standby.requests, "the pin moved to the next endpoint"
    assert max(r.at for r in primary.requests) < min(r.at for r in standby.requests)
    assert len({r.headers["Herald-Pin-Id"] for r in standby.requests} | first_pin) == 2
    assert main(["priority", "--conf", str(conf), subscription_id, "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["endpoint"] == standby.url + "/orders" and state["pin_reason"] == "admin"
    assert state["pin_id"] in {r.headers["Herald-Pin-Id"] for r in standby.requests}

def test_an_overflow_endpoint_takes_a_share_of_a_large_backlog_only(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(300)])
    with ScriptedSubscriber(lambda r: Reply(delay_ms=10)) as east, ScriptedSubscriber() as west:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoints": [east.url + "/orders", {"url": west.url + "/orders", "minPending": 100}],
            "priority": {"policy": "overflow"}, "subscriptionPolicy": {"inflightSize": 10}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert west.requests, "a backlog of 300 reaches minPending 100: the overflow endpoint takes a share"
        assert max(r.json()["i"] for r in west.requests) < 300 - 100 + 10, \
            "once fewer than 100 are pending, only the first endpoint is served (10 in flight may straddle it)"
        assert sorted(r.json()["i"] for r in east.requests + west.requests) == list(range(300))
        served_before = len(west.requests)
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(300, 320)])
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert len(west.requests) == served_before, "a backlog of 20: nothing for the overflow endpoint"
    assert {r.json()["i"] for r in east.requests} >= set(range(300, 320))
    config = load_config(conf)
    shown = readout.metrics(config, config.subscription(f"{topic_name}.orders"))
    assert shown["pending"] == 20, "herald metrics shows the pending messages of the last round"
