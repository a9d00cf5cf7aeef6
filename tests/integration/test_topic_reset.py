"""A topic deleted and created again between two runs: its offsets start over, and its subscriptions go on from the
new log's start instead of skipping every new message below their old positions; the reset is recorded for each
(docs/design.md §8). Apache Kafka itself (topic ids), Spark's Kafka source, real HTTP and Delta tables.
(A topic deleted and created while a job runs: tests/support/broker_scenarios.py `deleted_topic_is_retried_alone`.)"""

from __future__ import annotations

import pytest

from herald.config import load_config
from herald.engine.runner import Runner
from herald.source.kafka_offsets import topic_ids
from herald.source.stream import SPARK_KAFKA_CLASS
from herald.storage import DeltaRsStore
from herald.storage.tables import OFFSETS, UNDELIVERED
from tests.support.broker_scenarios import delete_topic, produce_to, received
from tests.support.herald_env import require_jars, wait_until, write_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
TABLE_ENGINE = "deltalake"  # the subject is the engine's positions, not the tables (tests/conftest.py)


def _run_once(conf, spark) -> None:
    assert Runner(load_config(conf), spark=spark).run(once=True) == 0


def _recreate(kafka_broker, topic: str, partitions: int) -> None:
    delete_topic(kafka_broker.bootstrap_servers, topic)
    assert wait_until(lambda: _created(kafka_broker, topic, partitions), 60), f"{topic} was not created again"


def _created(kafka_broker, topic: str, partitions: int) -> bool:
    try:
        kafka_broker.create_topics({topic: partitions})
        return True
    except Exception:  # noqa: BLE001 - the deletion is still going on
        return False


def _two_partitions_of_ten(kafka_broker, spark, topic: str, tmp_path, connector: str, sub):
    """`topic` with two partitions of 10 messages each ("i" 0..19) and one subscription, `a`, delivering to
    `sub` with `connector`: its herald.yaml."""
    if connector == "spark":
        require_jars(spark, SPARK_KAFKA_CLASS)
    kafka_broker.create_topics({topic: 2})
    produce_to(kafka_broker.bootstrap_servers, topic, [(i % 2, {"i": i}) for i in range(20)])
    return write_conf(tmp_path, kafka_broker.bootstrap_servers, topic, {"a": {"endpoint": f"{sub.url}/a"}},
                      settings={"kafka": {"connector": connector}})


