"""Kafka offset helpers over confluent-kafka, shared by the Python Kafka source and Herald's driver.

Offsets travel in the JSON shape of Spark's built-in kafka source: ``{"topic": {"0": 12, "1": 7}}``, where each
number is the *next* offset to read in that partition and partition ids are strings (JSON object keys).
Watermarks are ``{topic: {partition: (low, high)}}`` with integer partition ids: `low` is the first offset still
stored, `high` the offset the next produced record will get.

Timeouts in this module's Python API are in **seconds** (as in confluent-kafka); the source options that feed
them are in milliseconds (as in Spark).

`split_read_limit` is a pure function; everything else talks to a broker through a short-lived or caller-held
`OffsetClient`. Client configs use librdkafka property names (``bootstrap.servers``, ``security.protocol``, ...).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Literal

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]
"""Spark kafka-source offsets: {"topic": {"partition id as str": next offset to read}}."""

Watermarks = dict[str, dict[int, tuple[int, int]]]
"""{topic: {partition: (low watermark, high watermark)}}."""

DEFAULT_TIMEOUT_S = 30.0

EARLIEST = -2
"""Spark's marker in startingOffsets JSON for "the partition's earliest offset"."""
LATEST = -1
"""Spark's marker in startingOffsets JSON for "the partition's latest offset"."""


class KafkaOffsetsError(RuntimeError):
    """Offsets or metadata could not be fetched from the broker, or an offsets value is malformed."""


class UnknownTopicError(KafkaOffsetsError):
    """One or more subscribed topics do not exist on the broker."""

    def __init__(self, missing: Iterable[str], bootstrap_servers: str | None = None) -> None:
        self.missing = sorted(missing)
        where = f" on {bootstrap_servers}" if bootstrap_servers else ""
        super().__init__(
            f"Kafka topic(s) do not exist{where}: {', '.join(self.missing)}. "
            "Create them first (or check the topic name / `kafkaTopic:` mapping)."
        )


def consumer_config(client_config: Mapping[str, str], group_id_prefix: str = "herald-source") -> dict[str, object]:
    """A confluent-kafka Consumer config for assign-only use: never commits, never joins a group.

    `client_config` is passed through (librdkafka names); a unique ephemeral `group.id` is added unless the
    caller gave one, and `enable.auto.commit` is forced off. `isolation.level` defaults to `read_uncommitted`,
    the Java client's default that Spark's kafka source inherits (librdkafka's own default is `read_committed`);
    watermarks and reads use the same level, so planned end offsets are reachable.
    """
    config: dict[str, object] = dict(client_config)
    config.setdefault("group.id", f"{group_id_prefix}-{uuid.uuid4().hex}")
    config.setdefault("isolation.level", "read_uncommitted")
    config["enable.auto.commit"] = False
    return config


def parse_topics(subscribe: str) -> list[str]:
    """Topics of a Spark `subscribe` option ("a,b, c"): stripped, de-duplicated, in the given order."""
    topics: list[str] = []
    for raw in (subscribe or "").split(","):
        topic = raw.strip()
        if topic and topic not in topics:
            topics.append(topic)
    if not topics:
        raise ValueError(f"option 'subscribe' names no topic: {subscribe!r}")
    return topics


