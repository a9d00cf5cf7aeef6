"""Herald's Python Kafka Data Source (`herald_kafka`) against a real broker (the suite's: Apache
Kafka) and a real local Spark."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.errors import StreamingQueryException

from tests.support.kafka_source import BASE_TS_MS, base_options, produce, run_available_now, simple_records

pytestmark = [pytest.mark.spark, pytest.mark.broker]

def values(batches: list[list[dict]]) -> list[bytes]:
    return sorted(row["value"] for batch in batches for row in batch)


def test_available_now_reads_every_record_once_with_all_columns(source_spark, broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 3})
    records = []
    for i in range(30):
        headers = [("id", f"m{i}".encode()), ("trace", b"a"), ("trace", b"b"), ("empty", None)] if i % 5 else None
        records.append(
            {
                "partition": i % 3,
                "key": None if i == 7 else f"k{i}".encode(),
                "value": f"v{i}".encode(),
                "headers": headers,
                "timestamp_ms": BASE_TS_MS + i,
            }
        )
    produce(broker.bootstrap_servers, topic_name, records)

    batches = run_available_now(
        source_spark, base_options(broker, topic_name, startingOffsets="earliest"), tmp_path / "cp"
    )

    rows = [row for batch in batches for row in batch]
    assert len(rows) == 30
    assert len({(row["partition"], row["offset"]) for row in rows}) == 30
    by_value = {row["value"]: row for row in rows}
    for i, record in enumerate(records):
        row = by_value[record["value"]]
        assert row["key"] == record["key"]
        assert row["topic"] == topic_name
        assert row["partition"] == record["partition"]
        assert row["offset"] == i // 3  # each partition got every third record, in order
        assert row["timestamp_ms"] == record["timestamp_ms"]
        assert row["timestampType"] == 0  # CreateTime, as Java's TimestampType id
        if record["headers"] is None:
            assert row["headers"] is None  # as Spark's kafka source: null, not []
        else:
            assert [(h["key"], h["value"]) for h in row["headers"]] == record["headers"]


def test_max_offsets_per_trigger_splits_into_small_batches(source_spark, broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 3})
    records = [{"partition": 0 if i < 20 else i % 3, "value": f"v{i}".encode()} for i in range(35)]  # lag 25/5/5
    produce(broker.bootstrap_servers, topic_name, records)

    batches = run_available_now(
        source_spark,
        base_options(broker, topic_name, startingOffsets="earliest", maxOffsetsPerTrigger="10"),
        tmp_path / "cp",
    )

    sizes = [len(batch) for batch in batches if batch]
    assert len(sizes) >= 4, sizes
    assert max(sizes) <= 10, sizes
    assert sum(sizes) == 35
    assert values(batches) == sorted(f"v{i}".encode() for i in range(35))


def test_restart_from_checkpoint_reads_only_new_records(source_spark, broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    options = base_options(broker, topic_name, startingOffsets="earliest")
    produce(broker.bootstrap_servers, topic_name, simple_records(6, 2, "old"))
    first = run_available_now(source_spark, options, tmp_path / "cp")
    assert values(first) == sorted(f"old{i}".encode() for i in range(6))

    produce(broker.bootstrap_servers, topic_name, simple_records(5, 2, "new"))
    second = run_available_now(source_spark, options, tmp_path / "cp")

    assert values(second) == sorted(f"new{i}".encode() for i in range(5))


def test_starting_offsets_latest_earliest_and_json(source_spark, broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, simple_records(8, 2, "old"))  # offsets 0..3 in each partition

    earliest_options = base_options(broker, topic_name, startingOffsets="earliest")
    earliest = run_available_now(source_spark, earliest_options, tmp_path / "e")
    assert len(values(earliest)) == 8

    specific = json.dumps({topic_name: {"0": 2, "1": -2}})
    json_options = base_options(broker, topic_name, startingOffsets=specific)
    from_json = run_available_now(source_spark, json_options, tmp_path / "j")
    assert {(row["partition"], row["offset"]) for batch in from_json for row in batch} == {
        (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)
    }

    latest_options = base_options(broker, topic_name, startingOffsets="latest")
    assert values(run_available_now(source_spark, latest_options, tmp_path / "l")) == []
    produce(broker.bootstrap_servers, topic_name, simple_records(3, 2, "new"))
    assert values(run_available_now(source_spark, latest_options, tmp_path / "l")) == [b"new0", b"new1", b"new2"]


def test_starting_offsets_json_must_cover_every_partition(source_spark, broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    specific = json.dumps({topic_name: {"0": -2}})
    with pytest.raises(StreamingQueryException, match=f"missing: {topic_name}/1"):
        run_available_now(source_spark, base_options(broker, topic_name, startingOffsets=specific), tmp_path / "cp")


def test_missing_topic_gives_a_clear_error(source_spark, broker, topic_name, tmp_path):
    with pytest.raises(StreamingQueryException) as failure:
        run_available_now(source_spark, base_options(broker, topic_name), tmp_path / "cp")
    assert f"do not exist on {broker.bootstrap_servers}: {topic_name}" in str(failure.value)


def test_fail_on_data_loss(source_spark, broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, simple_records(4, 1, "old"))
    options = base_options(broker, topic_name, startingOffsets="earliest")
    assert len(values(run_available_now(source_spark, options, tmp_path / "strict"))) == 4
    assert len(values(run_available_now(source_spark, options, tmp_path / "lenient"))) == 4

    # Both checkpoints now start at offset 4; records 4..7 are published and 4..5 deleted before being read.
    produce(broker.bootstrap_servers, topic_name, simple_records(4, 1, "new"))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(topic_name, 0, 6)], request_timeout=10).values():
        future.result()

    expected = rf"{topic_name}/0: planned start offset 4 is below the partition's low watermark 6"
    with pytest.raises(StreamingQueryException, match=expected):
        run_available_now(source_spark, options, tmp_path / "strict")
    lenient = run_available_now(source_spark, {**options, "failOnDataLoss": "false"}, tmp_path / "lenient")
    assert values(lenient) == [b"new2", b"new3"]
