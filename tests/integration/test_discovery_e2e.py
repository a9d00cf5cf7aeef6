"""Discovery end to end (docs/design.md §7): real broker, Spark, a lookup service and HTTP subscribers on
127.0.0.1, Delta tables. The set follows the lookups while `herald run` runs (an endpoint added, one removed, an
outage keeps the set, an empty set makes messages wait, nothing lost or discarded), and `herald run --once`
delivers a BROADCAST subscription to every endpoint of lookupd's producers."""

from __future__ import annotations

import time

import pytest

from herald import readout
from herald.config import load_config
from herald.engine.endpoints.discoveries import recorded_endpoints
from herald.engine.runner import Runner
from herald.storage import open_store
from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.lookup import Lookup
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _received(*subscribers) -> set[int]:
    return {r.json()["i"] for s in subscribers for r in s.requests}


def test_the_set_follows_the_lookups_while_running_and_an_empty_set_makes_messages_wait(
        broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    with Lookup() as lookup, ScriptedSubscriber() as one, ScriptedSubscriber() as two:
        lookup.set([one.url + "/orders"])
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoints": {"discovery": {"urls": [lookup.url], "pollIntervalMs": 1000, "jitter": 0,
                                        "timeoutMs": 500}},
            "subscriptionPolicy": {"messageBackoff": 100, "inflightSize": 4}}})
        sid = f"{topic_name}.orders"
        with RunningHerald(conf, spark) as running:
            discovery = running.runner.context.discovery

            def now_set() -> set[str]:
                return {e.url for e in discovery.endpoints_of(running.runner.config.subscription(sid))}

            assert now_set() == {one.url + "/orders"}, "the first answer was there before the first round"
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10)])
            assert wait_until(lambda: _received(one) >= set(range(10)), timeout_s=60)

            # added: the next rounds spread over both
            lookup.set([one.url + "/orders", two.url + "/orders"])
            assert wait_until(lambda: len(now_set()) == 2, timeout_s=10)
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10, 30)])
            assert wait_until(lambda: _received(one, two) >= set(range(30)), timeout_s=60)
            assert {r.json()["i"] for r in two.requests} & set(range(10, 30)), "the new endpoint got messages"

            # removed: no new message for it
            lookup.set([two.url + "/orders"])
            assert wait_until(lambda: now_set() == {two.url + "/orders"}, timeout_s=10)
            before_one = len(one.requests)
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(30, 40)])
            assert wait_until(lambda: _received(two) >= set(range(30, 40)), timeout_s=60)

            # a lookup outage keeps the set
            polls = lookup.polls
            lookup.failing = True
            assert wait_until(lambda: lookup.polled_since(polls) >= 2, timeout_s=10)
            assert now_set() == {two.url + "/orders"} and discovery.state(sid)["failing"]
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(40, 50)])
            assert wait_until(lambda: _received(two) >= set(range(40, 50)), timeout_s=60)
            assert len(one.requests) == before_one, "the removed endpoint got nothing new"

            # an empty answer empties the set: messages wait (nothing discarded), then go to the endpoint that
            # appears
            lookup.set([])
            assert wait_until(lambda: not now_set(), timeout_s=10)
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(50, 60)])
            time.sleep(4)
            assert not _received(one, two) & set(range(50, 60)), "no endpoint: nothing sent"
            appeared = time.monotonic()
            lookup.set([one.url + "/orders"])
            assert wait_until(lambda: _received(one) >= set(range(50, 60)), timeout_s=60)
            assert min(r.at for r in one.requests if r.json()["i"] >= 50) >= appeared
        assert running.exit_code == 0
    config = load_config(conf)
    subscription = config.subscription(sid)
    assert readout.undelivered(config, subscription, limit=5) == [], "nothing discarded, nothing lost"
    assert readout.metrics(config, subscription)["delivered"] == 60
    recorded = recorded_endpoints(open_store("deltalake", config.storage_path), sid)
    assert [item["endpoint"] for item in recorded["endpoints"]] == [one.url + "/orders"]
    assert recorded["endpoints"][0]["lookups"] == [lookup.url]


