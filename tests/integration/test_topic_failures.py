"""One topic that fails never stops the others: its query is started again alone, with backoff (issue: nothing
lost, nothing stuck). Real broker (a topic deleted, a broker restarted: noida-db and Herald's Python source here,
Apache Kafka with Spark's source in test_real_broker.py), real Spark, real HTTP subscribers."""

from __future__ import annotations

import time

import pytest

from herald.broker import EmbeddedBroker
from herald.config import load_config
from herald.engine.runner import Runner
from tests.conftest import free_port
from tests.support.broker_scenarios import broker_restart_loses_nothing, deleted_topic_is_retried_alone
from tests.support.herald_env import produce, write_topics_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


@pytest.fixture
def broker(embedded_broker):
    """noida-db, the demo's broker: Apache Kafka runs these scenarios in test_real_broker.py."""
    return embedded_broker


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
    deleted_topic_is_retried_alone(broker, spark, tmp_path, connector="python")


def test_a_broker_restart_loses_nothing(spark, topic_name, tmp_path):
    """The broker goes down while the job runs and comes back: every message is delivered (a broker of its own:
    the session's serves the other tests)."""
    broker = EmbeddedBroker(tmp_path / "broker", port=free_port())
    broker.up()

    def restart() -> None:
        broker.down()
        time.sleep(4)
        broker.up()

    try:
        broker_restart_loses_nothing(broker, restart, spark, topic_name, tmp_path, connector="python")
    finally:
        broker.down()
