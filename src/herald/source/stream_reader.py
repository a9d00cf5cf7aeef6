"""The streaming reader of ``herald_kafka``: initial and latest offsets, read limits, AvailableNow, partitions.

Offsets are ``{"topic": {"partition": next offset to read}}``, topics and partitions sorted, as Spark's own
kafka source writes them in the checkpoint.
"""

from __future__ import annotations

import logging
import sys

from pyspark.sql.datasource import DataSourceStreamReader

from herald.source import PYTHON_SOURCE_NAME
from herald.source.kafka_offsets import Offsets, Watermarks, canonical_offsets, offsets_at, split_read_limit
from herald.source.options import SourceOptions, SpecificOffsets, parse_offsets_json
from herald.source.planning import KafkaInputPartition, KafkaReaderBase, resolve_offsets
from herald.source.read_limits import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

log = logging.getLogger(__name__)

# The module Spark runs (`python -m ...`) for the planner process of a Python streaming source.
PLANNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


class HeraldKafkaStreamReader(KafkaReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches (offsets, rate limit, AvailableNow); `read` (from `KafkaReaderBase`) reads a range.

    Spark keeps one instance per query in a long-lived planner process: the broker handle and the AvailableNow
    target live there. `read` runs in Spark's Python workers in another copy of this object.
    """

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        if _main_module() == PLANNER_MODULE:
            quiet_when_spark_hangs_up()
        self._target: dict[str, dict[int, int]] | None = None
        self._last_marks: Watermarks | None = None
        self._new_partition_starts: dict[tuple[str, int], int] = {}
        self._unlisted: set[tuple[str, int]] = set()  # partitions the checkpoint knows and Kafka does not list
        self._relisted: set[tuple[str, int]] = set()  # of those, listed again: sent back to their start
        self._last_end: dict | None = None  # what `latestOffset` last returned (pyspark 4.0 gives no start)

    def _watermarks(self) -> Watermarks:
        marks = self._fetch_watermarks()
        self._last_marks = marks
        return marks

    def initialOffset(self) -> dict:
        marks = self._watermarks()
        starting = self._options.starting_offsets
        if starting in ("earliest", "latest"):
            offsets = offsets_at(marks, starting)
        else:
            offsets = self._specific_offsets(parse_offsets_json("startingOffsets", starting), marks)
        log.info("%s starts at %s (startingOffsets=%s)", PYTHON_SOURCE_NAME, offsets, starting)
        return offsets

    def _specific_offsets(self, wanted: SpecificOffsets, marks: Watermarks) -> Offsets:
        offsets: dict[str, dict[str, int]] = {}
        for topic, parts in resolve_offsets("startingOffsets", wanted, marks).items():
            offsets[topic] = {}
            for p, offset in parts.items():
                low, high = marks[topic][p]
                if not low <= offset <= high:
                    self._report_data_loss(
                        f"startingOffsets for {topic}/{p} is {offset}, outside the offsets the partition holds "
                        f"[{low}, {high}]"
                    )
                    offset = min(max(offset, low), high)
                offsets[topic][str(p)] = offset
        return canonical_offsets(offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        marks = self._watermarks()
        self._target = {topic: {p: high for p, (_, high) in parts.items()} for topic, parts in marks.items()}
        log.info("%s: Trigger.AvailableNow reads up to %s", PYTHON_SOURCE_NAME, self._target)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        """The end of the next micro-batch: from `start`, within `limit` (pyspark 4.0 gives neither: everything
        available, from where the last micro-batch ended; `herald.source.read_limits`)."""
        if start is None:
            start = self._last_end or {}
        if limit is None:
            limit = ReadAllAvailable()
        if not isinstance(limit, (ReadAllAvailable, ReadMaxRows)):
            raise ValueError(f"{PYTHON_SOURCE_NAME} supports ReadAllAvailable and ReadMaxRows, not {limit!r}")
        marks = self._watermarks()
        begin: dict[str, dict[str, int]] = {}
        latest: dict[str, dict[str, int]] = {}
        for topic, parts in marks.items():
            for p, (low, high) in parts.items():
                planned = (start.get(topic) or {}).get(str(p))
                if planned is None:
                    planned = self._new_partition_start(topic, p, low)
                elif (topic, p) in self._unlisted:  # added again to a topic created again: a new log, from its
                    self._unlisted.discard((topic, p))  # start (this micro-batch goes back to it, the next reads)
                    self._relisted.add((topic, p))
                    log.info("partition %s/%s is listed again: a new log, read from its earliest offset %s",
                             topic, p, low)
                    begin.setdefault(topic, {})[str(p)] = low
                    latest.setdefault(topic, {})[str(p)] = low
                    continue
                cap = high
                if self._target is not None:
                    target = self._target.get(topic, {}).get(p)
                    if target is None:
                        continue  # appeared after the AvailableNow target was taken: not this run's data
                    cap = min(high, target)
                begin.setdefault(topic, {})[str(p)] = max(int(planned), low)  # deleted records are not lag
                latest.setdefault(topic, {})[str(p)] = cap
        end = latest if isinstance(limit, ReadAllAvailable) else split_read_limit(begin, latest, limit.max_rows)
        for topic, parts in start.items():  # never forget a partition the checkpoint knows
            for p, offset in parts.items():
                if topic in marks and int(p) not in marks[topic]:  # the topic created again with fewer partitions
                    self._unlisted.add((topic, int(p)))
                end.setdefault(topic, {}).setdefault(p, offset)
        self._last_end = canonical_offsets(end)
        return self._last_end

    def _new_partition_start(self, topic: str, partition: int, low: int) -> int:
        """A partition not in the checkpoint yet starts at earliest; remembered so `partitions` uses the same."""
        key = (topic, partition)
        if key not in self._new_partition_starts:
            log.info("new partition %s/%s starts at its earliest offset %s", topic, partition, low)
            self._new_partition_starts[key] = low
        return self._new_partition_starts[key]

    def reportLatestOffset(self) -> dict | None:
        if self._last_marks is None:
            return None
        return offsets_at(self._last_marks, "latest")

    def partitions(self, start: dict, end: dict) -> list[KafkaInputPartition]:
        marks = self._last_marks if self._last_marks is not None else self._watermarks()
        result: list[KafkaInputPartition] = []
        for topic, parts in canonical_offsets(end).items():
            for p, until in parts.items():
                partition = int(p)
                low = marks.get(topic, {}).get(partition, (0, 0))[0]
                begin = (start.get(topic) or {}).get(p)
                if begin is None:
                    begin = self._new_partition_starts.get((topic, partition), low)
                if until < begin and (topic, partition) in self._relisted:
                    self._relisted.discard((topic, partition))  # a new log: nothing of the old one was there
                    continue
                if until < begin:
                    self._report_data_loss(
                        f"{topic}/{partition}: offsets went back from {begin} to {until} "
                        "(was the topic deleted and recreated?); records may have been missed"
                    )
                    continue
                if begin < low:
                    self._report_data_loss(
                        f"{topic}/{partition}: planned start offset {begin} is below the partition's low watermark "
                        f"{low}; records {begin}..{low - 1} were deleted (retention or delete-records) before they "
                        "were read"
                    )
                    begin = low
                if until > begin:
                    result.append(KafkaInputPartition(topic, partition, int(begin), int(until)))
        return result

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in Kafka."""

    def stop(self) -> None:
        self._close_client()


def _main_module() -> str | None:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None)


def quiet_when_spark_hangs_up() -> None:
    """In the planner process: no traceback when the JVM closes its socket.

    A query that stops (Ctrl-C, a restart, a configuration change) closes the planner's socket and then ends the
    process; when the socket closes while a call is on it (the stream thread is interrupted mid-call), Spark's
    runner gets a reset connection, cannot send its error back, and Python prints the traceback of an uncaught
    ConnectionResetError or BrokenPipeError to the job's stderr, where a user reads it as a failure of the
    stop. That is the JVM hanging up, nothing else: it is not printed. Anything else is printed as before
    (Spark sends the source's own errors back to the JVM, which reports them; they never get here).
    """
    previous = sys.excepthook
    if getattr(previous, "herald_quiet_hang_up", False):
        return

    def hook(kind, error, trace) -> None:
        if issubclass(kind, (ConnectionError, EOFError)):
            return
        previous(kind, error, trace)

    hook.herald_quiet_hang_up = True
    sys.excepthook = hook
