"""Partitions added to a topic while `herald run` runs are delivered from their start, to every subscription:
those delivered by the shared query, and one suspended meanwhile (issue: nothing lost, nothing stuck)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from tests.support.herald_env import wait_until, write_conf, write_subscription
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _produce(bootstrap: str, topic: str, documents: list[tuple[int, dict]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, document in documents:
        producer.produce(topic, value=json.dumps(document).encode(), partition=partition)
    assert producer.flush(30) == 0


def _received(sub: ScriptedSubscriber, path: str) -> list[int]:
    return sorted(r.json()["i"] for r in sub.requests if r.path == path)


def test_new_partitions_are_delivered_from_their_start_to_every_subscription(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "a": {"endpoint": f"{sub.url}/a"}, "b": {"endpoint": f"{sub.url}/b"}},
            settings={"streaming": {"maxOffsetsPerTrigger": 7}})
        _produce(broker.bootstrap_servers, topic_name, [(0, {"i": i}) for i in range(3)])
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: _received(sub, "/a") == [0, 1, 2] and _received(sub, "/b") == [0, 1, 2], 60)
            write_subscription(conf, topic_name, "b", {"endpoint": f"{sub.url}/b", "state": "SUSPENDED"})
            pipeline = running.runner.pipelines[topic_name]
            assert wait_until(lambda: f"{topic_name}.b" not in pipeline.states, 30)

            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            for future in admin.create_partitions([NewPartitions(topic_name, 3)]).values():
                future.result()
            # first in a new partition only (more than one micro-batch holds), then in all three at once
            _produce(broker.bootstrap_servers, topic_name, [(2, {"i": i}) for i in range(100, 120)])
            assert wait_until(lambda: _received(sub, "/a") == [0, 1, 2, *range(100, 120)], 60), _received(sub, "/a")
            _produce(broker.bootstrap_servers, topic_name, [(i % 3, {"i": i}) for i in range(200, 230)])
            expected = [0, 1, 2, *range(100, 120), *range(200, 230)]
            assert wait_until(lambda: _received(sub, "/a") == expected, 60), _received(sub, "/a")

            write_subscription(conf, topic_name, "b", {"endpoint": f"{sub.url}/b"})
            assert wait_until(lambda: _received(sub, "/b") == expected, 90), \
                "activated again, it gets what the new partitions received while it was suspended"
            assert pipeline.states[f"{topic_name}.b"].positions.keys() == {0, 1, 2}


def test_a_topics_kafka_topic_edited_while_running_starts_there_from_starting_offsets(broker, spark, tmp_path, caplog):
    """Positions belong to a Kafka topic: after `kafkaTopic` changes, the subscription reads the new one from its
    startingOffsets (earliest here), not from the old one's offsets."""
    import logging
    import time

    stamp = time.time_ns() % 10**8
    old, new = f"kt.old_{stamp}", f"kt.new_{stamp}"
    broker.create_topics({old: 1, new: 1})
    _produce(broker.bootstrap_servers, old, [(0, {"i": i}) for i in range(5)])
    _produce(broker.bootstrap_servers, new, [(0, {"i": 100 + i}) for i in range(8)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, "kt.orders", {"s": {"endpoint": f"{sub.url}/s"}})
        topic_file = conf / "topics" / "kt.orders.yaml"
        topic_file.write_text(f"name: kt.orders\ncontentType: JSON\nkafkaTopic: {old}\n")
        with caplog.at_level(logging.INFO, logger="herald"), RunningHerald(conf, spark) as running:
            assert wait_until(lambda: _received(sub, "/s") == list(range(5)), 60)
            topic_file.write_text(f"name: kt.orders\ncontentType: JSON\nkafkaTopic: {new}\n")
            assert wait_until(lambda: _received(sub, "/s") == [*range(5), *range(100, 108)], 90), _received(sub, "/s")
            state = running.runner.pipelines["kt.orders"].states["kt.orders.s"]
            assert state.kafka_topic == new
            assert wait_until(lambda: state.positions == {0: 8}, 30), state.positions
        assert any(new in r.getMessage() and old in r.getMessage() for r in caplog.records), "the change is logged"
