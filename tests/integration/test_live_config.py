"""A configuration change applies completely, and what cannot start yet is tried again until it does (issue:
nothing lost, nothing stuck). Real broker, Spark, HTTP subscribers, Delta tables."""

from __future__ import annotations

import textwrap
import time

import pytest

from tests.support.herald_env import produce, wait_until, write_conf, write_subscription
from tests.support.running import RunningHerald
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _received(sub: ScriptedSubscriber, path: str) -> list[int]:
    return sorted(r.json()["i"] for r in sub.requests if r.path == path)


def test_a_change_with_a_topic_that_cannot_start_yet_applies_the_rest_and_retries_that_topic(
        broker, spark, topic_name, tmp_path):
    """One change adds a topic whose Kafka topic does not exist yet (with a `latest` subscription), adds a
    subscription to a running topic and suspends another: the suspension and the new subscription apply at once,
    the new topic starts once Kafka has it, and its `latest` subscription gets what was published since the
    change was first seen, not only what comes after it finally started."""
    later = f"{topic_name}_later"
    broker.create_topics({topic_name: 1})
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "a1": {"endpoint": f"{sub.url}/a1"}, "a2": {"endpoint": f"{sub.url}/a2"}})
        produce(broker.bootstrap_servers, topic_name, [{"i": 0}])
        with RunningHerald(conf, spark) as running:
            runner = running.runner
            assert wait_until(lambda: _received(sub, "/a1") == [0] and _received(sub, "/a2") == [0], 60)
            (conf / "topics" / f"{later}.yaml").write_text(textwrap.dedent(f"name: {later}\ncontentType: JSON\n"))
            write_subscription(conf, later, "b1", {"endpoint": f"{sub.url}/b1", "startingOffsets": "latest"})
            write_subscription(conf, topic_name, "late", {"endpoint": f"{sub.url}/late",
                                                          "startingOffsets": "latest"})
            write_subscription(conf, topic_name, "a2", {"endpoint": f"{sub.url}/a2", "state": "SUSPENDED"})
            pipeline = runner.pipelines[topic_name]
            assert wait_until(lambda: f"{topic_name}.late" in pipeline.states
                              and f"{topic_name}.a2" not in pipeline.states, 30), "the rest of the change applied"
            assert wait_until(lambda: runner.supervisor.failing(later) is not None, 30)
            produce(broker.bootstrap_servers, topic_name, [{"i": 1}])
            assert wait_until(lambda: _received(sub, "/late") == [1] and _received(sub, "/a1") == [0, 1], 60)
            broker.create_topics({later: 1})
            produce(broker.bootstrap_servers, later, [{"i": i} for i in range(10, 13)])  # before it starts
            assert wait_until(lambda: later in runner.pipelines and runner.supervisor.failing(later) is None, 120)
            produce(broker.bootstrap_servers, later, [{"i": 13}])
            assert wait_until(lambda: _received(sub, "/b1") == [10, 11, 12, 13], 60), _received(sub, "/b1")
        assert running.exit_code == 0
    assert _received(sub, "/a2") == [0], "suspended in the same change"


def test_a_suspension_and_an_endpoint_edit_reach_the_round_already_delivering(broker, spark, topic_name, tmp_path):
    """A slow subscriber (200 ms an answer, one at a time) has 100 messages in its round, which could deliver for
    batchDeadlineMs (20 s here, about 100 attempts). Its endpoint is edited after a few: the round stops starting
    first attempts to the old endpoint within two configPollMs (500 ms), and the rest go to the new one. Then it
    is suspended: nothing more is sent until it is activated again. Every message arrives. (Another subscription
    keeps the topic's query running.)"""
    broker.create_topics({topic_name: 1})
    with ScriptedSubscriber(lambda request: Reply(delay_ms=0 if request.path == "/other" else 200)) as sub:
        fields = {"endpoint": f"{sub.url}/old", "subscriptionPolicy": {"inflightSize": 1}}
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "s": fields, "other": {"endpoint": f"{sub.url}/other"}}, settings={"streaming": {"batchDeadlineMs": 20000}})
        with RunningHerald(conf, spark) as running:  # running: its first micro-batch is done
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(100)])
            assert wait_until(lambda: sum(r.path == "/old" for r in sub.requests) >= 3, 60)
            write_subscription(conf, topic_name, "s", {**fields, "endpoint": f"{sub.url}/new"})
            assert wait_until(lambda: any(r.path == "/new" for r in sub.requests), 60)
            old = sum(r.path == "/old" for r in sub.requests)
            assert old < 40, f"{old} messages went to the old endpoint: the round went on as planned"
            new_before = sum(r.path == "/new" for r in sub.requests)
            generation = running.generation
            write_subscription(conf, topic_name, "s", {**fields, "endpoint": f"{sub.url}/new", "state": "SUSPENDED"})
            assert running.applied(generation)
            time.sleep(1.5)  # two configPollMs for the round's tasks to ask, and an answer in flight
            stopped_at = sum(r.path == "/new" for r in sub.requests)
            time.sleep(3)  # a window to see that nothing more comes
            assert sum(r.path == "/new" for r in sub.requests) == stopped_at, "nothing is sent while it is suspended"
            assert stopped_at - new_before < 40
            write_subscription(conf, topic_name, "s", {**fields, "endpoint": f"{sub.url}/new"})
            assert wait_until(lambda: len({r.json()["i"] for r in sub.requests if r.path != "/other"}) == 100, 120)
    assert {r.json()["i"] for r in sub.requests if r.path == "/new"} | \
        {r.json()["i"] for r in sub.requests if r.path == "/old"} == set(range(100))