def canonical_offsets(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    """`offsets` with topics sorted by name and partitions by number, values as int.

    Spark compares a source's offsets by their JSON text, so two equal offsets must serialise identically:
    always return offsets through this function.
    """
    return {
        topic: {str(p): int(offset) for p, offset in sorted(parts.items(), key=lambda item: int(item[0]))}
        for topic, parts in sorted(offsets.items())
    }


class OffsetClient:
    """A metadata/watermark client (one confluent-kafka Consumer, never subscribed) for a driver that asks often.

    Use as a context manager or call `close()`. Not thread-safe; not picklable.
    """

    def __init__(self, client_config: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        from confluent_kafka import Consumer, KafkaException

        self._timeout_s = timeout_s
        self._bootstrap = str(client_config.get("bootstrap.servers", ""))
        self._refused: object | None = None  # the last TLS or SASL error: waiting longer does not help then
        try:
            self._consumer = Consumer({**consumer_config(client_config, "herald-offsets"), "error_cb": self._on_error})
        except KafkaException as error:
            raise KafkaOffsetsError(
                f"invalid Kafka client config (librdkafka property names apply): {error}"
            ) from error

    def __enter__(self) -> OffsetClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying consumer (idempotent)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def partitions(self, topics: Iterable[str]) -> dict[str, list[int]]:
        """Partition ids of each topic, sorted. Raises UnknownTopicError naming every missing topic.

        Reads the cluster's full metadata rather than asking per topic, so a broker with topic auto-creation
        does not create a misspelt topic.
        """
        from confluent_kafka import KafkaException

        wanted = list(topics)
        consumer = self._require()
        deadline = time.monotonic() + self._timeout_s
        while True:  # in slices of a second, to stop at once when the broker refuses the client (TLS, SASL)
            try:
                metadata = consumer.list_topics(timeout=max(0.01, min(1.0, deadline - time.monotonic())))
                break
            except KafkaException as error:
                consumer.poll(0)  # serves error_cb: why the broker could not be reached
                if self._refused is not None or time.monotonic() >= deadline:
                    why = self._refused.str() if self._refused is not None else error
                    raise KafkaOffsetsError(f"could not read Kafka metadata from {self._bootstrap}: {why}") from error
        missing = [t for t in wanted if t not in metadata.topics]
        if missing:
            raise UnknownTopicError(missing, self._bootstrap)
        result: dict[str, list[int]] = {}
        for topic in wanted:
            meta = metadata.topics[topic]
            if meta.error is not None:
                raise KafkaOffsetsError(f"Kafka topic {topic} is not readable: {meta.error}")
            result[topic] = sorted(meta.partitions)
        return result

    def watermarks(self, topics: Iterable[str], only: Mapping[str, Iterable[int]] | None = None) -> Watermarks:
        """Current (low, high) watermarks of every partition of `topics` (asked of the broker, not cached).

        With `only` ({topic: partitions}, Spark's `assign`), just those partitions of its topics; raises
        KafkaOffsetsError naming a partition its topic does not have.
        """
        from confluent_kafka import KafkaException, TopicPartition

        consumer = self._require()
        existing = self.partitions(topics if only is None else only)
        if only is not None:
            absent = [f"{t}/{p}" for t, parts in only.items() for p in parts if p not in existing[t]]
            if absent:
                raise KafkaOffsetsError(
                    f"assigned partition(s) do not exist on {self._bootstrap}: {', '.join(absent)}"
                )
            existing = {topic: sorted(only[topic]) for topic in existing}
        result: Watermarks = {}
        for topic, partitions in existing.items():
            marks: dict[int, tuple[int, int]] = {}
            for partition in partitions:
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=self._timeout_s, cached=False
                    )
                except KafkaException as error:
                    raise KafkaOffsetsError(
                        f"could not list offsets of {topic}/{partition} on {self._bootstrap}: {error}"
                    ) from error
                marks[partition] = (int(low), int(high))
            result[topic] = marks
        return result

    def offsets_for_time(self, topic: str, epoch_ms: int) -> dict[int, int]:
        """Per partition of `topic`, the first offset whose timestamp is at or after `epoch_ms`, or the end
        offset (high watermark) when there is none."""
        from confluent_kafka import KafkaException, TopicPartition

        marks = self.watermarks([topic])[topic]
        try:
            found = self._require().offsets_for_times([TopicPartition(topic, p, epoch_ms) for p in marks],
                                                      timeout=self._timeout_s)
        except KafkaException as error:
            raise KafkaOffsetsError(f"could not look up offsets by time in {topic} on {self._bootstrap}: "
                                    f"{error}") from error
        return {item.partition: item.offset if item.offset >= 0 else marks[item.partition][1] for item in found}

    def _on_error(self, error) -> None:
        from confluent_kafka import KafkaError

        if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            self._refused = error

    def _require(self):
        if self._consumer is None:
            raise KafkaOffsetsError("OffsetClient is closed")
        return self._consumer


def partition_watermarks(
    client_config: Mapping[str, str], topics: Iterable[str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> Watermarks:
    """``{topic: {partition: (low, high)}}`` for every partition of `topics`; `timeout_s` per broker request."""
    with OffsetClient(client_config, timeout_s) as client:
        return client.watermarks(topics)


def topic_ids(client_config: Mapping[str, str], topics: Iterable[str], timeout_s: float = 10.0) -> dict[str, str]:
    """Kafka's id of each of `topics` (a UUID the broker gives a topic when it is created: a topic deleted and
    created again has a new one), for the topics whose id the broker gives. An id is a hint, never a need: a
    broker without ids (before Kafka 2.8, or one that answers the all-zero id), an error or a timeout leaves the
    topic out."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    wanted = sorted(set(topics))
    if not wanted:
        return {}
    try:
        admin = AdminClient(dict(client_config))
        futures = admin.describe_topics(TopicCollection(wanted), request_timeout=timeout_s)
    except (KafkaException, ValueError, TypeError) as error:
        log.debug("topic ids of %s not known: %s", wanted, error)
        return {}
    found: dict[str, str] = {}
    for topic, future in futures.items():
        try:
            topic_id = str(future.result(timeout=timeout_s).topic_id or "")
        except Exception as error:  # noqa: BLE001 - unknown topic, no answer, an old broker: no id
            log.debug("topic id of %s not known: %s", topic, error)
            continue
        if topic_id.strip("A=") and set(topic_id) != {"0", "-"}:  # the all-zero UUID: the broker has none
            found[topic] = topic_id
    return found


def resolve_offsets(
    client_config: Mapping[str, str],
    topics: Iterable[str],
    which: Literal["earliest", "latest"],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Offsets:
    """The earliest (low watermark) or latest (high watermark) offset of every partition, in Spark's shape."""
    if which not in ("earliest", "latest"):
        raise ValueError(f"which must be 'earliest' or 'latest', not {which!r}")
    marks = partition_watermarks(client_config, topics, timeout_s)
    return offsets_at(marks, which)


def offsets_at(marks: Watermarks, which: Literal["earliest", "latest"]) -> Offsets:
    """Spark-shaped offsets at the low ("earliest") or high ("latest") watermark of each partition."""
    index = 0 if which == "earliest" else 1
    return canonical_offsets({topic: {str(p): lh[index] for p, lh in parts.items()} for topic, parts in marks.items()})


def split_read_limit(
    start: Mapping[str, Mapping[str, int]], latest: Mapping[str, Mapping[str, int]], max_rows: int
) -> Offsets:
    """End offsets that read at most `max_rows` records in total, shared by lag like Spark's rate limit.

    Every partition of `latest` must have a start in `start` (callers give a new partition its low watermark).
    A partition's share is ``max_rows * lag / total_lag`` rounded down; the rows left over by rounding go one
    each to the partitions with the largest remainders (ties: larger lag, then topic and partition order).
    Unlike Spark's `rateLimit`, which rounds small shares up, the total never exceeds `max_rows`; it still
    always makes progress when there is lag and ``max_rows >= 1``. A partition with no lag (``latest <= start``)
    ends at `latest`, as in Spark (a `latest` below `start` means offsets went back: the caller reports it).
    Partitions only in `start` are not in the result.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, not {max_rows}")
    begin_at = _normalise(start)
    end_at = _normalise(latest)
    lags: dict[tuple[str, str], int] = {}
    for topic, parts in end_at.items():
        for p, end in parts.items():
            if p not in begin_at.get(topic, {}):
                raise ValueError(f"no start offset for {topic}/{p}: give a new partition its low watermark as start")
            lags[(topic, p)] = max(0, end - begin_at[topic][p])
    total = sum(lags.values())
    if total <= max_rows:
        return canonical_offsets(end_at)
    shares = {key: max_rows * lag // total for key, lag in lags.items()}
    left = max_rows - sum(shares.values())
    by_remainder = sorted(
        (key for key, lag in lags.items() if lag > shares[key]),
        key=lambda key: (-(max_rows * lags[key] % total), -lags[key], key[0], int(key[1])),
    )
    for key in by_remainder[:left]:
        shares[key] += 1
    result: dict[str, dict[str, int]] = {}
    for topic, parts in end_at.items():
        result[topic] = {}
        for p, end in parts.items():
            result[topic][p] = end if lags[(topic, p)] == 0 else begin_at[topic][p] + shares[(topic, p)]
    return canonical_offsets(result)


def _normalise(offsets: Mapping[str, Mapping[object, int]]) -> dict[str, dict[str, int]]:
    """Offsets with str partition keys and int values (Python callers may use int keys)."""
    return {topic: {str(p): int(offset) for p, offset in parts.items()} for topic, parts in offsets.items()}
