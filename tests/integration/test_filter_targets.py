"""with_targets on a real local SparkSession: the rule sets of many subscriptions evaluated in one projection give,
set by set and row by row, what the pure-Python reference (herald.filters.evaluate) and filter_column give; the
JSON is parsed once for the union of the member paths, typed parses and Python rules are shared."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from pyspark.sql import functions as F

from herald.filters import FilterError, FilterRule, evaluate, filter_column
from herald.filters.targets import with_targets
from tests.integration.test_avropath_compile import DECODED, JSON_TEXT
from tests.integration.test_avropath_compile import headers_of as avro_headers_of

pytestmark = pytest.mark.spark

SCHEMA = "id string, value binary, headers array<struct<key:string,value:binary>>"


def jp(path, matcher, strategy="all"):
    return FilterRule("jsonpath", matcher, path=path, matching_strategy=strategy)


def ap(path, matcher, strategy="all"):
    return FilterRule("avropath", matcher, path=path, matching_strategy=strategy)


def hd(name, matcher, strategy="all"):
    return FilterRule("header", matcher, header=name, matching_strategy=strategy)


# ------------------------------------------------------------------------------- a grid of JSON messages

KINDS = ["order.created", "order.paid", "user.created", None]
COUNTRIES = ["PL", "DE", "GB", "null", "missing"]
ADDRESSES = [[], [{"country": "GB"}], [{"country": "GB", "city": "Leeds"}, {"country": "PL"}],
             {"home": {"country": "GB"}}, "GB", [{"country": "PL"}, {"city": "Paris"}, None]]


def document(n: int, kind, country, addresses) -> bytes:
    user = {"name": f"user{n % 5}", "addresses": addresses}
    if country != "missing":
        user["country"] = None if country == "null" else country
    doc = {"id": n, "tags": ["a", "b"] if n % 2 else ["b"], "amount": n % 7 + 0.5, "user": user}
    if kind is not None:
        doc["kind"] = kind
    return json.dumps(doc).encode()


DOCS = {f"d{n}": document(n, *values) for n, values in enumerate(itertools.product(KINDS, COUNTRIES, ADDRESSES))}
DOCS.update({
    "invalid": b'{"kind": "order.created", "user": {"country": "PL"',
    "not_json": b"order.created",
    "null_value": None,
    "root_array": b'[{"country": "GB"}]',
    "upper": b'{"Kind": "order.created", "kind": "x", "user": "PL"}',
})


def headers_of(name: str) -> list[tuple[str, bytes]]:
    """A `source` header (sometimes repeated), or none."""
    n = sum(map(ord, name))
    if n % 5 == 0:
        return []
    headers = [("source", [b"web", b"app", b"batch"][n % 3])]
    return headers + [("source", b"web")] if n % 4 == 0 else headers


RULE_SETS = [
    [],
    [jp("$.kind", "order.created")],
    [jp("$.kind", "order\\.created")],
    [jp("$.kind", "order\\.paid")],
    [jp("$.kind", "user\\.created")],
    [jp("$.kind", "order\\..*")],
    [jp("$.kind", "order\\.created"), jp("$.user.country", "PL")],
    [jp("$.kind", "order\\.created"), jp("$.user.country", "PL|DE")],
    [jp("$.kind", "order\\.paid"), jp("$.user.country", "PL|DE")],  # a rule shared with other sets
    [jp("$.user.country", "PL|DE")],
    [jp("$.user.country", "GB")],
    [jp("$.user.name", "user4"), jp("$.user.country", "GB|DE")],
    [jp("$.user.name", "user[0-2]")],
    [jp("$['user']['name']", "user3")],
    [jp("$.user.name", "user3"), jp("$.kind", "order\\.created")],
    [jp("$.id", "1[0-9]")],
    [jp("$.amount", "3\\.5")],
    [jp("$.tags", '\\["a","b"\\]')],
    [jp("$.user", '.*"country":"PL".*')],  # conflicts with $.user.country in the shared parse
    [jp("$.user", "PL")],
    [jp("$.user", ".*PL.*"), jp("$.user.country", "PL")],
    [jp("$.Kind", "order\\.created")],  # a sibling of $.kind that differs only in case
    [jp("$.user.addresses", "\\[\\]")],
    [jp("$.user.addresses[*].country", "GB")],
    [jp("$.user.addresses[*].country", "GB", "any")],
    [jp("$.user.addresses[*].country", "PL", "any")],
    [jp("$.user.addresses[*].country", "GB|PL")],
    [jp("$.user.addresses[*].country", "G.", "any")],
    [jp("$.user.addresses.*.country", "GB")],
    [jp("$.user.addresses.*.country", "GB"), jp("$.kind", "order\\.paid")],
    [jp("$.user.addresses[*].city", "Leeds|Paris", "any")],
    [jp("$.user.addresses[*]", ".*", "any")],
    [jp("$.user.addresses[0].country", "GB")],
    [jp("$.user.addresses[1].country", "PL")],
    [jp("$.tags[1]", "b")],
    [jp("$.tags[*]", "b")],
    [jp("$.tags[*]", "a", "any")],
    [jp("$[*].country", "GB")],
    [jp("$", ".*order.*")],
    [jp("$..country", "PL")],  # evaluated in Python
    [jp("$..country", "PL"), jp("$.kind", "user\\.created")],
    [jp("$.user.addresses[?(@.city)].country", "GB")],
    [hd("source", "web")],
    [hd("source", "web", "any")],
    [hd("source", "app|batch")],
    [hd("source", "web"), jp("$.kind", "order\\.created")],
    [hd("source", "app"), jp("$.user.addresses[*].country", "GB", "any")],
    [jp("$.kind", "order.paid"), hd("source", "app|web", "any")],
    [jp("$.kind", "order\\.created"), jp("$.user.country", "PL")],  # the same set as another
    [jp("$.user.country", "PL|DE"), jp("$.user.addresses[*].country", "GB", "any")],
    [jp("$.user.addresses[*].country", "GB", "any"), jp("$.user.country", "GB")],
    [jp("$.user.addresses[0].country", "GB"), jp("$.tags[1]", "b")],
    [jp("$.tags[*]", "a|b"), jp("$.amount", "[0-3]\\.5")],
    [jp("$.id", "[0-9]"), jp("$.user.name", "user[0-9]")],
    [jp("$.user.name", "user[14]"), jp("$..country", "PL")],
    [jp("$.user.addresses.*", ".*", "any"), jp("$.kind", "user.created")],
    [jp("user.country", "DE")],
    [jp("$.user.addresses[*].country", "GB"), hd("source", "web", "any")],
    [jp("$.kind", "order\\.created|order\\.paid")],
    [jp("$.kind", "\\Qorder.paid\\E")],
]


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(name, value, headers_of(name)) for name, value in DOCS.items()]
    return spark.createDataFrame(rows, SCHEMA).cache()


def targets_by_id(frame, rule_sets, value_col="value") -> dict:
    result = with_targets(frame, rule_sets, value_col, "headers")
    assert result.columns == [*frame.columns, "targets"]
    return {row.id: row.targets for row in result.select("id", "targets").collect()}


def expected_targets(rule_sets, values: dict, headers) -> dict:
    return {name: [i for i, rules in enumerate(rule_sets) if evaluate(rules, value, headers(name))]
            for name, value in values.items()}


def assert_not_vacuous(rule_sets, targets: dict) -> None:
    """Every set but the empty ones passes some rows and misses some."""
    for i, rules in enumerate(rule_sets):
        passing = sum(i in indices for indices in targets.values())
        assert passing == len(targets) if not rules else 0 < passing < len(targets), (i, rules, passing)


def test_targets_agree_with_the_python_reference_and_filter_column(frame):
    assert len(RULE_SETS) >= 60
    got = targets_by_id(frame, RULE_SETS)
    assert got == expected_targets(RULE_SETS, DOCS, headers_of)
    assert_not_vacuous(RULE_SETS, got)

    columns = [filter_column(rules).alias(f"s{i}") for i, rules in enumerate(RULE_SETS)]
    for row in frame.select("id", *columns).collect():
        assert [i for i in range(len(RULE_SETS)) if row[f"s{i}"]] == got[row.id], row.id


def test_targets_over_a_string_column_with_an_odd_name(frame):
    sets = RULE_SETS[:12]
    text = frame.select("id", F.col("value").cast("string").alias("the.text"), "headers")
    assert targets_by_id(text, sets, "`the.text`") == targets_by_id(frame, sets)


AVRO_SETS = [
    [],
    [ap(".user.name", "Alice")],
    [ap(".user.name", "Alice"), ap(".user.vip", "true")],
    [ap(".user.name", "Alice"), ap(".user.addresses[*].city", "London", "any")],
    [ap(".user.addresses[*].city", "London")],
    [ap(".user.addresses[*].city", "London|Warsaw")],
    [ap(".user.addresses[1].city", "Warsaw")],
    [ap(".user.addresses", "\\[.*"), ap(".user.addresses[*].city", ".*")],  # shapes that conflict
    [ap(".user.nickname", "null")],
    [ap(".user.mixed[*].city", "Paris|London", "any")],  # arrays mixing records and strings
    [ap(".user.addresses[*].extras[*].lat", "1\\.0|3\\.5")],
    [ap(".id", "x"), ap(".ID", "X"), ap(".user.status", "BANNED")],
    [ap(".user.tags[*]", "[ab]"), ap(".user.tags[0]", "a")],
    [ap(".user.friend.name", "Bob|Carol")],
    [hd("source", "web")],
    [hd("source", "app"), ap(".user.name", "Alice")],
    [ap(".user.status", "ACTIVE"), FilterRule("jsonpath", "Warsaw", path="$.user.addresses[1].city")],
]


def test_avropath_targets_over_avro_json_text(spark):
    frame = spark.createDataFrame([(name, text, avro_headers_of(name)) for name, text in JSON_TEXT.items()],
                                  "id string, json string, headers array<struct<key:string,value:binary>>")
    got = targets_by_id(frame, AVRO_SETS, "json")
    assert got == expected_targets(AVRO_SETS, JSON_TEXT, avro_headers_of)
    avro_only = [rules if all(rule.type != "jsonpath" for rule in rules) else [] for rules in AVRO_SETS]
    assert expected_targets(avro_only, DECODED, avro_headers_of) == expected_targets(avro_only, JSON_TEXT,
                                                                                     avro_headers_of)
    assert_not_vacuous(AVRO_SETS, got)


# ------------------------------------------------------------------------------- one projection


def test_one_parse_for_the_union_of_the_member_paths(frame):
    sets = [
        [jp("$.kind", "order\\.created"), jp("$.user.country", "PL")],
        [jp("$.kind", "order\\.paid"), jp("$.user.name", "user.*")],
        [jp("$.user", ".*PL.*")],  # conflicts: a parse of its own
        [jp("$.user.addresses[*].country", "GB", "any")],
        [jp("$.user.addresses[*].country", "PL"), jp("$.user.country", "PL")],  # the same typed parse
        [jp("$..country", "PL")],
        [jp("$..country", "PL"), jp("$.kind", "order\\.created")],  # the same Python rule
        [jp("$..city", "Leeds")],
        [hd("source", "web")],
        [hd("source", "app", "any"), jp("$.kind", "order\\.created")],  # the same header's values
    ]
    result = with_targets(frame, sets, "value", "headers")
    plan = result._jdf.queryExecution().optimizedPlan().toString()
    # struct parses by their first field: the union (kind, user.country, user.name), the conflicting $.user,
    # the typed parse of $.user.addresses[*].country (the others are arrays and maps read by the generic
    # fallback of the typed rules, only for the rows whose typed answer is uncertain)
    assert sorted(re.findall(r"from_json\(StructField\((\w+),", plan)) == ["kind", "user", "user"]
    union = ("from_json(StructField(kind,StringType,true), StructField(user,StructType(StructField(country,"
             "StringType,true),StructField(name,StringType,true)),true), cast(value")
    assert plan.count(union) == 1
    assert len(re.findall(r"herald_python_filter\(", plan)) == 2
    assert len(re.findall(r"source", plan)) == 1  # the header's values, extracted once
    # a filter on the targets is not pushed below their projection, which would copy conditions and parses
    filtered = result.where(F.array_contains("targets", 3))._jdf.queryExecution().optimizedPlan().toString()
    assert filtered.startswith("Filter ") and " AS targets#" in filtered.splitlines()[1]
    assert filtered.count(union) == 1

    targets_line = [line for line in result._jdf.queryExecution().executedPlan().toString().splitlines()
                    if " AS targets#" in line]
    assert len(targets_line) == 1 and "*(" not in targets_line[0]  # not in one whole-stage method
    assert targets_by_id(frame, sets) == expected_targets(sets, DOCS, headers_of)


def test_edge_cases(spark, frame):
    assert {tuple(targets) for targets in targets_by_id(frame, []).values()} == {()}
    assert {tuple(targets) for targets in targets_by_id(frame, [[], []]).values()} == {(0, 1)}

    taken = frame.withColumn("__herald_filter_0", F.lit("kept")).withColumn("out", F.lit(1))
    result = with_targets(taken, [[jp("$.kind", "order\\.paid")], [hd("source", "web")]], "value", "headers", "out")
    assert result.columns == taken.columns
    rows = result.select("id", "__herald_filter_0", "out").collect()
    assert {row["__herald_filter_0"] for row in rows} == {"kept"}
    assert {row.id: row.out for row in rows} == targets_by_id(frame, [[jp("$.kind", "order\\.paid")],
                                                                      [hd("source", "web")]])

    with pytest.raises(FilterError, match="not a valid regular expression"):
        with_targets(frame, [[jp("$.kind", "(")]], "value", "headers")
    with pytest.raises(TypeError, match="column names"):
        with_targets(frame, [[]], F.col("value"), "headers")
