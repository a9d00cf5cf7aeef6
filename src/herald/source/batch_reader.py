"""The batch reader of ``herald_kafka``: explicit offset ranges, with the semantics of Spark's kafka batch source.

``startingOffsets`` (default ``earliest``) and ``endingOffsets`` (default ``latest``) are resolved against the
partitions' watermarks when the read is planned. Each partition with something to read becomes one input
partition (one Spark task) of offsets [start, end); an empty range becomes none. With failOnDataLoss=true a
range that reaches outside what the partition holds fails the read, naming it; with false it is cut to what is
still there, with a warning:

- a start below the low watermark: those records were deleted (retention, delete-records);
- a start or an end above the high watermark: those offsets do not exist (was the topic recreated?).
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSourceReader

from herald.source.kafka_offsets import EARLIEST, LATEST, Watermarks, offsets_at
from herald.source.options import parse_offsets_json
from herald.source.planning import KafkaInputPartition, KafkaReaderBase, resolve_offsets

log = logging.getLogger(__name__)


class HeraldKafkaBatchReader(KafkaReaderBase, DataSourceReader):
    """Plans a batch read (`partitions`, once, beside the driver); `read` (from `KafkaReaderBase`) reads a range."""

    def partitions(self) -> list[KafkaInputPartition]:
        try:
            marks = self._fetch_watermarks()
        finally:
            self._close_client()
        starts = _resolve("startingOffsets", self._options.starting_offsets, marks, EARLIEST)
        ends = _resolve("endingOffsets", self._options.ending_offsets, marks, LATEST)
        result: list[KafkaInputPartition] = []
        for topic, parts in marks.items():
            for partition, (low, high) in parts.items():
                start, end = self._within(f"{topic}/{partition}", starts[topic][partition], ends[topic][partition],
                                          low, high)
                if start < end:
                    result.append(KafkaInputPartition(topic, partition, start, end))
        log.debug("batch read of %d range(s): %s", len(result), result)
        return result

    def _within(self, where: str, start: int, end: int, low: int, high: int) -> tuple[int, int]:
        """[start, end) cut to [low, high], each cut reported as data loss (which raises with failOnDataLoss)."""
        if end > high:
            self._report_data_loss(
                f"endingOffsets for {where} is {end}, beyond the partition's high watermark {high} (the offset the "
                f"next record will get): offsets {high}..{end - 1} hold no record"
            )
            end = high
        if start > high:
            self._report_data_loss(
                f"startingOffsets for {where} is {start}, beyond the partition's high watermark {high}"
            )
            return high, high
        if start < low and start < end:
            self._report_data_loss(
                f"startingOffsets for {where} is {start}, below the partition's low watermark {low}: records "
                f"{start}..{min(low, end) - 1} were deleted (retention or delete-records) before they were read"
            )
        return max(start, low), end


def _resolve(option: str, text: str, marks: Watermarks, marker: int) -> dict[str, dict[int, int]]:
    """An offsets option ('earliest', 'latest' or JSON allowing `marker`) as numbers for every partition read."""
    if text in ("earliest", "latest"):
        return {topic: {int(p): o for p, o in parts.items()} for topic, parts in offsets_at(marks, text).items()}
    return resolve_offsets(option, parse_offsets_json(option, text, (marker,)), marks)
