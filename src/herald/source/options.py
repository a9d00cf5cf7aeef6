"""Options of the ``herald_kafka`` source, parsed and validated into a frozen, picklable `SourceOptions`.

Names are case-insensitive, as in Spark. Streaming (``spark.readStream``) and batch (``spark.read``) reads take
the same options except where said:

- ``kafka.<property>``: passed to confluent-kafka with the prefix stripped. librdkafka's property names apply
  (they mostly match Java's); Spark's Java names for TLS and SASL (``sasl.jaas.config`` with PLAIN or SCRAM,
  PEM ``ssl.truststore.*`` and ``ssl.keystore.*``) are translated to librdkafka's (`herald.kafka_properties`), so
  Spark's options for a SASL_SSL cluster work here as they are. ``kafka.bootstrap.servers`` is required. As in
  Spark, ``auto.offset.reset``, ``enable.auto.commit``, ``key.deserializer``, ``value.deserializer`` and
  ``interceptor.classes`` are refused.
  ``isolation.level`` defaults to ``read_uncommitted`` (the Java client's default, so both back-ends read the same
  records; librdkafka's own default is ``read_committed``).
- ``subscribe``: comma-separated topics; or ``assign``: Spark's JSON ``{"topic": [0, 1]}``, only those partitions.
  Exactly one of the two (``subscribePattern`` is not supported).
- ``startingOffsets``: ``earliest``, ``latest`` or Spark's JSON ``{"topic": {"0": 23, "1": -2}}`` (-2 = earliest,
  -1 = latest), which must give every partition of every subscribed topic (with ``assign``: exactly the assigned
  ones). Streaming: default ``latest``, used only when a query starts without a checkpoint; partitions that appear
  later start at earliest. Batch: default ``earliest``; ``latest`` and -1 are refused, as in Spark.
- ``endingOffsets`` (batch only): where the read stops, exclusive: ``latest`` (default: each partition's high
  watermark when the read is planned) or JSON as for ``startingOffsets`` with -1 = latest (``earliest`` and -2
  are refused, as in Spark).
- ``maxOffsetsPerTrigger`` (streaming): most records per micro-batch, shared over partitions by lag. A batch read
  ignores it with a warning, as Spark does.
- ``failOnDataLoss`` (default ``true``): when records planned for reading are gone (retention, delete-records,
  a recreated topic, a starting or ending offset outside what the partition holds) fail with an error naming
  topic, partition and offsets; ``false`` logs a warning and reads what is still there. A subscribed
  topic that no longer exists always fails the read, naming the topic.
- ``fetchTimeoutMs`` (default 60000 ms): how long a task waits without receiving any record before it fails
  because the planned end offset was not reached.
- ``metadataTimeoutMs`` (default 30000 ms): timeout of each metadata / list-offsets request while planning.
- ``groupIdPrefix`` (default ``herald-source``): prefix of the ephemeral consumer group ids. ``kafka.group.id``
  replaces them; either way partitions are assigned, never subscribed, and nothing is committed.
- ``consumerCacheCapacity`` (default 4): most idle consumers a Python worker keeps for its next tasks
  (`herald.source.consumers`); 0 creates and closes one consumer per task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from herald import kafka_properties
from herald.source import PYTHON_SOURCE_NAME
from herald.source.kafka_offsets import EARLIEST, LATEST, parse_topics

log = logging.getLogger(__name__)

SpecificOffsets = dict[str, dict[int, int]]
"""A parsed offsets JSON option: {topic: {partition: offset, or EARLIEST / LATEST}}."""

DEFAULT_CONSUMER_CACHE_CAPACITY = 4

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
    "subscribePattern",
    "startingOffsetsByTimestamp",
    "startingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsetsByTimestamp",
    "endingTimestamp",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "maxRecordsPerPartition",
    "minPartitions",
)
_MARKER_NAMES = MappingProxyType({EARLIEST: "earliest", LATEST: "latest"})


@dataclass(frozen=True)
class SourceOptions:
    """The parsed, validated options of one `herald_kafka` read (plain values: picklable).

    `starting_offsets` and `ending_offsets` keep the option's text ('earliest', 'latest' or validated JSON);
    `parse_offsets_json` turns the JSON into numbers. `assigned` is None with ``subscribe`` (every partition
    of `topics`) and the partitions of each topic with ``assign``.
    """

    client_config: Mapping[str, str]
    topics: tuple[str, ...]
    assigned: Mapping[str, tuple[int, ...]] | None = None
    starting_offsets: str = "latest"
    ending_offsets: str = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    fetch_timeout_ms: int = 60_000
    metadata_timeout_ms: int = 30_000
    group_id_prefix: str = "herald-source"
    consumer_cache_capacity: int = DEFAULT_CONSUMER_CACHE_CAPACITY

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool = False) -> SourceOptions:
        """Validate Spark-style options of a streaming read, or of a batch read with ``batch=True``.

        Raises ValueError naming the offending option.
        """
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for name in _UNSUPPORTED_OPTIONS:
            if name.lower() in opts:
                raise ValueError(f"option '{name}' of Spark's kafka source is not supported by {PYTHON_SOURCE_NAME}")
        if opts.get("includeheaders", "true").strip().lower() != "true":
            raise ValueError(f"{PYTHON_SOURCE_NAME} always includes the headers column: drop includeHeaders=false")
        topics, assigned = _parse_topics(opts)
        if batch:
            starting = _offsets_option(opts, "startingOffsets", "earliest", allowed=(EARLIEST,))
            ending = _offsets_option(opts, "endingOffsets", "latest", allowed=(LATEST,))
            _check_start_before_end(starting, ending)
            if "maxoffsetspertrigger" in opts:
                log.warning("%s: option 'maxOffsetsPerTrigger' is ignored by batch reads", PYTHON_SOURCE_NAME)
            max_per_trigger = None
        else:
            if "endingoffsets" in opts:
                raise ValueError("option 'endingOffsets' is for batch reads (spark.read) only, as in Spark")
            starting = _offsets_option(opts, "startingOffsets", "latest", allowed=(EARLIEST, LATEST))
            ending = "latest"
            max_per_trigger = opts.get("maxoffsetspertrigger")
            if max_per_trigger is not None:
                max_per_trigger = _int_option("maxOffsetsPerTrigger", max_per_trigger, minimum=1)
        return cls(
            client_config=_client_config(opts),
            topics=topics,
            assigned=assigned,
            starting_offsets=starting,
            ending_offsets=ending,
            max_offsets_per_trigger=max_per_trigger,
            fail_on_data_loss=_bool_option("failOnDataLoss", opts.get("failondataloss", "true")),
            fetch_timeout_ms=_int_option("fetchTimeoutMs", opts.get("fetchtimeoutms", "60000"), minimum=1),
            metadata_timeout_ms=_int_option("metadataTimeoutMs", opts.get("metadatatimeoutms", "30000"), minimum=1),
            group_id_prefix=opts.get("groupidprefix", "herald-source"),
            consumer_cache_capacity=_int_option(
                "consumerCacheCapacity",
                opts.get("consumercachecapacity", str(DEFAULT_CONSUMER_CACHE_CAPACITY)),
                minimum=0,
            ),
        )


def parse_offsets_json(option: str, text: str, allowed: tuple[int, ...] = (EARLIEST, LATEST)) -> SpecificOffsets:
    """Spark's offsets JSON (``{"topic": {"0": 23, "1": -2}}``) -> {topic: {partition: offset or marker}}.

    `allowed` are the markers (EARLIEST -2, LATEST -1) this option accepts. Raises ValueError naming `option`.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"option '{option}' must be earliest, latest or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, not {text!r} ({error})'
        ) from None
    if not isinstance(raw, dict) or not all(isinstance(parts, dict) for parts in raw.values()):
        raise ValueError(f'option \'{option}\' JSON must look like {{"topic": {{"0": 23}}}}, not {text!r}')
    markers = " or ".join(f"{marker} ({_MARKER_NAMES[marker]})" for marker in allowed)
    parsed: SpecificOffsets = {}
    for topic, parts in raw.items():
        parsed[topic] = {}
        for p, offset in parts.items():
            where = f"{option} for {topic}/{p}"
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise ValueError(f"{where} must be an offset (>= 0) or {markers}, not {offset!r}")
            if offset < 0 and offset not in allowed:
                raise ValueError(f"{where} can't be {_MARKER_NAMES[offset]} ({offset}) in a batch read, as in Spark")
            try:
                parsed[topic][int(p)] = offset
            except ValueError:
                raise ValueError(f"{option}: partition id {p!r} of topic {topic} is not a number") from None
    return parsed


