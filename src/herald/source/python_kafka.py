"""Herald's Kafka source as a PySpark Python Data Source (format ``herald_kafka``), over confluent-kafka.

Used where Spark's built-in ``kafka`` source is unavailable (its jars come only from Maven). It is a drop-in for
``spark.readStream.format("kafka").option("includeHeaders", "true")``: same columns, same option names, same
offsets JSON in the checkpoint::

    register_python_source(spark)
    df = (spark.readStream.format("herald_kafka")
          .option("kafka.bootstrap.servers", "127.0.0.1:19092")
          .option("subscribe", "orders.created,orders.paid")
          .option("startingOffsets", "earliest")        # or "latest", or '{"orders.created": {"0": 23, "1": -2}}'
          .option("maxOffsetsPerTrigger", "10000")
          .load())

Options (names are case-insensitive, as in Spark):

- ``kafka.<property>``: passed to confluent-kafka with the prefix stripped. **librdkafka property names apply**
  (they mostly match Java's; Java-only properties such as ``sasl.jaas.config`` are rejected by librdkafka with
  a clear error). ``kafka.bootstrap.servers`` is required. As in Spark, ``auto.offset.reset``,
  ``enable.auto.commit``, ``key.deserializer``, ``value.deserializer`` and ``interceptor.classes`` are refused.
  ``isolation.level`` defaults to ``read_uncommitted`` (the Java client's default, so both back-ends read the same
  records; librdkafka's own default is ``read_committed``).
- ``subscribe``: comma-separated topics (required; ``assign`` and ``subscribePattern`` are not supported).
- ``startingOffsets``: ``earliest``, ``latest`` (default) or Spark's JSON ``{"topic": {"0": 23, "1": -2}}``
  (-2 = earliest, -1 = latest; every partition of every subscribed topic must be given). Used only when a query
  starts without a checkpoint. Partitions that appear later start at earliest.
- ``maxOffsetsPerTrigger``: most records per micro-batch, shared over partitions by lag.
- ``failOnDataLoss`` (default ``true``): when records planned for reading are gone (retention, delete-records,
  a recreated topic, a ``startingOffsets`` offset outside what the partition holds) fail with an error naming
  topic, partition and offsets; ``false`` logs a warning and reads on from what is still there. A subscribed
  topic that no longer exists always fails the query, naming the topic.
- ``fetchTimeoutMs`` (default 60000 ms): how long a task waits without receiving any record before it fails
  because the planned end offset was not reached.
- ``metadataTimeoutMs`` (default 30000 ms): timeout of each metadata / list-offsets request on the driver.
- ``groupIdPrefix`` (default ``herald-source``): prefix of the ephemeral consumer group ids. ``kafka.group.id``
  replaces them; either way partitions are assigned, never subscribed, and nothing is committed.

Offsets are ``{"topic": {"partition": next offset to read}}``, topics and partitions sorted, as Spark's own.
As in Spark, a record without headers has a null ``headers`` value, and ``timestampType`` is Java's id
(0 CreateTime, 1 LogAppendTime, -1 none).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from herald.source import PYTHON_SOURCE_NAME
from herald.source.kafka_offsets import (
    EARLIEST,
    LATEST,
    Offsets,
    OffsetClient,
    Watermarks,
    canonical_offsets,
    consumer_config,
    offsets_at,
    parse_topics,
    split_read_limit,
)

log = logging.getLogger(__name__)

ARROW_BATCH_ROWS = 5000
"""Most rows in one Arrow record batch yielded by `read`."""

_POLL_TIMEOUT_S = 1.0
_KAFKA_PREFIX = "kafka."
_REFUSED_KAFKA_PROPERTIES = MappingProxyType(
    {
        "auto.offset.reset": "set the source option 'startingOffsets' instead",
        "enable.auto.commit": "the source never commits offsets to Kafka; Spark's checkpoint holds them",
        "key.deserializer": "keys are always read as binary; cast or decode them in the query",
        "value.deserializer": "values are always read as binary; cast or decode them in the query",
        "interceptor.classes": "the source does not support consumer interceptors",
    }
)
_UNSUPPORTED_OPTIONS = (
    "assign",
    "subscribePattern",
    "startingOffsetsByTimestamp",
    "startingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingOffsetsByTimestamp",
    "endingTimestamp",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "maxRecordsPerPartition",
    "minPartitions",
)

# confluent-kafka timestamp types (TIMESTAMP_NOT_AVAILABLE, _CREATE_TIME, _LOG_APPEND_TIME) -> Java's ids,
# which Spark's kafka source puts in `timestampType`.
_TIMESTAMP_TYPE_TO_SPARK = MappingProxyType({0: -1, 1: 0, 2: 1})


def kafka_schema() -> StructType:
    """The columns of Spark's kafka source with includeHeaders=true."""
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )


