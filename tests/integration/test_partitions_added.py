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
