"""One topic that fails never stops the others: its query is started again alone, with backoff (issue: nothing
lost, nothing stuck). Real broker (a topic deleted, a broker restarted), real Spark, real HTTP subscribers."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient

from herald.broker import EmbeddedBroker
from herald.config import load_config
from herald.engine.runner import Runner
from tests.conftest import free_port
from tests.support.herald_env import produce, wait_until, write_topics_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _numbers(sub: ScriptedSubscriber, path: str) -> list[int]:
    return sorted(r.json()["i"] for r in sub.requests if r.path == path)


def test_once_finishes_every_topic_it_can_and_names_the_one_it_could_not(broker, spark, tmp_path, capsys):
    """Three topics in one --once; one of them does not exist in Kafka. The two others are delivered, the run
    ends by itself with exit code 1, and says which topic it could not finish and why."""
    stamp = time.time_ns() % 10**8
    good = [f"fail.ok{n}_{stamp}" for n in range(2)]
    missing = f"fail.missing_{stamp}"
    broker.create_topics({topic: 2 for topic in good})
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {
            topic: {"s": {"endpoint": f"{sub.url}/{topic}"}} for topic in [*good, missing]})
        for topic in good:
            produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(10)])
        runner = Runner(load_config(conf), spark=spark)
        assert runner.run(once=True) == 1
    for topic in good:
        assert _numbers(sub, f"/{topic}") == list(range(10))
    printed = capsys.readouterr().out
    assert f"topic {missing} could not be finished" in printed and "do not exist" in printed
    assert runner.supervisor.given_up().keys() == {missing}
    assert runner.supervisor.given_up()[missing].count(missing) >= 1


def test_a_topic_deleted_while_running_is_retried_alone_and_the_others_go_on(broker, spark, tmp_path):
    """Its query fails and is started again with backoff (failing while the topic is gone) while the other topic
    is delivered; once the topic is back, its query runs again from its checkpoint."""
    stamp = time.time_ns() % 10**8
    doomed, other = f"fail.doomed_{stamp}", f"fail.other_{stamp}"
    broker.create_topics({doomed: 1, other: 1})
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {
            doomed: {"s": {"endpoint": f"{sub.url}/doomed"}}, other: {"s": {"endpoint": f"{sub.url}/other"}}})
        produce(broker.bootstrap_servers, doomed, [{"i": 0}])
        produce(broker.bootstrap_servers, other, [{"i": 0}])
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: _numbers(sub, "/doomed") == [0] and _numbers(sub, "/other") == [0], 60)
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            for future in admin.delete_topics([doomed]).values():
                future.result()
            supervisor = running.runner.supervisor
            assert wait_until(lambda: supervisor.failing(doomed) is not None
                              and supervisor.failing(doomed).failures >= 2, 90), \
                "the failed query is noticed and started again (and fails again: its topic is gone)"
            assert "do not exist" in supervisor.failing(doomed).error
            produce(broker.bootstrap_servers, other, [{"i": i} for i in range(1, 6)])
            assert wait_until(lambda: _numbers(sub, "/other") == list(range(6)), 60), "the other topic goes on"
            broker.create_topics({doomed: 1})
            # the new topic's offsets start at 0 again; the query goes on from its checkpoint (offset 1)
            produce(broker.bootstrap_servers, doomed, [{"i": i} for i in range(10, 16)])
            assert wait_until(lambda: _numbers(sub, "/doomed") == [0, 11, 12, 13, 14, 15], 90), \
                _numbers(sub, "/doomed")
            assert supervisor.failing(doomed) is None
        assert running.exit_code == 0, "every topic runs at the end"


def test_a_broker_restart_loses_nothing(spark, topic_name, tmp_path):
    """The broker goes down while the job runs and comes back: every message is delivered, once each."""
    broker = EmbeddedBroker(tmp_path / "broker", port=free_port())
    broker.up()
    try:
        broker.create_topics({topic_name: 2})
        with ScriptedSubscriber() as sub:
            conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: {"s": {"endpoint": sub.url}}},
                                     settings={"kafka": {"properties": {}}})
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10)])
            with RunningHerald(conf, spark) as running:
                assert wait_until(lambda: len(sub.requests) >= 10, 60)
                broker.down()
                time.sleep(4)
                broker.up()
                produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10, 20)])
                assert wait_until(lambda: _numbers(sub, "/") == list(range(20)), 120), _numbers(sub, "/")
                assert wait_until(lambda: not running.runner.supervisor.not_running(), 60)
        received = [r.json()["i"] for r in sub.requests]
        assert sorted(set(received)) == list(range(20))
    finally:
        broker.down()
