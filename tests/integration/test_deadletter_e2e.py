"""Dead-letter topics end to end: real broker, Spark, HTTP subscriber and Delta; the dead letters read back
with a Kafka consumer carry the original key, value and why, and match the undelivered table."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer

from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import UNDELIVERED
from tests.support.avro_topics import ORDER, avro_conf, order, produce_raw
from tests.support.herald_env import produce, write_conf
from tests.support.registry import avro_bytes
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def read_back(bootstrap: str, topic: str, expected: int) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    found = []
    try:
        for _ in range(60):
            for message in consumer.consume(num_messages=100, timeout=0.5):
                if message.error() is None:
                    found.append(message)
            if len(found) >= expected:
                break
    finally:
        consumer.close()
    return found


def test_discarded_messages_are_published_with_key_value_and_headers(broker, spark, topic_name, tmp_path):
    dlq = f"{topic_name}.dlq"
    broker.create_topics({topic_name: 2, dlq: 1})
    documents = [{"i": i, **({"replies": [[400]]} if i in (1, 4) else {})} for i in range(6)]
    produce(broker.bootstrap_servers, topic_name, documents, key_field="i")
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "a": {"endpoint": sub.url + "/a", "onDiscard": {"topic": dlq}},
            "b": {"endpoint": sub.url + "/b"},  # no dead-letter topic: its discards go to the table only
        })
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    letters = read_back(broker.bootstrap_servers, dlq, 2)
    assert len(letters) == 2
    undelivered = {(r["partition"], r["offset"]): r for r in DeltaRsStore(str(tmp_path / "storage"))
                   .read(UNDELIVERED, f"{topic_name}.a").to_pylist()}
    for letter in letters:
        headers = {name: value.decode() for name, value in letter.headers()}
        row = undelivered[(int(headers["herald.original.partition"]), int(headers["herald.original.offset"]))]
        assert letter.value().decode() == row["message"]
        assert letter.key() == str(json.loads(row["message"])["i"]).encode()
        assert headers["herald.reason"] == row["reason"] == "Message sending failed with status code:400"
        assert headers["herald.http.status"] == "400" and headers["herald.subscription"] == f"{topic_name}.a"
        assert headers["herald.original.topic"] == topic_name and headers["id"] == row["message_id"]
    assert sorted(json.loads(m.value())["i"] for m in letters) == [1, 4]


def test_an_avro_topic_dead_letter_keeps_the_original_bytes(broker, spark, topic_name, tmp_path):
    dlq = f"{topic_name}.dlq"
    broker.create_topics({topic_name: 1, dlq: 1})
    original = avro_bytes(ORDER, order(7, ["Krakow"]))
    produce_raw(broker.bootstrap_servers, topic_name, [(original, [])])
    with ScriptedSubscriber(lambda request: Reply(400)) as sub:
        conf = avro_conf(tmp_path, broker, topic_name, {"a": {"endpoint": sub.url + "/a",
                                                              "onDiscard": {"topic": dlq}}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    (letter,) = read_back(broker.bootstrap_servers, dlq, 1)
    assert letter.value() == original and sub.requests[0].json()["id"] == 7
