"""Herald on Apache Kafka itself (4.4, KRaft, one node: the `kafka_broker` fixture) with Spark's built-in Kafka
source and delta-rs: what Kafka does to a running job (retention under a subscription's position, partitions
added, a topic deleted, the broker restarted, transactions' markers and aborted records) loses nothing and stops
nothing else. Herald's Python source runs
the same where that costs seconds (not partitions added, the longest: 30-50 s). The same scenarios run on
noida-db with Herald's Python source in test_retention_gap.py, test_partitions_added.py and
test_topic_failures.py (tests/support/broker_scenarios.py)."""

from __future__ import annotations

import json

import pytest

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from herald.source.stream import SPARK_KAFKA_CLASS
from herald.storage import DeltaRsStore
from herald.storage.tables import UNDELIVERED
from tests.support.broker_scenarios import (
    broker_restart_loses_nothing,
    deleted_topic_is_retried_alone,
    lost_range_is_recorded_and_delivery_goes_on,
    new_partitions_are_delivered,
    received,
)
from tests.support.herald_env import (
    require_jars,
    wait_until,
    write_conf,
    write_subscription,
)
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
TABLE_ENGINE = "deltalake"  # the subject is Kafka's own broker, not the tables (tests/conftest.py)


@pytest.fixture
def spark_kafka(spark):
    """The session, which must have Spark's Kafka source."""
    require_jars(spark, SPARK_KAFKA_CLASS)
    return spark


both_sources = pytest.mark.parametrize("connector", ["spark", "python"])


@both_sources
def test_retention_deletes_the_segment_under_a_position(kafka_broker, spark_kafka, topic_name, tmp_path, caplog,
                                                        connector):
    """Offsets 0..9 carry timestamps an hour old, 10..14 are new: with segment.ms at a minute Kafka rolls a segment
    between them (it rolls on record timestamps), and retention.ms set to 30 minutes then deletes the old segments,
    which hold a's and b's position (5). Kafka's retention check runs every second (log.retention.check.interval.ms)."""
    other = f"{topic_name}_other"
    kafka_broker.create_topics({topic_name: 1, other: 1}, configs={topic_name: {"segment.ms": "60000"}})

    def retention_takes_the_first_ten() -> None:
        assert kafka_broker.watermarks(topic_name) == (0, 15)
        kafka_broker.alter_topic_config(topic_name, {"retention.ms": str(30 * 60 * 1000)})
        assert wait_until(lambda: kafka_broker.watermarks(topic_name)[0] == 10, 30), \
            f"retention did not delete 0..9: {kafka_broker.watermarks(topic_name)}"

    lost_range_is_recorded_and_delivery_goes_on(kafka_broker, spark_kafka, topic_name, other, tmp_path, caplog,
                                                connector=connector, delete_first_ten=retention_takes_the_first_ten)


def test_partitions_added_while_running_are_delivered(kafka_broker, spark_kafka, topic_name, tmp_path):
    new_partitions_are_delivered(kafka_broker, spark_kafka, topic_name, tmp_path, connector="spark")


@both_sources
def test_a_topic_deleted_while_running_fails_alone_and_clearly(kafka_broker, spark_kafka, tmp_path, connector):
    deleted_topic_is_retried_alone(kafka_broker, spark_kafka, tmp_path, connector=connector)


@both_sources
def test_a_broker_restart_loses_nothing(kafka_broker, spark_kafka, topic_name, tmp_path, connector):
    """Kafka stops (a controlled shutdown), stays down 4 s, starts again on the same ports and data."""
    broker_restart_loses_nothing(kafka_broker, lambda: kafka_broker.restart(down_s=4), spark_kafka, topic_name,
                                 tmp_path, connector=connector)


def _transaction(producer, topic: str, numbers, commit: bool) -> None:
    producer.begin_transaction()
    for i in numbers:
        producer.produce(topic, value=json.dumps({"i": i}).encode(), partition=0)
    assert producer.flush(30) == 0  # on the broker before an abort (which would drop records still unsent)
    (producer.commit_transaction if commit else producer.abort_transaction)(30)


@both_sources
def test_transaction_markers_and_aborted_records_neither_stall_nor_reach_a_read_committed_subscriber(
        kafka_broker, spark_kafka, topic_name, tmp_path, connector):
    """A transactional producer leaves offsets with no record a consumer sees: each commit or abort writes a
    marker, and with `isolation.level: read_committed` an aborted transaction's records are skipped too. Here the
    partition ends on a marker, so a round's range ends past the last record it reads. a is delivered by the
    shared read, b (suspended meanwhile) catches up alone over the same offsets: each gets the committed messages
    once, never the aborted ones, and ends at the partition's end offset; the second run needs no third."""
    from confluent_kafka import Producer

    kafka_broker.create_topics({topic_name: 1})
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "transactional.id": topic_name,
                         "log_level": 0})
    producer.init_transactions(30)
    settings = {"kafka": {"connector": connector, "properties": {"isolation.level": "read_committed"}}}
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, kafka_broker.bootstrap_servers, topic_name, {
            "a": {"endpoint": f"{sub.url}/a"}, "b": {"endpoint": f"{sub.url}/b", "state": "SUSPENDED"}},
            settings=settings)
        _transaction(producer, topic_name, range(0, 5), commit=True)  # offsets 0-4, marker 5
        _transaction(producer, topic_name, range(100, 103), commit=False)  # 6-8 aborted, marker 9
        _transaction(producer, topic_name, range(5, 8), commit=True)  # 10-12, marker 13
        assert kafka_broker.watermarks(topic_name) == (0, 14)
        assert Runner(load_config(conf), spark=spark_kafka).run(once=True) == 0
        assert received(sub, "/a") == list(range(8)) and received(sub, "/b") == []

        _transaction(producer, topic_name, range(200, 202), commit=False)  # 14-15 aborted, marker 16
        _transaction(producer, topic_name, range(8, 10), commit=True)  # 17-18, marker 19
        write_subscription(conf, topic_name, "b", {"endpoint": f"{sub.url}/b"})
        assert Runner(load_config(conf), spark=spark_kafka).run(once=True) == 0
        assert received(sub, "/a") == list(range(10)), "the shared read went on past the markers and the aborted"
        assert received(sub, "/b") == list(range(10)), "b caught up over the same offsets alone"

    config = load_config(conf)
    for name in ("a", "b"):
        positions = readout.offsets(config, config.subscription(f"{topic_name}.{name}"))
        assert [(p["partition"], p["offset"]) for p in positions] == [(0, 20)], name
    undelivered = DeltaRsStore(str(tmp_path / "storage")).read(UNDELIVERED).to_pylist()
    assert undelivered == [], "offsets without a record are neither lost nor undelivered messages"
