"""The consumer cache of the herald_kafka source with a real broker: consecutive reads in one process share a
consumer, read exactly what fresh consumers read, and a consumer whose read failed is not reused; in Spark, a
Python worker reuses its consumer from one read to the next."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pytest

from herald.source.consumers import CONSUMERS
from herald.source.fetch import DataLossError, read_offset_range
from tests.support.kafka_source import produce, simple_records

pytestmark = [pytest.mark.broker]

# Forwards, backwards, another partition, an empty range, the same range again, up to the high watermark (20).
RANGES = [(0, 0, 5), (0, 5, 12), (0, 2, 4), (1, 3, 9), (0, 7, 7), (0, 2, 4), (1, 0, 20), (0, 15, 20)]


def read_all(bootstrap: str, topic: str, prefix: str, capacity: int) -> list[list[tuple[int, int, bytes]]]:
    """(partition, offset, value) of each range of RANGES, read one after the other in this process."""
    results = []
    for partition, start, end in RANGES:
        batches = list(read_offset_range({"bootstrap.servers": bootstrap}, topic, partition, start, end,
                                         fetch_timeout_s=10, group_id_prefix=prefix, cache_capacity=capacity))
        table = pa.Table.from_batches(batches) if batches else pa.table({"partition": [], "offset": [], "value": []})
        results.append(list(zip(table["partition"].to_pylist(), table["offset"].to_pylist(),
                                table["value"].to_pylist())))
    return results


@pytest.fixture(scope="module", autouse=True)
def close_idle_consumers():
    """This process's idle consumers go before the broker does."""
    yield
    CONSUMERS.clear()


@pytest.fixture
def topic(broker, topic_name) -> str:
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, simple_records(40, 2))  # offsets 0..19 in each partition
    return topic_name


def test_consecutive_reads_share_one_consumer_and_read_the_same_records(broker, topic):
    prefix = f"cache-test-{uuid.uuid4().hex}"  # a key of its own in this process's cache
    before = CONSUMERS.stats()
    cached = read_all(broker.bootstrap_servers, topic, prefix, capacity=4)
    after = CONSUMERS.stats()
    assert (after.created - before.created, after.reused - before.reused) == (1, len(RANGES) - 1)

    fresh = read_all(broker.bootstrap_servers, topic, f"{prefix}-fresh", capacity=0)
    assert CONSUMERS.stats().created - after.created == len(RANGES)
    assert cached == fresh
    assert [len(records) for records in cached] == [end - start for _, start, end in RANGES]
    assert cached[0] == [(0, offset, f"v{2 * offset}".encode()) for offset in range(5)]


def test_a_consumer_whose_read_failed_is_closed_and_replaced(broker, topic):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    prefix = f"cache-test-{uuid.uuid4().hex}"
    config = {"bootstrap.servers": broker.bootstrap_servers}
    assert len(list(read_offset_range(config, topic, 0, 0, 3, group_id_prefix=prefix))) == 1
    admin = AdminClient(config)
    for future in admin.delete_records([TopicPartition(topic, 0, 5)], request_timeout=10).values():
        future.result()
    before = CONSUMERS.stats()

    with pytest.raises(DataLossError, match=f"{topic}/0: offsets from 3 were deleted"):
        list(read_offset_range(config, topic, 0, 3, 8, fetch_timeout_s=10, group_id_prefix=prefix))
    failed = CONSUMERS.stats()
    assert (failed.reused - before.reused, failed.closed - before.closed) == (1, 1)

    batches = list(read_offset_range(config, topic, 0, 5, 8, fetch_timeout_s=10, group_id_prefix=prefix))
    assert pa.Table.from_batches(batches)["offset"].to_pylist() == [5, 6, 7]
    assert CONSUMERS.stats().created - failed.created == 1


def consumer_stats_source():
    """A data source (defined here, so Spark pickles it by value) that reads herald_kafka ranges and returns, per
    task, the Python worker's pid, its consumer cache's counts and the rows it read."""
    from pyspark.sql.datasource import DataSourceReader

    from herald.source.python_kafka import HeraldKafkaDataSource, kafka_schema

    class StatsReader(DataSourceReader):
        def __init__(self, kafka_reader) -> None:
            self.kafka_reader = kafka_reader

        def partitions(self):
            return self.kafka_reader.partitions()

        def read(self, partition):
            from herald.source.consumers import CONSUMERS as worker_consumers  # noqa: N811 - a worker's copy

            rows = sum(batch.num_rows for batch in self.kafka_reader.read(partition))
            stats = worker_consumers.stats()
            yield os.getpid(), stats.created, stats.reused, rows

    class ConsumerStatsSource(HeraldKafkaDataSource):
        @classmethod
        def name(cls) -> str:
            return "herald_kafka_consumer_stats"

        def schema(self) -> str:
            return "pid int, created long, reused long, rows long"

        def reader(self, schema):
            return StatsReader(HeraldKafkaDataSource.reader(self, kafka_schema()))

    return ConsumerStatsSource


@pytest.mark.spark
def test_a_spark_python_worker_reuses_its_consumer_across_reads(spark, broker, topic):
    spark.dataSource.register(consumer_stats_source())
    tasks = []
    for start in range(0, 20, 2):  # ten consecutive one-task reads of 2 records
        frame = (spark.read.format("herald_kafka_consumer_stats")
                 .option("kafka.bootstrap.servers", broker.bootstrap_servers).option("assign", f'{{"{topic}": [0]}}')
                 .option("startingOffsets", f'{{"{topic}": {{"0": {start}}}}}')
                 .option("endingOffsets", f'{{"{topic}": {{"0": {start + 2}}}}}').load())
        tasks.extend(row.asDict() for row in frame.collect())

    assert [task["rows"] for task in tasks] == [2] * 10
    by_worker: dict[int, list[dict]] = {}
    for task in tasks:
        by_worker.setdefault(task["pid"], []).append(task)
    assert len(by_worker) < len(tasks), f"no Python worker served two reads: {tasks}"
    for served in by_worker.values():
        # after its first read, a worker never creates another consumer for this source: each next read reuses it
        assert {task["created"] for task in served} == {served[0]["created"]}, served
        assert [task["reused"] - served[0]["reused"] for task in served] == list(range(len(served))), served


def test_a_range_past_the_end_of_the_log_ends_the_read_instead_of_asking_again_forever(broker, topic):
    """A range planned in a log that went back before the task read it (the topic created again, or its log cut):
    the partition now ends at 20, below the range [25, 30). With failOnDataLoss=false the read ends with nothing
    (the job finds the reset from the offsets); it used to assign the same offset again at every
    out-of-range answer, with its deadline renewed each time, and never ended. With failOnDataLoss=true it fails."""
    import threading

    config = {"bootstrap.servers": broker.bootstrap_servers}
    prefix = f"cache-test-{uuid.uuid4().hex}"
    read: list = []
    reader = threading.Thread(target=lambda: read.append(list(read_offset_range(
        config, topic, 0, 25, 30, fetch_timeout_s=5, fail_on_data_loss=False, group_id_prefix=prefix))),
        daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "the read of offsets the log does not have never ended"
    assert read == [[]]
    with pytest.raises(DataLossError, match=f"{topic}/0: the partition's log ends at 20"):
        list(read_offset_range(config, topic, 0, 25, 30, fetch_timeout_s=5, group_id_prefix=prefix))