_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(pa.field("element", _HEADER_TYPE))),
    ]
)
"""The Arrow schema Spark expects from `read` for `kafka_schema()` (checked with `Schema.equals`)."""


class DataLossError(RuntimeError):
    """Records the query planned to read are no longer in Kafka, and failOnDataLoss is true."""


class KafkaFetchError(RuntimeError):
    """A task could not read its planned offset range from Kafka."""


@dataclass(frozen=True)
class SourceOptions:
    """The parsed, validated options of one `herald_kafka` source (plain values: picklable)."""

    client_config: Mapping[str, str]
    topics: tuple[str, ...]
    starting_offsets: str = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    fetch_timeout_ms: int = 60_000
    metadata_timeout_ms: int = 30_000
    group_id_prefix: str = "herald-source"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate Spark-style source options; raises ValueError naming the offending option."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for name in _UNSUPPORTED_OPTIONS:
            if name.lower() in opts:
                raise ValueError(f"option '{name}' of Spark's kafka source is not supported by {PYTHON_SOURCE_NAME}")
        if opts.get("includeheaders", "true").strip().lower() != "true":
            raise ValueError(f"{PYTHON_SOURCE_NAME} always includes the headers column: drop includeHeaders=false")
        client_config: dict[str, str] = {}
        for key, value in opts.items():
            if key.startswith(_KAFKA_PREFIX):
                prop = key[len(_KAFKA_PREFIX) :]
                if prop in _REFUSED_KAFKA_PROPERTIES:
                    raise ValueError(f"Kafka option '{prop}' is not supported: {_REFUSED_KAFKA_PROPERTIES[prop]}")
                client_config[prop] = value
        if not client_config.get("bootstrap.servers", "").strip():
            raise ValueError("option 'kafka.bootstrap.servers' is required")
        if "subscribe" not in opts:
            raise ValueError("option 'subscribe' (comma-separated topics) is required")
        starting = opts.get("startingoffsets", "latest").strip()
        if starting.lower() in ("earliest", "latest"):
            starting = starting.lower()
        else:
            _parse_starting_json(starting)  # validate early
        max_per_trigger = opts.get("maxoffsetspertrigger")
        if max_per_trigger is not None:
            max_per_trigger = _positive_int("maxOffsetsPerTrigger", max_per_trigger)
        return cls(
            client_config=client_config,
            topics=tuple(parse_topics(opts["subscribe"])),
            starting_offsets=starting,
            max_offsets_per_trigger=max_per_trigger,
            fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
            fetch_timeout_ms=_positive_int("fetchTimeoutMs", opts.get("fetchtimeoutms", "60000")),
            metadata_timeout_ms=_positive_int("metadataTimeoutMs", opts.get("metadatatimeoutms", "30000")),
            group_id_prefix=opts.get("groupidprefix", "herald-source"),
        )


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option '{name}' must be a positive integer, not {text!r}") from None
    if value < 1:
        raise ValueError(f"option '{name}' must be a positive integer, not {text!r}")
    return value


def _bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"option '{name}' must be true or false, not {text!r}")
    return lowered == "true"


def _parse_starting_json(text: str) -> dict[str, dict[int, int]]:
    """Spark's startingOffsets JSON -> {topic: {partition: offset or -1/-2}}; ValueError when malformed."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"option 'startingOffsets' must be earliest, latest or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, not {text!r} ({error})'
        ) from None
    if not isinstance(raw, dict) or not all(isinstance(parts, dict) for parts in raw.values()):
        raise ValueError(f'option \'startingOffsets\' JSON must look like {{"topic": {{"0": 23}}}}, not {text!r}')
    parsed: dict[str, dict[int, int]] = {}
    for topic, parts in raw.items():
        parsed[topic] = {}
        for p, offset in parts.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise ValueError(f"startingOffsets for {topic}/{p} must be an offset, -1 or -2, not {offset!r}")
            try:
                parsed[topic][int(p)] = offset
            except ValueError:
                raise ValueError(f"startingOffsets: partition id {p!r} of topic {topic} is not a number") from None
    return parsed


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """Offsets [start, end) of one topic-partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


