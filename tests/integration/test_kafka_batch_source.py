"""Batch reads of explicit offset ranges: `spark.read.format("herald_kafka")` and `read_kafka_range`, against a
real broker (the suite's: Apache Kafka) and a real local Spark."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.errors import AnalysisException, StreamingQueryException

from herald.source import PYTHON_SOURCE_NAME
from herald.source.stream import SPARK_KAFKA_CLASS, read_kafka_range
from tests.support.herald_env import require_jars
from tests.support.kafka_source import BASE_TS_MS, base_options, produce, run_available_now

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def batch_rows(spark, options: dict[str, str]) -> list[dict]:
    """Every row of one batch read, with `timestamp_ms`, sorted by (partition, offset)."""
    reader = spark.read.format(PYTHON_SOURCE_NAME)
    for key, value in options.items():
        reader = reader.option(key, value)
    return rows_of(reader.load())


def rows_of(frame) -> list[dict]:
    rows = frame.selectExpr("*", "unix_millis(timestamp) AS timestamp_ms").collect()
    return sorted((row.asDict(recursive=True) for row in rows), key=lambda row: (row["partition"], row["offset"]))


def varied_records(count: int, partitions: int) -> list[dict]:
    """Records i to partition i % partitions, with null keys, repeated and null-valued headers, and timestamps."""
    records = []
    for i in range(count):
        headers = [("id", f"m{i}".encode()), ("trace", b"a"), ("trace", b"b"), ("empty", None)] if i % 4 else None
        records.append({"partition": i % partitions, "key": None if i % 7 == 3 else f"k{i}".encode(),
                        "value": f"v{i}".encode(), "headers": headers, "timestamp_ms": BASE_TS_MS + i})
    return records


@pytest.fixture
def filled_topic(broker, topic_name) -> str:
    """3 partitions holding offsets 0..9 each (30 varied records)."""
    broker.create_topics({topic_name: 3})
    produce(broker.bootstrap_servers, topic_name, varied_records(30, 3))
    return topic_name


def test_batch_read_of_exact_ranges_equals_the_streaming_read(source_spark, broker, filled_topic, tmp_path):
    streamed = [row for batch in run_available_now(
        source_spark, base_options(broker, filled_topic, startingOffsets="earliest"), tmp_path / "cp") for row in batch]
    starting = {filled_topic: {"0": 2, "1": 4, "2": -2}}
    ending = {filled_topic: {"0": 7, "1": 4, "2": -1}}  # p1 empty, p2 up to its high watermark (10)
    reader = source_spark.read.format(PYTHON_SOURCE_NAME)
    for key, value in base_options(broker, filled_topic, startingOffsets=json.dumps(starting),
                                   endingOffsets=json.dumps(ending)).items():
        reader = reader.option(key, value)
    frame = reader.load()

    assert frame.rdd.getNumPartitions() == 2  # one per non-empty range
    wanted = {0: range(2, 7), 1: range(0), 2: range(0, 10)}
    expected = sorted((row for row in streamed if row["offset"] in wanted[row["partition"]]),
                      key=lambda row: (row["partition"], row["offset"]))
    assert len(expected) == 15
    assert rows_of(frame) == expected  # offsets, keys, values, headers, timestamps and their types
    assert any(row["headers"] is None for row in expected) and any(row["key"] is None for row in expected)


def test_batch_read_defaults_to_earliest_until_latest(source_spark, broker, filled_topic):
    rows = batch_rows(source_spark, base_options(broker, filled_topic))
    assert [(row["partition"], row["offset"]) for row in rows] == [(p, o) for p in range(3) for o in range(10)]
    records = varied_records(30, 3)
    assert [row["value"] for row in rows] == [records[3 * o + p]["value"] for p in range(3) for o in range(10)]
    assert {row["timestamp_ms"] for row in rows} == {record["timestamp_ms"] for record in records}


def test_a_batch_read_with_nothing_to_read_is_empty(source_spark, broker, filled_topic):
    ends = json.dumps({filled_topic: {"0": 3, "1": 3, "2": 3}})
    options = base_options(broker, filled_topic, startingOffsets=ends, endingOffsets=ends)
    assert batch_rows(source_spark, options) == []


def test_assign_reads_only_the_assigned_partitions(source_spark, broker, filled_topic):
    options = {"kafka.bootstrap.servers": broker.bootstrap_servers, "assign": json.dumps({filled_topic: [1]}),
               "startingOffsets": json.dumps({filled_topic: {"1": 8}})}
    assert [(row["partition"], row["offset"]) for row in batch_rows(source_spark, options)] == [(1, 8), (1, 9)]

    options["assign"] = json.dumps({filled_topic: [1, 5]})
    with pytest.raises(AnalysisException, match=f"assigned partition.* do not exist .*: {filled_topic}/5"):
        batch_rows(source_spark, options)


@pytest.mark.parametrize("connector", ["python", "spark"])
def test_read_kafka_range_reads_exactly_the_given_ranges(source_spark, broker, filled_topic, connector):
    if connector == "spark":
        require_jars(source_spark, SPARK_KAFKA_CLASS)
    frame = read_kafka_range(source_spark, connector, broker.bootstrap_servers, {"client.id": "herald-test"},
                             filled_topic, {0: 3, 1: 5, 2: 8}, {0: 6, 1: 5, 2: 10})
    assert [(row["partition"], row["offset"]) for row in rows_of(frame)] == [(0, 3), (0, 4), (0, 5), (2, 8), (2, 9)]
    assert [row["value"] for row in rows_of(frame)] == [b"v9", b"v12", b"v15", b"v26", b"v29"]

    nothing = read_kafka_range(source_spark, connector, broker.bootstrap_servers, {}, filled_topic, {}, {})
    assert nothing.collect() == [] and nothing.columns == frame.columns


def test_read_kafka_range_refuses_malformed_ranges(source_spark, broker):
    with pytest.raises(ValueError, match="same partitions"):
        read_kafka_range(source_spark, "python", broker.bootstrap_servers, {}, "t", {0: 1}, {1: 2})
    with pytest.raises(ValueError, match=r"0 <= start <= end, not 0: \[5, 2\)"):
        read_kafka_range(source_spark, "python", broker.bootstrap_servers, {}, "t", {0: 5}, {0: 2})
    with pytest.raises(ValueError, match="connector must be 'spark' or 'python'"):
        read_kafka_range(source_spark, "java", broker.bootstrap_servers, {}, "t", {0: 1}, {0: 2})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "latest"}, "option 'startingOffsets' can't be latest in a batch read"),
        ({"endingOffsets": '{"TOPIC": {"0": 1, "1": 1}}'}, "endingOffsets must give an offset for every partition"),
        ({"kafka.enable.auto.commit": "true"}, "Kafka option 'enable.auto.commit' is not supported"),
        ({"fetchTimeoutMs": "soon"}, "option 'fetchTimeoutMs' must be a positive integer"),
    ],
)
def test_batch_option_errors_name_the_option(source_spark, broker, filled_topic, options, message):
    options = {key: value.replace("TOPIC", filled_topic) for key, value in options.items()}
    with pytest.raises(AnalysisException, match=message):
        batch_rows(source_spark, base_options(broker, filled_topic, **options))


def test_streaming_refuses_ending_offsets(source_spark, broker, filled_topic, tmp_path):
    options = base_options(broker, filled_topic, endingOffsets="latest")
    with pytest.raises((AnalysisException, StreamingQueryException), match="'endingOffsets' is for batch reads"):
        run_available_now(source_spark, options, tmp_path / "cp")


def test_batch_fail_on_data_loss(source_spark, broker, filled_topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(filled_topic, 0, 4)], request_timeout=10).values():
        future.result()

    def options(start_0: int, end_2: int, **extra: str) -> dict[str, str]:
        return base_options(broker, filled_topic, **extra,
                            startingOffsets=json.dumps({filled_topic: {"0": start_0, "1": -2, "2": -2}}),
                            endingOffsets=json.dumps({filled_topic: {"0": 6, "1": 2, "2": end_2}}))

    with pytest.raises(AnalysisException, match=f"endingOffsets for {filled_topic}/2 is 12, beyond the partition's "
                                                "high watermark 10"):
        batch_rows(source_spark, options(-2, 12))
    with pytest.raises(AnalysisException, match=f"startingOffsets for {filled_topic}/0 is 1, below the partition's "
                                                "low watermark 4: records 1..3 were deleted"):
        batch_rows(source_spark, options(1, 10))

    lenient = batch_rows(source_spark, options(1, 12, failOnDataLoss="false"))
    assert [(row["partition"], row["offset"]) for row in lenient] == (
        [(0, 4), (0, 5), (1, 0), (1, 1)] + [(2, o) for o in range(10)]
    )
