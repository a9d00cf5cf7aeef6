"""The herald_kafka stream reader's plan when a topic is created again with fewer partitions and later grown
back (docs/design.md §8): the planner's Kafka watermarks are scripted (its broker client is the boundary; the
integration tests run it against a real broker, tests/integration/test_topic_reset.py)."""

from __future__ import annotations

from herald.source.options import SourceOptions
from herald.source.stream_reader import HeraldKafkaStreamReader


class ScriptedReader(HeraldKafkaStreamReader):
    def __init__(self, marks) -> None:
        super().__init__(SourceOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t",
                                              "failOnDataLoss": "true"}))
        self.marks = marks

    def _fetch_watermarks(self):
        return self.marks


def test_a_partition_listed_again_is_read_from_its_start_not_from_the_old_logs_offset():
    """Partition 1 was at 10 when the topic was created again with one partition: it stays in the offsets
    (Spark's checkpoint knows it) while Kafka does not list it. Added back, it is a new log whose offsets start at
    0: the next micro-batch goes back to its start (no data loss to report: failOnDataLoss=true does not raise),
    and the one after reads it from there, instead of from 10 on, which skipped 0..9."""
    reader = ScriptedReader({"t": {0: (0, 3)}})
    end = reader.latestOffset({"t": {"0": 3, "1": 10}})
    assert end == {"t": {"0": 3, "1": 10}}, "never forgotten while Kafka does not list it"

    reader.marks = {"t": {0: (0, 3), 1: (0, 15)}}
    start, end = end, reader.latestOffset(end)
    assert end == {"t": {"0": 3, "1": 0}}
    assert reader.partitions(start, end) == []

    start, end = end, reader.latestOffset(end)
    assert end == {"t": {"0": 3, "1": 15}}
    assert [(p.partition, p.start, p.end) for p in reader.partitions(start, end)] == [(1, 0, 15)]


def test_a_partition_listed_all_along_goes_on_from_its_offset():
    reader = ScriptedReader({"t": {0: (0, 3), 1: (0, 15)}})
    assert reader.latestOffset({"t": {"0": 3, "1": 10}}) == {"t": {"0": 3, "1": 15}}