class HeraldKafkaDataSource(DataSource):
    """Kafka as a PySpark streaming Data Source; see the module docs for options and semantics."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_SOURCE_NAME

    def schema(self) -> StructType:
        return kafka_schema()

    def streamReader(self, schema: StructType) -> HeraldKafkaStreamReader:
        if schema != kafka_schema():
            raise ValueError(
                f"{PYTHON_SOURCE_NAME} has a fixed schema ({kafka_schema().simpleString()}); "
                f"do not pass another one ({schema.simpleString()})"
            )
        return HeraldKafkaStreamReader(SourceOptions.parse(self.options))


class HeraldKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (offsets, rate limit, AvailableNow) and reads ranges on executors.

    Spark keeps one instance per query in a long-lived planner process: the broker handle and the AvailableNow
    target live there. `read` runs on executors in another copy of this object and uses only the options.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._client: OffsetClient | None = None
        self._target: dict[str, dict[int, int]] | None = None
        self._last_marks: Watermarks | None = None
        self._new_partition_starts: dict[tuple[str, int], int] = {}

    def __getstate__(self) -> dict:
        # Spark pickles the reader to ship `read` to executors: send options only, no handles or driver state.
        return {"_options": self._options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["_options"])

    # -- driver side ---------------------------------------------------------------------------------------

    def _offsets_client(self) -> OffsetClient:
        if self._client is None:
            self._client = OffsetClient(self._options.client_config, self._options.metadata_timeout_ms / 1000)
        return self._client

    def _watermarks(self) -> Watermarks:
        marks = self._offsets_client().watermarks(self._options.topics)
        self._last_marks = marks
        return marks

    def initialOffset(self) -> dict:
        marks = self._watermarks()
        starting = self._options.starting_offsets
        if starting in ("earliest", "latest"):
            offsets = offsets_at(marks, starting)
        else:
            offsets = self._specific_offsets(_parse_starting_json(starting), marks)
        log.info("%s starts at %s (startingOffsets=%s)", PYTHON_SOURCE_NAME, offsets, starting)
        return offsets

    def _specific_offsets(self, wanted: dict[str, dict[int, int]], marks: Watermarks) -> Offsets:
        extra = sorted(set(wanted) - set(marks))
        if extra:
            raise ValueError(f"startingOffsets names topics that are not subscribed: {', '.join(extra)}")
        missing = [f"{t}/{p}" for t, parts in marks.items() for p in parts if p not in wanted.get(t, {})]
        unknown = [f"{t}/{p}" for t, parts in wanted.items() for p in parts if p not in marks[t]]
        if missing or unknown:
            raise ValueError(
                "startingOffsets JSON must give every partition of every subscribed topic (use -2 for earliest, "
                f"-1 for latest); missing: {', '.join(missing) or 'none'}; not existing: {', '.join(unknown) or 'none'}"
            )
        offsets: dict[str, dict[str, int]] = {}
        for topic, parts in marks.items():
            offsets[topic] = {}
            for p, (low, high) in parts.items():
                offset = wanted[topic][p]
                if offset == EARLIEST:
                    offset = low
                elif offset == LATEST:
                    offset = high
                elif not low <= offset <= high:
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

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
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
                end.setdefault(topic, {}).setdefault(p, offset)
        return canonical_offsets(end)

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

    def _report_data_loss(self, message: str) -> None:
        if self._options.fail_on_data_loss:
            raise DataLossError(f"{message}. Set failOnDataLoss=false to skip lost records and go on.")
        log.warning("%s. Going on because failOnDataLoss=false.", message)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in Kafka."""

    def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- executor side -------------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"expected a KafkaInputPartition, got {type(partition).__name__}")
        return read_offset_range(
            self._options.client_config,
            partition.topic,
            partition.partition,
            partition.start,
            partition.end,
            fetch_timeout_s=self._options.fetch_timeout_ms / 1000,
            fail_on_data_loss=self._options.fail_on_data_loss,
            group_id_prefix=self._options.group_id_prefix,
        )


