"""avropath rules compiled by filter_column on a real local SparkSession, over the JSON text Herald decodes Avro
records into, cross-checked against the pure-Python AvroPathPredicate evaluator over the decoded records."""

from __future__ import annotations

import copy
import io
from decimal import Decimal

import fastavro
import pytest
from pyspark.sql import functions as F

from herald.avro.convert import plain_schema, to_json
from herald.filters import FilterRule, evaluate, evaluate_rule, filter_column

pytestmark = pytest.mark.spark

FRAME_SCHEMA = "id string, value string, headers array<struct<key:string,value:binary>>"

ADDRESS = {
    "type": "record", "name": "Address", "fields": [
        {"name": "street", "type": "string"},
        {"name": "city", "type": ["null", "string"], "default": None},
        {"name": "country", "type": {"type": "enum", "name": "Country", "symbols": ["PL", "GB", "DE"]}},
        {"name": "geo", "type": ["null", {"type": "record", "name": "Geo", "fields": [
            {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}]}], "default": None},
        {"name": "lines", "type": {"type": "array", "items": "string"}},
        {"name": "extras", "type": {"type": "array", "items": ["null", "string", "Geo"]}, "default": []},
    ],
}
USER = {
    "type": "record", "name": "User", "fields": [
        {"name": "name", "type": "string"},
        {"name": "nickname", "type": ["null", "string"], "default": None},
        {"name": "age", "type": "int"},
        {"name": "balance", "type": "long"},
        {"name": "score", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "vip", "type": "boolean"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["ACTIVE", "BANNED"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "scores", "type": {"type": "array", "items": ["null", "double"]}},
        {"name": "addresses", "type": {"type": "array", "items": ADDRESS}},
        {"name": "previous", "type": ["null", {"type": "array", "items": ["null", "Address"]}], "default": None},
        {"name": "attributes", "type": {"type": "map", "values": "string"}},
        {"name": "groups", "type": {"type": "map", "values": {"type": "array", "items": "long"}}},
        {"name": "avatar", "type": ["null", "bytes"], "default": None},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "matrix", "type": {"type": "array", "items": {"type": "array", "items": "long"}}},
        {"name": "mixed", "type": {"type": "array", "items": ["null", "string", "Address"]}},
        {"name": "friend", "type": ["null", "User"], "default": None},
    ],
}
RAW_SCHEMA = {
    "type": "record", "name": "Event", "namespace": "herald.test", "fields": [
        {"name": "__metadata", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "id", "type": "string"},
        {"name": "ID", "type": "string"},
        {"name": "user", "type": USER},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
SCHEMA = fastavro.parse_schema(copy.deepcopy(RAW_SCHEMA))
READER = fastavro.parse_schema(plain_schema(copy.deepcopy(RAW_SCHEMA)))


def address(street, city="London", country="GB", geo=None, lines=("a",), extras=()):
    return {"street": street, "city": city, "country": country, "geo": geo, "lines": list(lines),
            "extras": list(extras)}


def user(name="Alice", **fields):
    base = {
        "name": name, "nickname": None, "age": 42, "balance": 9_007_199_254_740_993, "score": 1.5, "ratio": 1.1,
        "vip": True, "status": "ACTIVE", "tags": ["a", "b"], "scores": [1.0, 2.5],
        "addresses": [address("Baker St", "London", "GB", {"lat": 51.5, "lon": -0.12}),
                      address("Marszalkowska", "Warsaw", "PL", None, ["x", "y"])],
        "previous": None, "attributes": {"color": "blue", "size": "XL"}, "groups": {"admins": [1, 2]},
        "avatar": None, "price": Decimal("12.30"), "matrix": [[1, 2], [3]], "mixed": [], "friend": None,
    }
    base.update(fields)
    return base


def event(user_record, metadata=None):
    return {"__metadata": metadata, "id": "x", "ID": "X", "user": user_record, "created": 1_700_000_000_000}


RECORDS = {
    "full": event(user(nickname="Al", previous=[None, address("Old St", "Leeds")],
                       addresses=[address("Baker St", "London", "GB", {"lat": 51.5, "lon": -0.12},
                                          extras=[None, "s", {"lat": 1.0, "lon": 2.0}]),
                                  address("Marszalkowska", "Warsaw", "PL", None, ["x", "y"])],
                       mixed=[None, "plain", '{"city":"London"}', address("Mixed St", "Paris", "DE")],
                       friend=user("Bob", addresses=[address("Bob St", "Berlin", "DE")]))),
    "one_address": event(user(addresses=[address("Only St", "Leeds")], friend=user("Carol", addresses=[]))),
    "empty": event(user(name="", tags=[], scores=[], addresses=[], attributes={}, groups={}, matrix=[], mixed=[],
                        previous=[])),
    "nulls": event(user(scores=[None, 1.5], previous=[None], addresses=[address("No City", None, "PL"),
                                                                       address("Other", "London")])),
    "same_city": event(user(addresses=[address("A", "London", extras=[{"lat": 3.5, "lon": 0.0}]),
                                       address("B", "London", "PL")],
                            mixed=[address("M", "London")])),
    "unicode": event(user(name="Zoë ✓ \x01\n", tags=["żółw", 'quo"te', "back\\slash"], avatar=b"\x00\xff\x80ab",
                          attributes={"color": "zielony ✓", "odd key": "v", "": "empty"})),
    "numbers": event(user(score=1e-05, ratio=0.25, balance=-9_223_372_036_854_775_808, age=-1, vip=False,
                          scores=[1e20, -0.0, 100.0, 12345678.9, float("nan")], price=Decimal("-0.05"),
                          status="BANNED", matrix=[[], [0]])),
    "mixed_strings": event(user(mixed=['{"city":"London"}', "London"], previous=[address("P", None)])),
    "metadata": event(user(name="Meta"), metadata={"trace": "t-1", "messageId": "m-1"}),
}

DECODED = {}
JSON_TEXT = {}
for _name, _record in RECORDS.items():
    _buffer = io.BytesIO()
    fastavro.schemaless_writer(_buffer, SCHEMA, _record)
    _buffer.seek(0)
    DECODED[_name] = fastavro.schemaless_reader(_buffer, READER, None)
    JSON_TEXT[_name] = to_json(DECODED[_name])


def headers_of(name):
    return [("source", b"web" if name in ("full", "nulls", "unicode") else b"app")]


def ap(path, matcher, strategy="all"):
    return FilterRule("avropath", matcher, path=path, matching_strategy=strategy)


def header(name, matcher):
    return FilterRule("header", matcher, header=name)


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(name, JSON_TEXT[name], headers_of(name)) for name in RECORDS]
    return spark.createDataFrame(rows, FRAME_SCHEMA).cache()


def run(frame, rules_by_key: dict, value_col="value") -> dict:
    """{key: rules} -> {key: {record: bool}} from ONE Spark job; also checks that no result is null."""
    keys = list(rules_by_key)
    columns = [filter_column(rules_by_key[key], value_col).alias(f"c{i}") for i, key in enumerate(keys)]
    out = {key: {} for key in keys}
    for row in frame.select("id", *columns).collect():
        for i, key in enumerate(keys):
            assert row[f"c{i}"] is not None, f"null result for {key} on {row['id']}"
            out[key][row["id"]] = row[f"c{i}"]
    return out


def python_results(rules, source=DECODED) -> dict:
    return {name: evaluate(rules, source[name], headers_of(name)) for name in RECORDS}


def passed(results: dict) -> set:
    return {name for name, ok in results.items() if ok}


# ------------------------------------------------------------------------------- hand-written expectations

ALL = set(RECORDS)
EXPECT = [
    # Hermes' examples
    (ap(".user.name", "Alice"), ALL - {"empty", "unicode", "metadata"}),
    (ap("user.name.", "Meta"), {"metadata"}),
    (ap(".user.addresses[1].city", "Warsaw"), {"full", "unicode", "numbers", "mixed_strings", "metadata"}),
    (ap(".user.addresses[1].city", "London"), {"nulls", "same_city"}),
    (ap(".user.addresses[*].city", "London"), {"same_city"}),
    (ap(".user.addresses[*].city", "London", "any"), {"full", "nulls", "same_city", "unicode", "numbers",
                                                       "mixed_strings", "metadata"}),
    # the end of the path: missing field, null, out-of-range index -> "null"
    (ap(".user.missing", "null"), ALL),
    (ap(".user.nickname", "null"), ALL - {"full"}),
    (ap(".user.nickname", "Al"), {"full"}),
    (ap(".user.addresses[2]", "null"), ALL),
    (ap(".user.addresses[1]", "null"), {"one_address", "empty"}),
    (ap(".user.addresses[*].city", "null", "any"), {"nulls"}),
    (ap(".user.previous[*]", "null", "any"), {"full", "nulls"}),
    (ap(".__metadata", "null"), ALL),  # dropped by the conversion to JSON
    # part-way: missing field, null, scalar, out-of-range index, not an array -> no match
    (ap(".user.missing.deeper", ".*"), set()),
    (ap(".user.nickname.deeper", ".*"), set()),
    (ap(".user.name.deeper", ".*"), set()),
    (ap(".user.addresses[5].city", ".*"), set()),
    (ap(".user.previous[0].city", ".*"), {"mixed_strings"}),  # element 0 is null in "full" and "nulls"
    (ap(".user.name[0]", ".*"), set()),
    (ap(".user.missing[0]", ".*"), set()),
    (ap(".user.attributes[*]", ".*"), set()),  # a map is not an array
    (ap(".user.matrix[*].x", ".*"), set()),
    (ap(".__metadata.trace", ".*"), set()),
    # empty arrays select nothing, with either strategy
    (ap(".user.tags[*]", ".*"), ALL - {"empty"}),
    (ap(".user.tags[*]", ".*", "any"), ALL - {"empty"}),
    (ap(".user.previous[*].city", "Leeds|null", "any"), {"full", "mixed_strings"}),
    # value texts
    (ap(".user.vip", "false"), {"numbers"}),
    (ap(".user.status", "BANNED"), {"numbers"}),
    (ap(".user.score", "1\\.0E-5"), {"numbers"}),
    (ap(".user.ratio", "1\\.100000023841858"), ALL - {"numbers"}),
    (ap(".user.balance", "-9223372036854775808"), {"numbers"}),
    (ap(".user.price", "-0\\.05"), {"numbers"}),
    (ap(".user.scores[*]", "1\\.0E20|-0\\.0|100\\.0|1\\.23456789E7|null"), {"numbers"}),
    (ap(".user.avatar", "\\x00\\xff\\x80ab"), {"unicode"}),
    (ap(".user.name", "Zoë ✓ \\x01\\n"), {"unicode"}),
    (ap(".user.matrix", "\\[\\[1,2\\],\\[3\\]\\]"), ALL - {"empty", "numbers"}),
    (ap(".user.addresses[0].geo", '\\{"lat":51\\.5,"lon":-0\\.12\\}'),
     ALL - {"empty", "one_address", "nulls", "same_city"}),
    (ap(".user.attributes.color", "blue"), ALL - {"empty", "unicode"}),
    (ap(".user.attributes.odd key", "v"), {"unicode"}),
    (ap(".user.groups.admins[*]", "[12]"), ALL - {"empty"}),
    (ap(".user.groups.admins[1]", "2"), ALL - {"empty"}),
    # nested records through unions, recursion, and arrays mixing records with strings
    (ap(".user.friend.name", "Bob|Carol"), {"full", "one_address"}),
    (ap(".user.friend.addresses[*].city", "Berlin"), {"full"}),
    (ap(".user.friend.friend.name", ".*"), set()),
    (ap(".user.mixed[*].city", "Paris"), {"full"}),
    (ap(".user.mixed[*].city", "London", "any"), {"same_city"}),  # a string holding JSON text is not a record
    (ap(".user.mixed[2].city", ".*"), set()),
    (ap(".user.mixed[3].city", "Paris"), {"full"}),
    (ap(".user.addresses[*].extras[*].lat", "1\\.0|3\\.5"), {"full", "same_city"}),  # nested fallback
    (ap(".user.addresses[0].extras[2].lon", "2\\.0"), {"full"}),
    (ap(".user.mixed[*]", "null|plain|\\{.*\\}"), {"full", "same_city"}),
    (ap(".ID", "X"), ALL),
    (ap(".id", "x"), ALL),
    (ap(".created", "1700000000000"), ALL),
]


@pytest.fixture(scope="module")
def expectations(frame):
    return run(frame, {i: [rule] for i, (rule, _) in enumerate(EXPECT)})


@pytest.mark.parametrize("index", range(len(EXPECT)), ids=[f"{r.path}~{r.matcher}~{r.strategy}" for r, _ in EXPECT])
def test_expected_matches(expectations, index):
    rule, expected = EXPECT[index]
    assert passed(expectations[index]) == expected
    assert passed(python_results([rule])) == expected  # the reference over decoded records
    assert passed(python_results([rule], JSON_TEXT)) == expected  # ... and over the JSON text


def test_and_with_header_rules_shared_parses_and_a_binary_value_column(frame):
    rules = {
        "none": [],
        "path_and_header": [ap(".user.addresses[*].city", "London", "any"), header("source", "web")],
        "shared": [ap(".user.name", "Alice"), ap(".user.addresses[0].city", "London"), ap(".user.vip", "true"),
                   ap(".user.addresses[*].country", "GB|PL", "any")],
        "conflicts": [ap(".user.addresses", "\\[.*"), ap(".user.addresses[*].city", ".*"), ap(".id", "x"),
                      ap(".ID", "X"), ap(".user.tags[*]", "[ab]"), ap(".user.tags[0]", "a")],
        "with_fallback": [ap(".user.mixed[*].city", "Paris|London", "any"), ap(".user.tags[1]", "b")],
        "contradiction": [ap(".user.vip", "true"), ap(".user.vip", "false")],
        "jsonpath_too": [ap(".user.status", "ACTIVE"),
                         FilterRule("jsonpath", "Warsaw", path="$.user.addresses[1].city")],
    }
    results = run(frame, rules)
    for key, rule_list in rules.items():
        assert results[key] == python_results(rule_list, JSON_TEXT), key
        if all(rule.type != "jsonpath" for rule in rule_list):
            assert results[key] == python_results(rule_list), key
    assert passed(results["none"]) == ALL
    assert passed(results["path_and_header"]) == {"full", "nulls", "unicode"}
    assert passed(results["shared"]) == {"full", "same_city", "mixed_strings"}
    assert passed(results["conflicts"]) == ALL - {"empty", "unicode"}
    assert passed(results["with_fallback"]) == {"full", "same_city"}
    assert passed(results["contradiction"]) == set()
    assert passed(results["jsonpath_too"]) == {"full", "unicode", "mixed_strings", "metadata"}

    binary = frame.select("id", F.col("value").cast("binary").alias("bytes"), "headers")
    assert run(binary, rules, "bytes") == results


# ------------------------------------------------------------------------------- cross-check

CROSS_PATHS = [
    ".user.name", ".user.nickname", ".user.age", ".user.balance", ".user.score", ".user.ratio", ".user.vip",
    ".user.status", ".user.missing", ".user.missing.deeper", ".user.nickname.deeper", ".user.name.deeper",
    ".user.tags", ".user.tags[0]", ".user.tags[*]", ".user.tags[5]", ".user.tags[0].x", ".user.addresses",
    ".user.addresses[0]", ".user.addresses[1].city", ".user.addresses[*].city", ".user.addresses[*].country",
    ".user.addresses[*].geo", ".user.addresses[*].geo.lat", ".user.addresses[*].lines[*]",
    ".user.addresses[*].lines[1]", ".user.addresses[9].city", ".user.addresses[*].nope", ".user.scores[*]",
    ".user.scores[1]", ".user.previous", ".user.previous[*]", ".user.previous[*].city", ".user.previous[0].city",
    ".user.attributes", ".user.attributes.color", ".user.attributes.nope", ".user.groups.admins[*]",
    ".user.groups.admins[0]", ".user.groups[*]", ".user.avatar", ".user.price", ".user.matrix[*]",
    ".user.matrix[0]", ".user.matrix[*].x", ".user.mixed", ".user.mixed[*]", ".user.mixed[*].city",
    ".user.mixed[*].geo.lat", ".user.mixed[3].city", ".user.addresses[*].extras[*].lat",
    ".user.addresses[0].extras[2].lon", ".user.addresses[*].extras[*]", ".user.addresses[*].extras",
    ".user.mixed[2].city", ".user.friend", ".user.friend.name",
    ".user.friend.addresses[*].city", ".user.friend.addresses[0].lines[*]", ".user.friend.friend.name",
    ".__metadata.trace", ".__metadata", ".created", ".id", ".ID", ".user",
]
CROSS_MATCHERS = [".*", "null", "London|Warsaw|GB|PL|ACTIVE|true|[0-9]+"]
NEVER_SELECTED = {  # paths that select nothing in any record (the cross-check covers them too)
    ".user.missing.deeper", ".user.nickname.deeper", ".user.name.deeper", ".user.tags[0].x",
    ".user.addresses[9].city", ".user.groups[*]", ".user.matrix[*].x", ".user.mixed[*].geo.lat",
    ".user.mixed[2].city", ".user.friend.friend.name", ".__metadata.trace",
}


def exact_matchers(path):
    """Java \\Q..\\E matchers for two texts the reference selects with `path`, compared as whole values."""
    texts = sorted({text for record in DECODED.values() for text in _texts(path, record)})
    picked = texts[:1] + texts[-1:]
    assert all("\\E" not in text for text in picked)
    return [f"\\Q{text}\\E" for text in dict.fromkeys(picked)]


def _texts(path, record):
    from herald.filters.avropath import parse_segments, select_texts

    return select_texts(parse_segments(path), record)


def test_compiled_rules_agree_with_the_python_evaluator(frame):
    rules = {
        (path, matcher, strategy): [ap(path, matcher, strategy)]
        for path in CROSS_PATHS
        for matcher in CROSS_MATCHERS + exact_matchers(path)
        for strategy in (("all", "any") if "[*]" in path else ("all",))  # without [*], one value at most
    }
    spark_results = run(frame, rules)
    mismatches = [
        (key, name, matched)
        for key, results in spark_results.items()
        for name, matched in results.items()
        if matched != evaluate_rule(rules[key][0], DECODED[name])
    ]
    assert mismatches == []
    json_mismatches = [
        (key, name) for key, rule_list in rules.items() for name in RECORDS
        if evaluate_rule(rule_list[0], JSON_TEXT[name]) != evaluate_rule(rule_list[0], DECODED[name])
    ]
    assert json_mismatches == []
    # the check is not vacuous: plenty of both answers, and every path but the expected ones matches somewhere
    answers = [matched for results in spark_results.values() for matched in results.values()]
    assert sum(answers) > 500 and len(answers) - sum(answers) > 500
    never = {path for path in CROSS_PATHS
             if not any(any(spark_results[key].values()) for key in rules if key[0] == path)}
    assert never == NEVER_SELECTED