def _parse_topics(opts: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, tuple[int, ...]] | None]:
    """(topics, assigned partitions or None) from the 'subscribe' or 'assign' option (exactly one of them)."""
    if "subscribe" in opts and "assign" in opts:
        raise ValueError("options 'subscribe' and 'assign' exclude each other: give one of them")
    if "assign" in opts:
        assigned = _parse_assign(opts["assign"])
        return tuple(sorted(assigned)), assigned
    if "subscribe" not in opts:
        raise ValueError(
            "option 'subscribe' (comma-separated topics) or 'assign' (JSON like {\"topic\": [0, 1]}) is required"
        )
    return tuple(parse_topics(opts["subscribe"])), None


def _parse_assign(text: str) -> dict[str, tuple[int, ...]]:
    """Spark's `assign` JSON ``{"topic": [0, 1]}`` -> {topic: sorted partitions}; at least one partition."""
    shape = f'option \'assign\' must be JSON like {{"topic": [0, 1]}} naming at least one partition, not {text!r}'
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(shape) from None
    if not isinstance(raw, dict) or not raw or not all(isinstance(parts, list) and parts for parts in raw.values()):
        raise ValueError(shape)
    assigned: dict[str, tuple[int, ...]] = {}
    for topic, parts in raw.items():
        if not topic.strip() or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
            raise ValueError(shape)
        assigned[topic] = tuple(sorted(set(parts)))
    return assigned