def test_run_once_broadcasts_to_every_producer_lookupd_names_and_ends_without_waiting_for_an_empty_set(
        broker, spark, topic_name, tmp_path, capsys):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(6)])
    with Lookup() as lookup, ScriptedSubscriber() as one, ScriptedSubscriber() as two:
        producers = [("127.0.0.1", int(one.url.rsplit(":", 1)[1])), ("127.0.0.1", int(two.url.rsplit(":", 1)[1]))]
        lookup.set_producers(producers)
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"fan": {
            "mode": "BROADCAST",
            "endpoints": {"discovery": {"urls": [lookup.url], "endpoint": "http://{address}:{port}/orders"}}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert sorted(r.json()["i"] for r in one.requests) == list(range(6))
        assert sorted(r.json()["i"] for r in two.requests) == list(range(6))
        assert {r.path for r in one.requests + two.requests} == {"/orders"}

        lookup.set_producers([])  # lookupd names no producer: the run ends, the messages wait for the next one
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(6, 9)])
        capsys.readouterr()
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert "no endpoint discovered" in capsys.readouterr().out
        assert len(one.requests) == len(two.requests) == 6
        lookup.set_producers(producers)
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sorted(r.json()["i"] for r in one.requests) == list(range(9))
    assert sorted(r.json()["i"] for r in two.requests) == list(range(9))
    config = load_config(conf)
    subscription = config.subscription(f"{topic_name}.fan")
    assert readout.metrics(config, subscription)["delivered"] == 9
    assert readout.undelivered(config, subscription, limit=5) == []


def test_a_pinned_subscription_over_a_discovered_set_moves_its_pin_when_the_endpoint_leaves(
        broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5)])
    with Lookup() as lookup, ScriptedSubscriber() as one, ScriptedSubscriber() as two:
        first, second = sorted([one.url + "/orders", two.url + "/orders"])  # the set's order: by URL
        lookup.set([second, first])
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoints": {"discovery": {"urls": [lookup.url]}}, "priority": {"policy": "pinned"}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        lookup.set([second])
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5, 10)])
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    requests = sorted(one.requests + two.requests, key=lambda r: r.at)
    by_url = {one.url + "/orders": one, two.url + "/orders": two}
    assert sorted(r.json()["i"] for r in by_url[first].requests) == list(range(5)), "the first in the set's order"
    assert sorted(r.json()["i"] for r in by_url[second].requests) == list(range(5, 10))
    assert len({r.headers["Herald-Pin-Id"] for r in requests}) == 2
    config = load_config(conf)
    rows = sorted(open_store("deltalake", config.storage_path).read("advisories").to_pylist(),
                  key=lambda row: row["timestamp"])
    assert [(row["type"], row["reason"], row["endpoint"]) for row in rows] == [
        ("pinned", "start", first), ("unpinned", "endpoint removed", first), ("pinned", "endpoint removed", second)]


def test_a_pin_taken_up_after_a_late_first_answer_reaches_the_running_tasks(broker, spark, topic_name, tmp_path):
    """After a restart whose lookup does not answer at first, the pinned subscription takes its pin up from the
    table once it does: the control endpoint must then serve the pinned version (definition and pin id), or
    every running task sees a version it was not planned with and cuts the lane at its first poll."""
    from herald.engine.upkeep.control import pinned_version, version_of

    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5)])
    with Lookup() as lookup, ScriptedSubscriber() as sub:
        lookup.set([sub.url + "/orders"])
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"orders": {
            "endpoints": {"discovery": {"urls": [lookup.url], "pollIntervalMs": 1000, "timeoutMs": 300}},
            "priority": {"policy": "pinned"}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0, "the first run pins the endpoint"
        pin_id = sub.requests[0].headers["Herald-Pin-Id"]
        lookup.failing = True
        with RunningHerald(conf, spark) as running:
            sid = f"{topic_name}.orders"
            assert running.runner.context.priority.holds(sid), "no answer yet: its group waits"
            lookup.set([sub.url + "/orders"])
            assert wait_until(lambda: running.runner.context.priority.pin_ids().get(sid) == pin_id, 30), \
                "the pin is taken up from the table"
            subscription = running.runner.config.subscription(sid)
            assert wait_until(lambda: running.runner.control._versions.get(sid)
                              == pinned_version(version_of(subscription), pin_id), 10), \
                "the running tasks are told the pin they are planned with"
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5, 205)])
            assert wait_until(lambda: _received(sub) == set(range(205)), 120)
    assert {r.headers["Herald-Pin-Id"] for r in sub.requests} == {pin_id}, "the same pin across the restart"
