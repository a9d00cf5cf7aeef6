"""filter_column on a real local SparkSession: Hermes semantics, the get_json_object pitfalls, headers, the
Python fallback, and a cross-check of every compiled rule against the pure-Python evaluator."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F

from herald.filters import FilterRule, evaluate_rule, filter_column

pytestmark = pytest.mark.spark

SCHEMA = "id string, value binary, headers array<struct<key:string,value:binary>>"


def jp(path, matcher, strategy="all"):
    return FilterRule("jsonpath", matcher, path=path, matching_strategy=strategy)


def header(name, matcher, strategy="all"):
    return FilterRule("header", matcher, header=name, matching_strategy=strategy)


def _bytes(document):
    if document is None or isinstance(document, bytes):
        return document
    return (document if isinstance(document, str) else json.dumps(document)).encode()


DOCS = {
    "user": {"user": {"name": "Alice", "country": "PL", "age": 42, "vip": True, "score": 1.50, "big": 1e2,
                      "tiny": 0.00001, "meta": {"b": 1, "c": [1, "x", None]}, "nothing": None, "tags": ["a", "b"],
                      "note": "PL\n"}},
    "arr2": {"user": {"addresses": [{"country": "GB", "city": "London"}, {"country": "PL", "city": "Warsaw"}]}},
    "arr1": {"user": {"addresses": [{"country": "GB", "city": "Leeds"}]}},
    "arr_gb": {"user": {"addresses": [{"country": "GB"}, {"country": "GB"}]}},
    "arr_empty": {"user": {"addresses": []}},
    "arr_missing_member": {"user": {"addresses": [{"country": "GB"}, {"city": "Paris"}]}},
    "arr_null_member": {"user": {"addresses": [{"country": "GB"}, {"country": None}]}},
    "arr_null_first": {"user": {"addresses": [{"country": None}, {"country": "GB"}]}},
    "arr_null_element": {"user": {"addresses": [{"country": "GB"}, None]}},
    "arr_mixed": {"user": {"addresses": [{"country": "GB"}, "GB", 5, ["GB"], {"country": {"code": "GB"}}]}},
    "obj": {"user": {"addresses": {"home": {"country": "GB"}, "work": {"country": "PL"}}}},
    "obj_gb": {"user": {"addresses": {"home": {"country": "GB"}, "work": {"country": "GB"}}}},
    "obj_single": {"user": {"addresses": {"home": {"country": "GB"}}}},
    "addresses_string": {"user": {"addresses": "GB"}},
    "hermes": {"addresses": [{"country": "PL"}, {"country": "PL"}]},
    "hermes_mixed": {"addresses": [{"country": "PL"}, {"country": "DE"}]},
    "hermes_obj": {"addresses": {"a": {"country": "PL"}}},
    "items_gb": {"items": ["GB", "GB"]},
    "items_one": {"items": ["GB"]},
    "items_null": {"items": ["GB", None]},
    "items_values": {"items": [1, 2.5, 1e2, True, {"x": 1}, [1, 2], "1"]},
    "items_nested_one": {"items": [["GB", "PL"]]},
    "nested": {"orders": [{"lines": [{"sku": "A1"}, {"sku": "A2"}]}, {"lines": [{"sku": "A3"}]}]},
    "nested_mixed": {"orders": [{"lines": [{"sku": "A1"}]}, {"lines": {"l1": {"sku": "B1"}}}, {"lines": None}]},
    "nested_empty": {"orders": [{"lines": []}, {"lines": []}]},
    "root_array": [{"country": "GB"}, {"country": "GB"}],
    "root_object_values": {"a": "GB", "b": "GB"},
    "odd_keys": {"odd keys": {"a.b": "dot", "it's": "quote", "x y": "space", "": "empty", "we`ird": "tick"},
                 "Case": "upper", "case": "lower", "li`st's": [{"x.y": "v"}, {"x.y": "v"}]},
    "unicode": {"user": {"name": "Zoë ✓ \u0001", "country": "PL"}},
    "deep_index": {"a": [{"b": ["x", "y"]}, "s", {"b": ["z"]}, {"b": [None, "null"]}]},
    "null_by_index": {"items": [None, "null", [None]], "a": [{"b": [None]}]},
    "trailing": '{"user": {"country": "PL"}} trailing text',
    "invalid": '{"user": {"country": "PL"',
    "not_json": "hello",
    "empty": "",
    "null_value": None,
}


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(name, _bytes(document), [("id", name.encode())]) for name, document in DOCS.items()]
    return spark.createDataFrame(rows, SCHEMA).cache()


def run(frame, rules_by_key: dict) -> dict:
    """{key: rules} -> {key: {doc: bool}} from ONE Spark job; also checks that no result is null."""
    keys = list(rules_by_key)
    columns = [filter_column(rules_by_key[key]).alias(f"c{i}") for i, key in enumerate(keys)]
    out = {key: {} for key in keys}
    for row in frame.select("id", *columns).collect():
        for i, key in enumerate(keys):
            assert row[f"c{i}"] is not None, f"null result for {key} on {row['id']}"
            out[key][row["id"]] = row[f"c{i}"]
    return out


def python_results(rules) -> dict:
    return {
        name: all(evaluate_rule(rule, _bytes(document), [("id", name.encode())]) for rule in rules)
        for name, document in DOCS.items()
    }


# ------------------------------------------------------------------------------- hand-written expectations

EXPECT = [
    # plain and nested paths; whole-value regex
    (jp("$.user.country", "PL|DE"), {"user", "unicode", "trailing"}),
    (jp("$.user.country", "P"), set()),
    (jp("$.user.name", "Ali.*"), {"user"}),
    (jp("$.user.note", "PL"), set()),  # "PL\n": `$` would accept it, the whole-value anchor does not
    (jp("$.user.note", "PL\\n"), {"user"}),
    (jp("$.user.note", "PL\\s"), {"user"}),
    # numbers, booleans, nested values as text
    (jp("$.user.age", "42"), {"user"}),
    (jp("$.user.score", "1\\.5"), {"user"}),
    (jp("$.user.big", "100\\.0"), {"user"}),
    (jp("$.user.tiny", "1\\.0E-5"), {"user"}),
    (jp("$.user.vip", "true"), {"user"}),
    (jp("$.user.meta", '\\{"b":1,"c":\\[1,"x",null\\]\\}'), {"user"}),
    (jp("$.user.tags", '\\["a","b"\\]'), {"user"}),
    (jp("$.user.nothing", ".*"), set()),
    (jp("$.user.missing", ".*"), set()),
    # index
    (jp("$.user.tags[1]", "b"), {"user"}),
    (jp("$.user.tags[2]", ".*"), set()),
    (jp("$.user.addresses[0].country", "GB"),
     {"arr2", "arr1", "arr_gb", "arr_missing_member", "arr_null_member", "arr_null_element", "arr_mixed"}),
    (jp("$.deep_index", ".*"), set()),
    (jp("$.a[2].b[0]", "z"), {"deep_index"}),
    (jp("$.items[0]", ".*"), {"items_gb", "items_one", "items_null", "items_values", "items_nested_one"}),
    (jp("$.items[1]", "null"), {"null_by_index"}),  # the string "null"; a JSON null never matches
    (jp("$.items[2][0]", ".*"), set()),
    (jp("$.a[*].b[0]", "null|x|z", "any"), {"deep_index"}),
    (jp("$.a[*].b[1]", "null", "any"), {"deep_index"}),
    (jp("$.a[*].b[1]", "y|null"), {"deep_index"}),
    # [*] over arrays: all / any, single element (get_json_object pitfall), empty, missing, nulls, mixed
    (jp("$.user.addresses[*].country", "GB"),
     {"arr1", "arr_gb", "arr_missing_member", "arr_null_element", "obj_gb", "obj_single"}),
    (jp("$.user.addresses[*].country", "GB", "any"),
     {"arr2", "arr1", "arr_gb", "arr_missing_member", "arr_null_member", "arr_null_first", "arr_null_element",
      "arr_mixed", "obj", "obj_gb", "obj_single"}),
    (jp("$.user.addresses[*].country", "PL"), set()),
    (jp("$.user.addresses[*].country", "PL", "any"), {"arr2", "obj"}),
    (jp("$.user.addresses[*].city", "Leeds"), {"arr1"}),
    # .* is the same selector
    (jp("$.user.addresses.*.country", "GB"),
     {"arr1", "arr_gb", "arr_missing_member", "arr_null_element", "obj_gb", "obj_single"}),
    (jp("$.user.addresses.*.country", "GB", "ANY"),
     {"arr2", "arr1", "arr_gb", "arr_missing_member", "arr_null_member", "arr_null_first", "arr_null_element",
      "arr_mixed", "obj", "obj_gb", "obj_single"}),
    (jp("$.user.addresses[*].country", '\\{"code":"GB"\\}', "any"), {"arr_mixed"}),
    # Hermes' own example
    (jp("$.addresses.*.country", "PL"), {"hermes", "hermes_obj"}),
    (jp("$.addresses.*.country", "PL", "any"), {"hermes", "hermes_mixed", "hermes_obj"}),
    (jp("$.addresses[*].country", "PL|DE"), {"hermes", "hermes_mixed", "hermes_obj"}),
    # wildcard over scalars and over whole elements
    (jp("$.items[*]", "GB"), {"items_gb", "items_one"}),
    (jp("$.items.*", "GB", "any"), {"items_gb", "items_one", "items_null"}),
    (jp("$.items[*]", ".*"), {"items_gb", "items_one", "items_values", "items_nested_one"}),
    (jp("$.items[*]", '1|2\\.5|100\\.0|true|\\{"x":1\\}|\\[1,2\\]'), {"items_values"}),
    (jp("$.items[*]", '2\\.5|100\\.0|true|\\{"x":1\\}|\\[1,2\\]'), set()),
    (jp("$.items[*]", '1|2\\.5|100\\.0|true|\\{"x":1\\}|\\[1,2\\]', "any"), {"items_values"}),
    (jp("$.items[*]", '\\["GB","PL"\\]'), {"items_nested_one"}),
    (jp("$.items[*][*]", "GB|PL"), {"items_nested_one"}),
    (jp("$.user.addresses[*]", ".*"),
     {"arr2", "arr1", "arr_gb", "arr_missing_member", "arr_null_member", "arr_null_first", "arr_mixed", "obj",
      "obj_gb", "obj_single"}),
    # nested wildcards flatten
    (jp("$.orders[*].lines[*].sku", "A[0-9]"), {"nested"}),
    (jp("$.orders.*.lines.*.sku", "[AB]1"), {"nested_mixed"}),
    (jp("$.orders[*].lines[*].sku", "A3", "any"), {"nested"}),
    (jp("$.orders[*].lines[*].sku", ".*", "any"), {"nested", "nested_mixed"}),
    (jp("$.orders[*].lines[*]", ".*", "any"), {"nested", "nested_mixed"}),
    # root wildcards and odd names
    (jp("$[*].country", "GB"), {"root_array"}),
    (jp("$.*", "GB"), {"root_object_values"}),
    (jp("$['odd keys']['a.b']", "dot"), {"odd_keys"}),
    (jp("$['odd keys'][\"it's\"]", "quote"), {"odd_keys"}),
    (jp("$['odd keys']['x y']", "space"), {"odd_keys"}),
    (jp("$['odd keys']['']", "empty"), {"odd_keys"}),  # Spark cannot spell it: Python fallback
    (jp("$.Case", "upper"), {"odd_keys"}),
    (jp("$.case", "lower"), {"odd_keys"}),
    (jp("$.user.name", "Zoë ✓ \\x01"), {"unicode"}),
    # invalid JSON and null values never match, even with `.*`
    (jp("$", ".*"), set(DOCS) - {"invalid", "not_json", "empty", "null_value"}),
]


@pytest.fixture(scope="module")
def expectations(frame):
    return run(frame, {i: [rule] for i, (rule, _) in enumerate(EXPECT)})


@pytest.mark.parametrize("index", range(len(EXPECT)), ids=[f"{r.path}~{r.matcher}~{r.strategy}" for r, _ in EXPECT])
def test_expected_matches(expectations, index):
    rule, expected = EXPECT[index]
    got = {name for name, matched in expectations[index].items() if matched}
    assert got == expected
    # the pure-Python reference agrees with the hand-written answer too
    assert {name for name, matched in python_results([rule]).items() if matched} == expected


def test_and_of_several_filters_and_headers(frame):
    results = run(frame, {
        "none": [],
        "two_paths": [jp("$.user.country", "PL"), jp("$.user.age", "4[0-9]")],
        "shared_conflict": [jp("$.user", ".*country.*"), jp("$.user.country", "PL"), jp("$.user.name", "A.*")],
        "case_siblings": [jp("$.Case", "upper"), jp("$.case", "lower")],
        "odd_shared": [jp("$['odd keys']['a.b']", "dot"), jp("$['odd keys']['we`ird']", "tick"),
                       jp("$['odd keys'][\"it's\"]", "quote"), jp("$[\"li`st's\"][*]['x.y']", "v")],
        "path_and_header": [jp("$.user.country", "PL"), header("id", "user|trailing")],
        "wildcard_and_path": [jp("$.user.addresses[*].country", "GB", "any"), jp("$.user.addresses[0].city", "L.*")],
        "contradiction": [jp("$.user.country", "PL"), jp("$.user.country", "DE")],
    })
    passed = {key: {name for name, ok in values.items() if ok} for key, values in results.items()}
    assert passed["none"] == set(DOCS)
    assert passed["two_paths"] == {"user"}
    assert passed["shared_conflict"] == {"user"}
    assert passed["case_siblings"] == {"odd_keys"}
    assert passed["odd_shared"] == {"odd_keys"}
    assert passed["path_and_header"] == {"user", "trailing"}
    assert passed["wildcard_and_path"] == {"arr2", "arr1"}
    assert passed["contradiction"] == set()


def test_header_filters(spark):
    rows = [
        ("one", b"{}", [("Version", b"v2")]),
        ("other_case", b"{}", [("version", b"v2")]),
        ("missing", b"{}", [("Other", b"v2")]),
        ("no_headers", b"{}", []),
        ("null_headers", b"{}", None),
        ("null_value", b"{}", [("Version", None)]),
        ("repeated_ok", b"{}", [("Version", b"v1"), ("Version", b"v3")]),
        ("repeated_mixed", b"{}", [("Version", b"beta"), ("Version", b"v3")]),
        ("newline", b"{}", [("Version", b"v2\n")]),
        ("utf8", None, [("Version", "v\u00e9".encode())]),
    ]
    frame = spark.createDataFrame(rows, SCHEMA)
    rules = {
        "all": [header("Version", "v[0-9]")],
        "any": [header("Version", "v[0-9]", "any")],
        "utf8": [header("Version", "vé")],
    }
    columns = [filter_column(rules[key]).alias(key) for key in rules]
    got = {key: set() for key in rules}
    for row in frame.select("id", *columns).collect():
        for key in rules:
            assert row[key] is not None
            if row[key]:
                got[key].add(row["id"])
    assert got["all"] == {"one", "repeated_ok"}
    assert got["any"] == {"one", "repeated_ok", "repeated_mixed"}
    assert got["utf8"] == {"utf8"}
    for key, rule_list in rules.items():  # the Python reference agrees
        assert {r[0] for r in rows if all(evaluate_rule(rule, r[1], r[2]) for rule in rule_list)} == got[key]


def test_filter_column_in_filter_and_on_a_string_column(frame):
    rules = [jp("$.user.addresses[*].country", "GB", "any"), header("id", "arr.*")]
    by_name = frame.filter(filter_column(rules)).select("id").collect()
    string_value = frame.select("id", F.col("value").cast("string").alias("text"), F.col("headers").alias("h.k")) \
        .filter(filter_column(rules, "text", "`h.k`")).select("id").collect()
    expected = {"arr2", "arr1", "arr_gb", "arr_missing_member", "arr_null_member", "arr_null_first",
                "arr_null_element", "arr_mixed"}
    assert {r.id for r in by_name} == {r.id for r in string_value} == expected
    with pytest.raises(TypeError, match="column names"):
        filter_column(rules, F.col("value"))


# ------------------------------------------------------------------------------- Python fallback

FALLBACK_PAIRS = [
    # (fallback rule, native rule with the same answers on DOCS)
    (jp("$..country", "GB"), None),
    (jp("$.user.addresses[?(@.country)].country", "GB"), jp("$.user.addresses[*].country", "GB")),
    (jp("$.user.addresses[?(@.country == 'GB')].city", "L.*", "any"), jp("$.user.addresses[*].city", "L.*", "any")),
    (jp("$.items[0:1]", "GB"), jp("$.items[0]", "GB")),
    (jp("$.user.tags[-1]", "b"), jp("$.user.tags[1]", "b")),
    (jp("$['odd keys']['']", "empty"), None),
]


def test_fallback_paths_match_native_ones(frame):
    rules = {}
    for i, (fallback, native) in enumerate(FALLBACK_PAIRS):
        rules[f"f{i}"] = [fallback]
        if native is not None:
            rules[f"n{i}"] = [native]
    results = run(frame, rules)
    for i, (fallback, native) in enumerate(FALLBACK_PAIRS):
        assert results[f"f{i}"] == python_results([fallback]), fallback
        if native is not None:
            assert results[f"f{i}"] == results[f"n{i}"], (fallback, native)
    passed = {name for name, ok in results["f0"].items() if ok}
    assert passed == {"arr1", "arr_gb", "arr_missing_member", "arr_null_element", "obj_gb", "obj_single",
                      "root_array"}


# ------------------------------------------------------------------------------- cross-check

CROSS_PATHS = [
    "$", "$.user.country", "$.user.name", "$.user.age", "$.user.score", "$.user.tiny", "$.user.meta",
    "$.user.meta.c", "$.user.meta.c[2]", "$.user.nothing", "$.user.tags[0]", "$.user.addresses",
    "$.user.addresses[*].country", "$.user.addresses.*.country", "$.user.addresses[1].country",
    "$.user.addresses[*]", "$.user.addresses[*].*", "$.addresses.*.country", "$.items[*]", "$.items.*",
    "$.items[*][*]", "$.items[0][1]", "$.items[1]", "$.items[*][0]", "$.orders[*].lines[*].sku",
    "$.orders.*.lines.*.sku", "$.orders[*].lines",
    "$[*].country", "$[1].country", "$.*", "$.*.*", "$['odd keys'].*", "$.a[*].b[*]", "$.a[*].b[0]",
]
CROSS_MATCHERS = [".*", "GB|PL|A[0-9]|x|y|z|null", "[^\\n]*[0-9][^\\n]*", "\\{.*\\}|\\[.*\\]"]


def test_compiled_rules_agree_with_the_python_evaluator(frame):
    rules = {
        (path, matcher, strategy): [jp(path, matcher, strategy)]
        for path in CROSS_PATHS for matcher in CROSS_MATCHERS for strategy in ("all", "any")
    }
    spark_results = run(frame, rules)
    mismatches = [
        (key, name, matched)
        for key, results in spark_results.items()
        for name, matched in results.items()
        if matched != python_results(rules[key])[name]
    ]
    assert mismatches == []
    # the check is not vacuous: plenty of both answers
    answers = [matched for results in spark_results.values() for matched in results.values()]
    assert sum(answers) > 200 and len(answers) - sum(answers) > 200


@pytest.mark.xfail(strict=True, reason="documented deviation: after a wildcard the native compiler reads a string "
                                       "that holds JSON text as JSON (Jayway would not descend into a string)")
def test_json_text_inside_a_string_is_not_navigated(spark):
    frame = spark.createDataFrame([("s", b'{"a": "[{\\"c\\": \\"GB\\"}]"}', [])], SCHEMA)
    rule = jp("$.a[*].c", "GB")
    assert evaluate_rule(rule, b'{"a": "[{\\"c\\": \\"GB\\"}]"}') is False
    assert frame.select(filter_column([rule])).first()[0] is False