@pytest.mark.parametrize("new_messages", [10, 30], ids=["fewer-than-before", "more-than-before"])
def test_a_topic_created_again_between_runs_is_delivered_from_its_new_start(kafka_broker, spark, topic_name, tmp_path,
                                                                          new_messages):
    """20 delivered, the topic deleted and created again, `new_messages` published: the next run delivers all of
    them. With 30 the new log is past the old positions: only the topic's id tells (it skipped 0..19 before)."""
    require_jars(spark, SPARK_KAFKA_CLASS)
    kafka_broker.create_topics({topic_name: 1})
    produce_to(kafka_broker.bootstrap_servers, topic_name, [(0, {"i": i}) for i in range(20)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, kafka_broker.bootstrap_servers, topic_name, {
            "a": {"endpoint": f"{sub.url}/a"}, "b": {"endpoint": f"{sub.url}/b"}},
            settings={"kafka": {"connector": "spark"}})
        _run_once(conf, spark)
        assert received(sub, "/a") == list(range(20)) and received(sub, "/b") == list(range(20))
        old_id = topic_ids({"bootstrap.servers": kafka_broker.bootstrap_servers}, [topic_name])[topic_name]

        _recreate(kafka_broker, topic_name, 1)
        new = list(range(100, 100 + new_messages))
        produce_to(kafka_broker.bootstrap_servers, topic_name, [(0, {"i": i}) for i in new])
        _run_once(conf, spark)
        assert received(sub, "/a") == list(range(20)) + new, "every message of the new log, none skipped"
        assert received(sub, "/b") == list(range(20)) + new

    store = DeltaRsStore(str(tmp_path / "storage"))
    new_id = topic_ids({"bootstrap.servers": kafka_broker.bootstrap_servers}, [topic_name])[topic_name]
    assert new_id != old_id
    rows = store.latest(OFFSETS, ("subscription", "topic", "partition"), "committed_at DESC, batch_id DESC")
    assert {(r["subscription"], r["offset"], r["topic_id"]) for r in rows.to_pylist()} == {
        (f"{topic_name}.a", new_messages, new_id), (f"{topic_name}.b", new_messages, new_id)}
    resets = [r for r in store.read(UNDELIVERED).to_pylist() if r["ended_by"] == "reset"]
    assert sorted(r["subscription"] for r in resets) == [f"{topic_name}.a", f"{topic_name}.b"], \
        "the reset is recorded for every subscription of the topic"
    for row in resets:
        assert row["status"] == "RESET" and row["partition"] == 0 and row["offset"] == 20
        assert f"topic id {old_id} -> {new_id}" in row["reason"] and "goes on from offset 0" in row["reason"]


@pytest.mark.parametrize("connector", ["spark", "python"])
def test_a_topic_created_again_with_fewer_partitions_then_grown_loses_nothing_of_the_new_partition(
        kafka_broker, spark, topic_name, tmp_path, connector):
    """Two partitions, 10 messages each, delivered; the topic created again with one partition, then grown back to
    two: partition 1 is a new log that starts at 0. Its old position (10) goes to 0 when the reset is found (it
    would skip the new partition's first 10 messages as done), and that reset is recorded too."""
    bootstrap = kafka_broker.bootstrap_servers
    with ScriptedSubscriber() as sub:
        conf = _two_partitions_of_ten(kafka_broker, spark, topic_name, tmp_path, connector, sub)
        _run_once(conf, spark)
        assert received(sub, "/a") == list(range(20))

        _recreate(kafka_broker, topic_name, 1)
        produce_to(bootstrap, topic_name, [(0, {"i": i}) for i in range(100, 105)])
        _run_once(conf, spark)
        assert received(sub, "/a") == list(range(20)) + list(range(100, 105))

        kafka_broker.add_partitions(topic_name, 2)
        grown = list(range(200, 215))
        produce_to(bootstrap, topic_name, [(1, {"i": i}) for i in grown])
        _run_once(conf, spark)
        assert received(sub, "/a") == list(range(20)) + list(range(100, 105)) + grown, \
            "every message of the partition added again, from its offset 0"

    store = DeltaRsStore(str(tmp_path / "storage"))
    rows = store.latest(OFFSETS, ("subscription", "topic", "partition"), "committed_at DESC, batch_id DESC")
    assert {(r["partition"], r["offset"]) for r in rows.to_pylist()} == {(0, 5), (1, 15)}
    resets = {r["partition"]: r for r in store.read(UNDELIVERED).to_pylist() if r["ended_by"] == "reset"}
    assert set(resets) == {0, 1}, "the partition the new topic did not have is recorded too"
    assert "knew offsets up to 9" in resets[1]["reason"]
    assert resets[1]["status"] == "RESET" and resets[1]["offset"] == 10, "it had read all of it: nothing was lost"


@pytest.mark.parametrize("connector", ["spark", "python"])
def test_a_topic_created_again_with_fewer_partitions_while_the_job_runs_then_grown_loses_nothing(
        kafka_broker, spark, topic_name, tmp_path, connector):
    """The same while `herald run` runs: the read fails while the topic is gone and starts again when it is back
    with one partition; partition 1, added again later, is delivered from its offset 0 (by the read or by
    catch-up), and the partition the new topic lacked never stalls the other."""
    bootstrap = kafka_broker.bootstrap_servers
    with ScriptedSubscriber() as sub:
        conf = _two_partitions_of_ten(kafka_broker, spark, topic_name, tmp_path, connector, sub)
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: received(sub, "/a") == list(range(20)), 90), received(sub, "/a")
            _recreate(kafka_broker, topic_name, 1)
            produce_to(bootstrap, topic_name, [(0, {"i": i}) for i in range(100, 105)])
            assert wait_until(lambda: received(sub, "/a") == list(range(20)) + list(range(100, 105)), 120), \
                received(sub, "/a")
            kafka_broker.add_partitions(topic_name, 2)
            grown = list(range(200, 215))
            produce_to(bootstrap, topic_name, [(1, {"i": i}) for i in grown])
            produce_to(bootstrap, topic_name, [(0, {"i": 300})])
            assert wait_until(lambda: sorted(received(sub, "/a")) == sorted(
                list(range(20)) + list(range(100, 105)) + grown + [300]), 120), received(sub, "/a")
        assert running.exit_code == 0
