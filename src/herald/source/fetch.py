"""Executor side of the ``herald_kafka`` source: read one partition's offset range into Arrow record batches.

The columns are those of Spark's kafka source with includeHeaders=true. As in Spark, a record without headers
has a null ``headers`` value, and ``timestampType`` is Java's id (0 CreateTime, 1 LogAppendTime, -1 none).
Consumers come from the process's `herald.source.consumers.CONSUMERS` cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import pyarrow as pa

from herald.source.consumers import CONSUMERS
from herald.source.options import DEFAULT_CONSUMER_CACHE_CAPACITY

log = logging.getLogger(__name__)

ARROW_BATCH_ROWS = 5000
"""Most rows in one Arrow record batch yielded by `read_offset_range`."""

_POLL_TIMEOUT_S = 1.0

# confluent-kafka timestamp types (TIMESTAMP_NOT_AVAILABLE, _CREATE_TIME, _LOG_APPEND_TIME) -> Java's ids,
# which Spark's kafka source puts in `timestampType`.
_TIMESTAMP_TYPE_TO_SPARK = MappingProxyType({0: -1, 1: 0, 2: 1})

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
"""The Arrow schema Spark expects from a read of `kafka_schema()` (it checks with `Schema.equals`)."""


class DataLossError(RuntimeError):
    """Records the read planned are no longer in Kafka, and failOnDataLoss is true."""


class KafkaFetchError(RuntimeError):
    """A task could not read its planned offset range from Kafka."""


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
    cache_capacity: int = DEFAULT_CONSUMER_CACHE_CAPACITY,
    batch_rows: int = ARROW_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of `topic`/`partition` at offsets [start, end) as Arrow batches of `ARROW_SCHEMA`.

    Offsets missing inside the range (compaction, transaction markers) are skipped: reading stops once the
    consumer's position reaches `end`. Raises KafkaFetchError when `fetch_timeout_s` seconds pass without a
    record or the end, and DataLossError when the range's first records were deleted (failOnDataLoss=true;
    otherwise the read goes on from the new low watermark). The consumer is leased from the process's cache
    (`cache_capacity` idle consumers kept, 0 for none) and closed rather than kept when the read fails.
    """
    from confluent_kafka import KafkaException

    try:
        lease = CONSUMERS.lease(client_config, group_id_prefix, cache_capacity)
    except KafkaException as error:
        raise KafkaFetchError(f"invalid Kafka client config (librdkafka property names apply): {error}") from error
    with lease as consumer:
        yield from _consume_range(consumer, topic, partition, start, end, fetch_timeout_s, fail_on_data_loss,
                                  batch_rows)


def _consume_range(consumer, topic: str, partition: int, start: int, end: int, fetch_timeout_s: float,
                   fail_on_data_loss: bool, batch_rows: int) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import KafkaError, TopicPartition

    where = f"{topic}/{partition}"
    builder = _BatchBuilder(topic, partition)
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
            if message.topic() != topic or message.partition() != partition:
                if error is None or error.code() == KafkaError._PARTITION_EOF:
                    continue  # left over from a previous assignment of a reused consumer
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
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                           timeout=fetch_timeout_s)
                if position >= high:  # the log went back below the range (the topic created again, or its log cut)
                    _data_lost(f"{where}: the partition's log ends at {high}, before offset {position} of the planned "
                               f"range [{start}, {end}) (was the topic deleted and created again?)", fail_on_data_loss,
                               "The read of the range ends here")
                    position = end
                    break
                _data_lost(f"{where}: offsets from {position} were deleted before they were read (low watermark now "
                           f"{low}, planned range [{start}, {end}))", fail_on_data_loss, "Going on")
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


def _data_lost(message_text: str, fail_on_data_loss: bool, then: str) -> None:
    """Records planned for reading are not in Kafka: DataLossError with failOnDataLoss, else a warning saying
    what the read does `then`."""
    if fail_on_data_loss:
        raise DataLossError(f"{message_text}. Set failOnDataLoss=false to skip lost records and go on.")
    log.warning("%s. %s because failOnDataLoss=false.", message_text, then)


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
