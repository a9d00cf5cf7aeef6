"""Records Kafka deleted before they were delivered (retention, delete-records) never stop delivery: Herald goes
on from the earliest offset still there and records the lost range for each subscription it concerns, on the
shared query and in catch-up (issue: nothing lost, nothing stuck). Real broker, Spark, HTTP, Delta tables."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import METRICS, UNDELIVERED
from tests.support.herald_env import produce, write_subscription, write_topics_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _delete_below(bootstrap: str, topic: str, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, offset)]).values():
        future.result()


def _received(sub: ScriptedSubscriber, path: str) -> list[int]:
    return sorted(r.json()["i"] for r in sub.requests if r.path == path)


def test_a_deleted_range_is_recorded_as_lost_and_delivery_goes_on(broker, spark, topic_name, tmp_path, caplog):
    other = f"{topic_name}_other"
    broker.create_topics({topic_name: 1, other: 1})
    store = DeltaRsStore(str(tmp_path / "storage"))
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {
            topic_name: {"a": {"endpoint": f"{sub.url}/a"}, "b": {"endpoint": f"{sub.url}/b"}},
            other: {"c": {"endpoint": f"{sub.url}/c"}}})
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5)])
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert _received(sub, "/a") == _received(sub, "/b") == list(range(5))

        # b is suspended; 5..14 are published and 5..9 deleted before the next run reads them
        write_subscription(conf, topic_name, "b", {"endpoint": f"{sub.url}/b", "state": "SUSPENDED"}, prefixed=True)
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5, 15)])
        produce(broker.bootstrap_servers, other, [{"i": i} for i in range(3)])
        _delete_below(broker.bootstrap_servers, topic_name, 10)
        with caplog.at_level(logging.WARNING, logger="herald"):
            assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert _received(sub, "/a") == [*range(5), *range(10, 15)], "the query went on from what Kafka holds"
        assert _received(sub, "/c") == [0, 1, 2], "the other topic was not held back"
        assert any("5..9" in record.getMessage() and record.levelno == logging.WARNING for record in caplog.records)

        # b is activated: it catches up alone from its position (5), below what Kafka holds
        write_subscription(conf, topic_name, "b", {"endpoint": f"{sub.url}/b"}, prefixed=True)
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        assert _received(sub, "/b") == [*range(5), *range(10, 15)]

    lost = {row["subscription"]: row for row in store.read(UNDELIVERED).to_pylist() if row["status"] == "LOST"}
    assert lost.keys() == {f"{topic_name}.a", f"{topic_name}.b"}, "recorded once for each subscription it concerned"
    for row in lost.values():
        assert (row["partition"], row["offset"], row["ended_by"]) == (0, 5, "retention")
        assert "offsets 5..9" in row["reason"] and row["message"] is None
    metrics = store.read(METRICS).to_pylist()
    assert {sid: sum(r["lost"] or 0 for r in metrics if r["subscription"] == sid)
            for sid in lost} == {sid: 5 for sid in lost}
    assert {r["kind"] for r in metrics if (r["lost"] or 0) > 0} == {"stream", "catchup"}
    config = load_config(conf)
    for name in ("a", "b"):
        positions = readout.offsets(config, config.subscription(f"{topic_name}.{name}"))
        assert [(p["partition"], p["offset"]) for p in positions] == [(0, 15)]
