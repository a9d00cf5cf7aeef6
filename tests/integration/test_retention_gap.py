"""Records Kafka deleted before they were delivered (retention, delete-records) never stop delivery: Herald goes
on from the earliest offset still there and records the lost range for each subscription it concerns, on the
shared query and in catch-up (issue: nothing lost, nothing stuck). noida-db with delete-records and Herald's
Python source here; Apache Kafka's own retention with Spark's source in test_real_broker.py. Real Spark, HTTP,
Delta tables."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.broker_scenarios import lost_range_is_recorded_and_delivery_goes_on

pytestmark = [pytest.mark.spark, pytest.mark.broker]


@pytest.fixture
def broker(embedded_broker):
    """noida-db, the demo's broker: Apache Kafka runs these scenarios in test_real_broker.py."""
    return embedded_broker


def _delete_below(bootstrap: str, topic: str, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, offset)]).values():
        future.result()


def test_a_deleted_range_is_recorded_as_lost_and_delivery_goes_on(broker, spark, topic_name, tmp_path, caplog):
    other = f"{topic_name}_other"
    broker.create_topics({topic_name: 1, other: 1})
    lost_range_is_recorded_and_delivery_goes_on(
        broker, spark, topic_name, other, tmp_path, caplog, connector="python",
        delete_first_ten=lambda: _delete_below(broker.bootstrap_servers, topic_name, 10))
