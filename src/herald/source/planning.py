"""What the streaming and batch readers of ``herald_kafka`` share: input partitions, watermarks, offsets options
resolved against them, data-loss reports, and the executor-side `read`.

Planning runs in a Python process beside the driver; `read` runs in Spark's Python workers, on a pickled copy of
the reader that carries only its `SourceOptions`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from herald.source.fetch import DataLossError, read_offset_range
from herald.source.kafka_offsets import EARLIEST, LATEST, OffsetClient, Watermarks
from herald.source.options import SourceOptions, SpecificOffsets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """Offsets [start, end) of one topic-partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


def resolve_offsets(option: str, wanted: SpecificOffsets, marks: Watermarks) -> dict[str, dict[int, int]]:
    """`wanted` (a parsed offsets option) with EARLIEST / LATEST replaced by each partition's low / high watermark.

    As in Spark, the option must give every partition in `marks` and nothing else; raises ValueError naming
    `option` and the partitions that are missing or do not exist. Offsets are not checked against the watermarks.
    """
    extra = sorted(set(wanted) - set(marks))
    if extra:
        raise ValueError(f"{option} names topics that are not read: {', '.join(extra)}")
    missing = [f"{t}/{p}" for t, parts in marks.items() for p in parts if p not in wanted.get(t, {})]
    unknown = [f"{t}/{p}" for t, parts in wanted.items() for p in parts if p not in marks[t]]
    if missing or unknown:
        raise ValueError(
            f"{option} must give an offset for every partition of every topic read (use -2 for earliest, "
            f"-1 for latest); missing: {', '.join(missing) or 'none'}; not existing (or not assigned): "
            f"{', '.join(unknown) or 'none'}"
        )
    resolved: dict[str, dict[int, int]] = {}
    for topic, parts in marks.items():
        resolved[topic] = {}
        for p, (low, high) in parts.items():
            offset = wanted[topic][p]
            resolved[topic][p] = low if offset == EARLIEST else high if offset == LATEST else offset
    return resolved


class KafkaReaderBase:
    """Options, the planning side's broker client and data-loss policy, and `read` (executor side)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._client: OffsetClient | None = None

    def __getstate__(self) -> dict:
        # Spark pickles the reader to ship `read` to its workers: send options only, no handles or planning state.
        return {"_options": self._options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["_options"])

    # -- planning side ---------------------------------------------------------------------------------------

    def _offsets_client(self) -> OffsetClient:
        if self._client is None:
            self._client = OffsetClient(self._options.client_config, self._options.metadata_timeout_ms / 1000)
        return self._client

    def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _fetch_watermarks(self) -> Watermarks:
        """(low, high) of every partition read: all of the subscribed topics', or the assigned ones."""
        return self._offsets_client().watermarks(self._options.topics, self._options.assigned)

    def _report_data_loss(self, message: str) -> None:
        if self._options.fail_on_data_loss:
            raise DataLossError(f"{message}. Set failOnDataLoss=false to skip lost records and go on.")
        log.warning("%s. Going on because failOnDataLoss=false.", message)

    # -- executor side ---------------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one planned range. A batch read with nothing to read gets Spark's placeholder
        partition (``InputPartition(None)``) and yields nothing."""
        if type(partition) is InputPartition and partition.value is None:
            return iter(())
        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"expected a KafkaInputPartition, got {type(partition).__name__}")
        options = self._options
        return read_offset_range(
            options.client_config,
            partition.topic,
            partition.partition,
            partition.start,
            partition.end,
            fetch_timeout_s=options.fetch_timeout_ms / 1000,
            fail_on_data_loss=options.fail_on_data_loss,
            group_id_prefix=options.group_id_prefix,
            cache_capacity=options.consumer_cache_capacity,
        )