def _offsets_option(opts: Mapping[str, str], name: str, default: str, allowed: tuple[int, ...]) -> str:
    """The text of an offsets option: 'earliest', 'latest' (if `allowed` has its marker) or validated JSON."""
    text = opts.get(name.lower(), default).strip()
    word = text.lower()
    if word in ("earliest", "latest"):
        if {"earliest": EARLIEST, "latest": LATEST}[word] not in allowed:
            raise ValueError(f"option '{name}' can't be {word} in a batch read, as in Spark")
        return word
    parse_offsets_json(name, text, allowed)
    return text


def _check_start_before_end(starting: str, ending: str) -> None:
    """A batch read whose explicit start offset of a partition is after its explicit end offset is a mistake."""
    if starting in ("earliest", "latest") or ending in ("earliest", "latest"):
        return
    starts = parse_offsets_json("startingOffsets", starting, (EARLIEST,))
    ends = parse_offsets_json("endingOffsets", ending, (LATEST,))
    for topic, parts in starts.items():
        for p, start in parts.items():
            end = ends.get(topic, {}).get(p, LATEST)
            if start >= 0 and end >= 0 and start > end:
                raise ValueError(f"startingOffsets for {topic}/{p} ({start}) is after its endingOffsets ({end})")


def _client_config(opts: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options, prefix stripped; refuses the properties Spark refuses."""
    client_config: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith(_KAFKA_PREFIX):
            prop = key[len(_KAFKA_PREFIX) :]
            if prop in _REFUSED_KAFKA_PROPERTIES:
                raise ValueError(f"Kafka option '{prop}' is not supported: {_REFUSED_KAFKA_PROPERTIES[prop]}")
            client_config[prop] = value
    if not client_config.get("bootstrap.servers", "").strip():
        raise ValueError("option 'kafka.bootstrap.servers' is required")
    return kafka_properties.for_librdkafka(client_config)


def _int_option(name: str, text: str, minimum: int) -> int:
    rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option '{name}' must be {rule}, not {text!r}") from None
    if value < minimum:
        raise ValueError(f"option '{name}' must be {rule}, not {text!r}")
    return value


def _bool_option(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"option '{name}' must be true or false, not {text!r}")
    return lowered == "true"
