"""Herald on Apache Kafka itself (4.4, KRaft, one node: the `kafka_broker` fixture) with Spark's built-in Kafka
source and delta-rs: what Kafka does to a running job (retention under a subscription's position, partitions
added, a topic deleted, the broker restarted) loses nothing and stops nothing else. Herald's Python source runs
the same where that costs seconds (not partitions added, the longest: 30-50 s). The same scenarios run on
noida-db with Herald's Python source in test_retention_gap.py, test_partitions_added.py and
test_topic_failures.py (tests/support/broker_scenarios.py)."""

from __future__ import annotations

import pytest

from herald.source.stream import SPARK_KAFKA_CLASS
from tests.support.broker_scenarios import (
    broker_restart_loses_nothing,
    deleted_topic_is_retried_alone,
    lost_range_is_recorded_and_delivery_goes_on,
    new_partitions_are_delivered,
)
from tests.support.herald_env import require_jars, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


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
