"""Partitions added to a topic while `herald run` runs are delivered from their start, to every subscription:
those delivered by the shared query, and one suspended meanwhile (issue: nothing lost, nothing stuck). noida-db
and Herald's Python source here; Apache Kafka with Spark's source in test_real_broker.py."""

from __future__ import annotations

import pytest

from tests.support.broker_scenarios import new_partitions_are_delivered, produce_to, received
from tests.support.herald_env import wait_until, write_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


@pytest.fixture
def broker(embedded_broker):
    """noida-db, the demo's broker: Apache Kafka runs these scenarios in test_real_broker.py."""
    return embedded_broker


def test_new_partitions_are_delivered_from_their_start_to_every_subscription(broker, spark, topic_name, tmp_path):
    new_partitions_are_delivered(broker, spark, topic_name, tmp_path, connector="python")


def test_a_topics_kafka_topic_edited_while_running_starts_there_from_starting_offsets(broker, spark, tmp_path, caplog):
    """Positions belong to a Kafka topic: after `kafkaTopic` changes, the subscription reads the new one from its
    startingOffsets (earliest here), not from the old one's offsets."""
    import logging
    import time

    stamp = time.time_ns() % 10**8
    old, new = f"kt.old_{stamp}", f"kt.new_{stamp}"
    broker.create_topics({old: 1, new: 1})
    produce_to(broker.bootstrap_servers, old, [(0, {"i": i}) for i in range(5)])
    produce_to(broker.bootstrap_servers, new, [(0, {"i": 100 + i}) for i in range(8)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, "kt.orders", {"s": {"endpoint": f"{sub.url}/s"}})
        topic_file = conf / "topics" / "kt.orders.yaml"
        topic_file.write_text(f"name: kt.orders\ncontentType: JSON\nkafkaTopic: {old}\n")
        with caplog.at_level(logging.INFO, logger="herald"), RunningHerald(conf, spark) as running:
            assert wait_until(lambda: received(sub, "/s") == list(range(5)), 60)
            topic_file.write_text(f"name: kt.orders\ncontentType: JSON\nkafkaTopic: {new}\n")
            assert wait_until(lambda: received(sub, "/s") == [*range(5), *range(100, 108)], 90), received(sub, "/s")
            state = running.runner.pipelines["kt.orders"].states["kt.orders.s"]
            assert state.kafka_topic == new
            assert wait_until(lambda: state.positions == {0: 8}, 30), state.positions
        assert any(new in r.getMessage() and old in r.getMessage() for r in caplog.records), "the change is logged"