def read_offset_range(
    client_config: Mapping[str, str],
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    fetch_timeout_s: float = 60.0,
    fail_on_data_loss: bool = True,
    group_id_prefix: str = "herald-source",
    batch_rows: int = ARROW_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of `topic`/`partition` at offsets [start, end) as Arrow batches of `ARROW_SCHEMA`.

    Offsets missing inside the range (compaction, transaction markers) are skipped: reading stops once the
    consumer's position reaches `end`. Raises KafkaFetchError when `fetch_timeout_s` seconds pass without a
    record or the end, and DataLossError when the range's first records were deleted (failOnDataLoss=true;
    otherwise the read goes on from the new low watermark).
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    config = consumer_config(client_config, group_id_prefix)
    config.update({"enable.partition.eof": True, "auto.offset.reset": "error"})
    try:
        consumer = Consumer(config)
    except KafkaException as error:
        raise KafkaFetchError(f"invalid Kafka client config (librdkafka property names apply): {error}") from error
    where = f"{topic}/{partition}"
    builder = _BatchBuilder(topic, partition)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        position = start
        deadline = time.monotonic() + fetch_timeout_s
        last_error: object = None
        while position < end:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise KafkaFetchError(
                    f"timed out after {fetch_timeout_s * 1000:.0f} ms (fetchTimeoutMs) reading {where}: reached offset "
                    f"{position} of the planned range [{start}, {end}); last consumer error: {last_error}"
                )
            messages = consumer.consume(min(batch_rows, end - position), timeout=min(remaining_s, _POLL_TIMEOUT_S))
            progressed = False
            for message in messages:
                error = message.error()
                if error is None:
                    offset = message.offset()
                    if offset < position:
                        continue
                    if offset >= end:
                        position = end
                        break
                    builder.add(message)
                    position = offset + 1
                    progressed = True
                    if builder.rows >= batch_rows:
                        yield builder.flush()
                elif error.code() == KafkaError._PARTITION_EOF:
                    if message.offset() >= end:
                        position = end
                        break
                elif error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=fetch_timeout_s)
                    message_text = (
                        f"{where}: offsets from {position} were deleted before they were read "
                        f"(low watermark now {low}, planned range [{start}, {end}))"
                    )
                    if fail_on_data_loss:
                        raise DataLossError(f"{message_text}. Set failOnDataLoss=false to skip lost records and go on.")
                    log.warning("%s. Going on because failOnDataLoss=false.", message_text)
                    position = max(position, low)
                    if position < end:
                        consumer.assign([TopicPartition(topic, partition, position)])
                    progressed = True
                    break
                elif error.fatal():
                    raise KafkaFetchError(f"fatal Kafka error reading {where}: {error}")
                else:
                    last_error = error
                    log.debug("consumer error reading %s (retrying): %s", where, error)
            if progressed:
                deadline = time.monotonic() + fetch_timeout_s
        if builder.rows:
            yield builder.flush()
    finally:
        consumer.close()


class _BatchBuilder:
    """Collects consumed messages of one partition as Arrow columns."""

    def __init__(self, topic: str, partition: int) -> None:
        self._topic = topic
        self._partition = partition
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._offsets: list[int] = []
        self._timestamps_us: list[int] = []
        self._timestamp_types: list[int] = []
        self._headers: list[list[dict] | None] = []

    def add(self, message) -> None:
        kind, millis = message.timestamp()
        headers = message.headers()
        self._keys.append(message.key())
        self._values.append(message.value())
        self._offsets.append(message.offset())
        self._timestamps_us.append(millis * 1000)
        self._timestamp_types.append(_TIMESTAMP_TYPE_TO_SPARK.get(kind, -1))
        # Spark gives null (not an empty array) for a record without headers.
        self._headers.append([{"key": k, "value": v} for k, v in headers] if headers else None)
        self.rows += 1

    def flush(self) -> pa.RecordBatch:
        n = self.rows
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self._keys, pa.binary()),
                pa.array(self._values, pa.binary()),
                pa.array([self._topic] * n, pa.string()),
                pa.array([self._partition] * n, pa.int32()),
                pa.array(self._offsets, pa.int64()),
                pa.array(self._timestamps_us, pa.timestamp("us", tz="UTC")),
                pa.array(self._timestamp_types, pa.int32()),
                pa.array(self._headers, ARROW_SCHEMA.field("headers").type),
            ],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch
