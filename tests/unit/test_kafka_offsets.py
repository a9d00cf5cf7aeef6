"""Pure offset helpers: the proportional read-limit split, canonical offsets, option parsing and offsets options
resolved against watermarks (no broker)."""

from __future__ import annotations

import json
import random

import pytest

from herald.source.kafka_offsets import canonical_offsets, parse_topics, split_read_limit
from herald.source.options import SourceOptions
from herald.source.planning import resolve_offsets


def _total(start, end) -> int:
    return sum(end[t][p] - start[t][p] for t in end for p in end[t])


def test_everything_fits_returns_latest():
    start = {"t": {"0": 0, "1": 5}}
    latest = {"t": {"0": 3, "1": 6}}
    assert split_read_limit(start, latest, 10) == {"t": {"0": 3, "1": 6}}


def test_split_is_proportional_to_lag():
    start = {"t": {"0": 0, "1": 0}}
    latest = {"t": {"0": 300, "1": 100}}
    assert split_read_limit(start, latest, 40) == {"t": {"0": 30, "1": 10}}


def test_total_never_exceeds_limit_when_shares_are_small():
    # Spark rounds each small share up (5 partitions x ceil(0.4) = 5 > 2); Herald does not exceed the limit.
    start = {"t": {str(p): 10 for p in range(5)}}
    latest = {"t": {str(p): 11 for p in range(5)}}
    end = split_read_limit(start, latest, 2)
    assert _total(start, end) == 2
    assert all(end["t"][p] in (10, 11) for p in end["t"])


def test_always_progresses_with_lag_and_limit_one():
    start = {"a": {"0": 0}, "b": {"0": 0, "1": 0}}
    latest = {"a": {"0": 1}, "b": {"0": 1000, "1": 3}}
    end = split_read_limit(start, latest, 1)
    assert _total(start, end) == 1
    assert end["b"]["0"] == 1  # the largest lag gets the single row


def test_no_lag_partitions_end_at_latest_and_offsets_going_back_pass_through():
    start = {"t": {"0": 7, "1": 50, "2": 0}}
    latest = {"t": {"0": 7, "1": 20, "2": 100}}
    end = split_read_limit(start, latest, 10)
    assert end == {"t": {"0": 7, "1": 20, "2": 10}}


def test_result_is_canonical_and_accepts_int_keys():
    start = {"z": {10: 0, 2: 0}, "a": {0: 0}}
    latest = {"z": {10: 4, 2: 4}, "a": {0: 4}}
    end = split_read_limit(start, latest, 6)
    assert json.dumps(end) == json.dumps({"a": {"0": 2}, "z": {"2": 2, "10": 2}})


def test_missing_start_is_an_error():
    with pytest.raises(ValueError, match="t/1"):
        split_read_limit({"t": {"0": 0}}, {"t": {"0": 5, "1": 5}}, 3)


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        split_read_limit({"t": {"0": 0}}, {"t": {"0": 5}}, 0)


def test_random_splits_respect_limit_bounds_and_progress():
    rng = random.Random(7)
    for _ in range(500):
        parts = rng.randint(1, 8)
        start = {"t": {str(p): rng.randint(0, 50) for p in range(parts)}}
        latest = {"t": {p: s + rng.choice([0, 0, 1, 2, 5, 100, 10_000]) for p, s in start["t"].items()}}
        limit = rng.randint(1, 300)
        end = split_read_limit(start, latest, limit)
        lag = _total(start, latest)
        assert _total(start, end) == min(limit, lag)
        for p in start["t"]:
            assert start["t"][p] <= end["t"][p] <= latest["t"][p]


def test_repeated_splits_drain_every_partition():
    start = {"t": {"0": 0, "1": 0, "2": 0}}
    latest = {"t": {"0": 1, "1": 17, "2": 17}}
    batches = 0
    while True:
        batches += 1
        end = split_read_limit(start, latest, 10)
        assert 0 < _total(start, end) <= 10
        start = end
        if end == latest:
            break
    assert batches == 4


def test_canonical_offsets_sorts_numerically():
    assert list(canonical_offsets({"b": {"10": 1, "9": 2}, "a": {}})) == ["a", "b"]
    assert list(canonical_offsets({"b": {"10": 1, "9": 2}})["b"]) == ["9", "10"]


def test_parse_topics():
    assert parse_topics(" a.b , c.d,a.b,") == ["a.b", "c.d"]
    with pytest.raises(ValueError, match="subscribe"):
        parse_topics(" , ")


# -- option parsing of the herald_kafka source (pure; no JVM needed) -------------------------------------------


def _parse(batch: bool = False, **options):
    return SourceOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "a.b", **options}, batch=batch)


def test_source_options_defaults_and_kafka_passthrough():
    options = _parse(**{"kafka.security.protocol": "SSL", "maxOffsetsPerTrigger": "10", "FAILONDATALOSS": "false"})
    assert options.client_config == {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SSL"}
    assert options.topics == ("a.b",)
    assert options.starting_offsets == "latest"
    assert options.max_offsets_per_trigger == 10
    assert options.fail_on_data_loss is False
    assert options.fetch_timeout_ms == 60_000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribePattern": "a.*"}, "subscribePattern"),
        ({"kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
        ({"startingOffsets": "{nope"}, "startingOffsets"),
        ({"startingOffsets": '{"a.b": {"0": -3}}'}, "a.b/0"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"includeHeaders": "false"}, "headers"),
        ({"endingOffsets": "latest"}, "endingOffsets.*batch reads"),
        ({"consumerCacheCapacity": "-1"}, "consumerCacheCapacity"),
        ({"assign": '{"a.b": [0]}'}, "'subscribe' and 'assign' exclude each other"),
    ],
)
def test_source_options_errors_name_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        _parse(**options)


def test_source_options_require_bootstrap_and_subscribe():
    with pytest.raises(ValueError, match="kafka.bootstrap.servers"):
        SourceOptions.parse({"subscribe": "a.b"})
    with pytest.raises(ValueError, match="subscribe"):
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1"})


def test_source_options_of_a_batch_read_default_to_everything_there_is():
    options = _parse(batch=True, consumerCacheCapacity="0")
    assert (options.starting_offsets, options.ending_offsets) == ("earliest", "latest")
    assert options.consumer_cache_capacity == 0
    json_options = _parse(
        batch=True, startingOffsets='{"a.b": {"0": 3, "1": -2}}', endingOffsets=' {"a.b": {"0": 3, "1": -1}} '
    )
    assert json_options.ending_offsets == '{"a.b": {"0": 3, "1": -1}}'


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "LATEST"}, "option 'startingOffsets' can't be latest in a batch read"),
        ({"endingOffsets": "earliest"}, "option 'endingOffsets' can't be earliest in a batch read"),
        ({"startingOffsets": '{"a.b": {"0": -1}}'}, r"startingOffsets for a.b/0 can't be latest \(-1\)"),
        ({"endingOffsets": '{"a.b": {"0": -2}}'}, r"endingOffsets for a.b/0 can't be earliest \(-2\)"),
        ({"endingOffsets": '{"a.b": {"x": 3}}'}, "endingOffsets: partition id 'x'"),
        ({"endingOffsets": "[1]"}, "option 'endingOffsets' JSON must look like"),
        (
            {"startingOffsets": '{"a.b": {"0": 9, "1": 1}}', "endingOffsets": '{"a.b": {"0": 4, "1": 1}}'},
            r"startingOffsets for a.b/0 \(9\) is after its endingOffsets \(4\)",
        ),
    ],
)
def test_batch_source_options_errors_name_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        _parse(batch=True, **options)


def test_batch_ignores_max_offsets_per_trigger_with_a_warning(caplog):
    assert _parse(batch=True, maxOffsetsPerTrigger="5").max_offsets_per_trigger is None
    assert "maxOffsetsPerTrigger' is ignored by batch reads" in caplog.text


def test_assign_names_topics_and_partitions():
    options = SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "assign": '{"b.c": [2, 0, 2], "a.b": [1]}'})
    assert options.topics == ("a.b", "b.c")
    assert options.assigned == {"a.b": (1,), "b.c": (0, 2)}
    assert _parse().assigned is None


@pytest.mark.parametrize("assign", ["{}", '{"a.b": []}', '{"a.b": [-1]}', '{"a.b": ["0"]}', '["a.b"]', "{nope"])
def test_assign_must_name_partitions(assign):
    with pytest.raises(ValueError, match="option 'assign' must be JSON like"):
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "assign": assign})


def test_subscribe_or_assign_is_required():
    with pytest.raises(ValueError, match="'subscribe' .* or 'assign' .* is required"):
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1"})


def test_resolve_offsets_replaces_markers_with_watermarks():
    marks = {"t": {0: (5, 9), 1: (0, 4)}}
    assert resolve_offsets("endingOffsets", {"t": {0: -2, 1: -1}}, marks) == {"t": {0: 5, 1: 4}}
    assert resolve_offsets("endingOffsets", {"t": {0: 7, 1: 100}}, marks) == {"t": {0: 7, 1: 100}}


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        ({"t": {0: 1}}, "endingOffsets must give an offset for every partition .* missing: t/1; not existing"),
        ({"t": {0: 1, 1: 1, 2: 1}}, r"missing: none; not existing \(or not assigned\): t/2"),
        ({"t": {0: 1, 1: 1}, "u": {0: 1}}, "endingOffsets names topics that are not read: u"),
    ],
)
def test_resolve_offsets_needs_exactly_the_partitions_read(wanted, message):
    with pytest.raises(ValueError, match=message):
        resolve_offsets("endingOffsets", wanted, {"t": {0: (0, 4), 1: (0, 4)}})


def test_arrow_schema_is_the_spark_schema():
    from pyspark.sql.pandas.types import to_arrow_schema

    from herald.source.fetch import ARROW_SCHEMA
    from herald.source.python_kafka import kafka_schema

    assert to_arrow_schema(kafka_schema(), timezone="UTC").equals(ARROW_SCHEMA)
