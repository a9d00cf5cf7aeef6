"""Filters without Spark: path parsing to the IR, validation errors, regex translation, the Python evaluator."""

from __future__ import annotations

import json
import pickle
import re

import pytest

from herald.filters import FilterError, FilterRule, check_rule, evaluate, evaluate_rule
from herald.filters.jsonpath import (
    Field,
    Index,
    Wildcard,
    normalise,
    parse_jsonpath,
    render,
    spark_expressible,
    spark_path,
)
from herald.filters.python_eval import select
from herald.filters.regex import check_matcher, literal, python_pattern, spark_pattern, translate
from herald.filters.values import INVALID, java_double, json_text, parse_json, value_text


def jp(path, matcher, strategy="all"):
    return FilterRule("jsonpath", matcher, path=path, matching_strategy=strategy)


# ------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    "path, steps",
    [
        ("$", ()),
        ("$.user", (Field("user"),)),
        ("$.user.address.country", (Field("user"), Field("address"), Field("country"))),
        ("$['user']['country']", (Field("user"), Field("country"))),
        ('$["user"]["country"]', (Field("user"), Field("country"))),
        ("$['a.b']['x y']", (Field("a.b"), Field("x y"))),
        ("$['it\\'s']", (Field("it's"),)),
        ('$["say \\"hi\\""]', (Field('say "hi"'),)),
        ("$.items[0]", (Field("items"), Index(0))),
        ("$.items[12].sku", (Field("items"), Index(12), Field("sku"))),
        ("$.items[*].sku", (Field("items"), Wildcard(), Field("sku"))),
        ("$.addresses.*.country", (Field("addresses"), Wildcard(), Field("country"))),
        ("$.*", (Wildcard(),)),
        ("$[*]", (Wildcard(),)),
        ("$[0][1]", (Index(0), Index(1))),
        ("$.a[*][*].b.*", (Field("a"), Wildcard(), Wildcard(), Field("b"), Wildcard())),
        ("$.@timestamp", (Field("@timestamp"),)),
        ("$.über-name_1", (Field("über-name_1"),)),
        ("user.country", (Field("user"), Field("country"))),  # Jayway adds the root
        ("[0].a", (Index(0), Field("a"))),
        ("  $.a  ", (Field("a"),)),
    ],
)
def test_native_paths_parse_to_steps(path, steps):
    parsed = parse_jsonpath(path)
    assert parsed.steps == steps
    assert parsed.reason is None
    assert parsed.definite == (not any(isinstance(step, Wildcard) for step in steps))


def test_normalise_adds_root():
    assert normalise("a.b") == "$.a.b"
    assert normalise("[1]") == "$[1]"
    assert normalise(".a") == "$.a"
    assert normalise("$.a") == "$.a"


@pytest.mark.parametrize(
    "path, reason",
    [
        ("$..name", "recursive descent '..'"),
        ("$.a..b", "recursive descent '..'"),
        ("$.items[?(@.price > 10)].sku", "filter expressions"),
        ("$.items[0:2]", "slices"),
        ("$.items[-1]", "negative indexes"),
        ("$['a','b']", "unions"),
        ("$.items[0,1]", "unions"),
    ],
)
def test_paths_outside_the_subset_fall_back_to_python(path, reason):
    parsed = parse_jsonpath(path)
    assert parsed.steps is None
    assert reason in parsed.reason
    notes = check_rule(jp(path, ".*"))
    assert len(notes) == 1
    assert "evaluated in Python" in notes[0] and "slower" in notes[0] and reason in notes[0]


@pytest.mark.parametrize("path", ["$.a b", "$[", "$.a.length()", "$['unterminated", "$.a[?(", "$$"])
def test_unparseable_paths_raise_naming_the_path(path):
    with pytest.raises(FilterError) as error:
        check_rule(jp(path, ".*"))
    message = str(error.value)
    assert repr(path) in message
    assert "Supported natively" in message and "[*]" in message


def test_render_round_trips():
    for path in ["$.a.b", "$['x.y'][3][*]", "$.*.c", "$['it\\'s']"]:
        steps = parse_jsonpath(path).steps
        assert parse_jsonpath(render(steps)).steps == steps


def test_spark_path_spelling():
    assert spark_path((Field("user"), Field("country"))) == "$.user.country"
    assert spark_path((Field("a.b"), Index(2))) == "$['a.b'][2]"
    assert spark_path((Field("it's"),)) == "$.it's"  # Spark's bracket form stops at the first quote
    assert spark_path((Field("x y"),)) == "$.x y"
    assert spark_path(()) == "$"
    assert spark_path((Field(""),)) is None
    assert spark_path((Field("it's.x"),)) is None  # neither form can spell it
    assert spark_path((Field("a"), Wildcard())) is None
    assert spark_expressible((Field("a"), Wildcard(), Field("b")))
    assert not spark_expressible((Field("a"), Wildcard(), Field("it's[0]")))


def test_names_spark_cannot_spell_are_evaluated_in_python():
    notes = check_rule(jp("$['it\\'s.odd']", "x"))
    assert "evaluated in Python" in notes[0]
    assert check_rule(jp("$['odd.key']", "x")) == []


# ------------------------------------------------------------------------------------------ rules


def test_check_rule_accepts_plain_rules_without_notes():
    assert check_rule(jp("$.user.country", "PL|DE")) == []
    assert check_rule(jp("$.a[*].b", "x", "ANY")) == []
    assert check_rule(FilterRule("header", "v1", header="Trace-Id")) == []


@pytest.mark.parametrize(
    "rule, fragment",
    [
        (jp("$.a", "("), "not a valid regular expression"),
        (jp("$.a", "[a-"), "not a valid regular expression"),
        (jp("$.a", "x", "some"), "matchingStrategy 'some'"),
        (jp("", "x"), "needs a non-empty 'path'"),
        (jp(None, "x"), "needs a non-empty 'path'"),
        (FilterRule("header", "x"), "needs 'header'"),
        (FilterRule("avropath", "x", path="a..b"), "empty segment"),
        (FilterRule("xpath", "x", path="a"), "unknown filter type 'xpath'"),
        (FilterRule("jsonpath", None, path="$.a"), "needs a 'matcher'"),
    ],
)
def test_check_rule_errors(rule, fragment):
    with pytest.raises(FilterError, match=re.escape(fragment)):
        check_rule(rule)


def test_filter_error_is_a_value_error_and_rules_pickle():
    assert issubclass(FilterError, ValueError)
    rule = jp("$.a[*]", "x", "Any")
    assert pickle.loads(pickle.dumps(rule)) == rule
    assert rule.strategy == "any"
    assert FilterRule("jsonpath", "x", path="$.a", matching_strategy=None).strategy == "all"


# ------------------------------------------------------------------------------------------ regex


def test_spark_pattern_anchors_the_whole_value():
    assert spark_pattern("PL|DE") == "^(?:PL|DE)\\z"


@pytest.mark.parametrize(
    "java, text, expected",
    [
        ("(?<cc>[A-Z]{2})-\\k<cc>", "PL-PL", True),
        ("(?<cc>[A-Z]{2})-\\k<cc>", "PL-DE", False),
        ("\\Qa.b*\\E", "a.b*", True),
        ("\\Qa.b*\\E", "axb", False),
        ("\\p{Alpha}+\\p{Digit}", "abc1", True),
        ("[\\p{Upper}\\d]+", "AB12", True),
        ("\\P{Digit}+", "ab", True),
        ("\\w+", "zoë", False),  # Java's \w is ASCII
        ("(?i)pl", "PL", True),
        ("a\\z", "a", True),
        ("[]a]+", "]a]", True),
        ("[^]a]", "b", True),
        ("x*+y", "xxy", True),
    ],
)
def test_java_regex_translation(java, text, expected):
    assert (python_pattern(java).fullmatch(text) is not None) is expected


@pytest.mark.parametrize(
    "matcher, text",
    [
        ("PL", "PL"),
        ("", ""),
        ("order\\.created", "order.created"),
        ("a-b c_d:e@f/g#h,i=j!k<l>&%~\"'", "a-b c_d:e@f/g#h,i=j!k<l>&%~\"'"),
        ("\\Qa.b*\\E!", "a.b*!"),
        ("\\Qopen", "open"),
        ("\\\\", "\\"),
        ("zoë ✓", "zoë ✓"),
        ("PL|DE", None),
        ("P.", None),
        ("a+", None),
        ("(?i)pl", None),
        ("x{2}", None),
        ("]", None),
        ("^PL$", None),
        ("\\d", None),
        ("\\n", None),
        ("\\1", None),
        ("\\é", None),
        ("trailing\\", None),
        ("\ufffd", None),  # rlike decodes invalid UTF-8 to U+FFFD: only the regex answers like rlike
    ],
)
def test_literal_matchers(matcher, text):
    assert literal(matcher) == text
    if text is not None:  # the literal is exactly what the whole-value regex matches
        assert python_pattern(matcher).fullmatch(text) is not None
        assert python_pattern(matcher).fullmatch(text + "x") is None


def test_literal_matchers_compile_without_regex_or_lambda():
    from herald.filters.sql import Names, matched, strategy_match

    assert matched("`v`", "order\\.paid") == "coalesce(`v` = 'order.paid', false)"
    assert strategy_match(Names(), "`v`", "GB", "any") == "coalesce(array_contains(`v`, 'GB'), false)"
    assert strategy_match(Names(), "`v`", "GB", "all") == "coalesce(array_distinct(`v`) = array('GB'), false)"
    assert "RLIKE" in strategy_match(Names(), "`v`", "G.", "all") and "RLIKE" in matched("`v`", "G.")


def test_java_only_regex_is_fine_natively_but_not_in_python():
    assert translate("\\p{L}+")[1] == ["\\p{L}"]
    assert check_matcher("\\p{L}+") == ["\\p{L}"]
    assert check_rule(jp("$.name", "\\p{L}+")) == []
    assert check_rule(jp("$.a[*].name", "[a-z&&[^e]]+")) == []
    with pytest.raises(FilterError, match="Java-only"):
        check_rule(jp("$..name", "\\p{L}+"))


# ------------------------------------------------------------------------------------------ evaluator


@pytest.mark.parametrize(
    "value, text",
    [
        (1.5, "1.5"),
        (100.0, "100.0"),
        (1e-5, "1.0E-5"),
        (0.001, "0.001"),
        (12345678.9, "1.23456789E7"),
        (9999999.0, "9999999.0"),
        (1e7, "1.0E7"),
        (1e300, "1.0E300"),
        (-0.0, "-0.0"),
        (0.0, "0.0"),
        (-2.5e-10, "-2.5E-10"),
        (3.141592653589793, "3.141592653589793"),
        (float("inf"), "Infinity"),
    ],
)
def test_java_double(value, text):
    assert java_double(value) == text


def test_value_text_renders_like_spark():
    document = parse_json('{"s": "x\\"y", "i": 12345678901234567890123, "f": 1.50, "e": 1E+2, "b": true, '
                          '"n": null, "o": {"k": [1, "v", null, {"z": 0.00001}]}, "c": "a\\u0001\\t\\u001f"}')
    texts = {key: value_text(value) for key, value in document.items()}
    assert texts == {
        "s": 'x"y',
        "i": "12345678901234567890123",
        "f": "1.5",
        "e": "100.0",
        "b": "true",
        "n": None,
        "o": '{"k":[1,"v",null,{"z":1.0E-5}]}',
        "c": "a\x01\t\x1f",
    }
    assert json_text(document["c"]) == '"a\\u0001\\t\\u001F"'


def test_parse_json_is_strict_but_ignores_trailing_text_like_spark():
    assert parse_json(b'  {"a": 1} trailing') == {"a": 1}
    assert parse_json('{"a": 1') is INVALID
    assert parse_json("hello") is INVALID
    assert parse_json("") is INVALID
    assert parse_json(None) is INVALID
    assert parse_json('{"a": NaN}') is INVALID
    assert parse_json(b"\xff\xfe") is INVALID


def test_select_follows_jayway():
    document = {
        "arr": [{"c": "GB"}, {"d": 1}, {"c": None}, None, "s", [{"c": "x"}]],
        "obj": {"k1": {"c": 1}, "k2": "s", "k3": {"c": {"deep": True}}},
        "nested": [[1, 2], {"a": 3}, 4],
    }
    steps = lambda path: parse_jsonpath(path).steps  # noqa: E731
    assert select(steps("$.arr[*].c"), document) == ["GB", None]  # missing skipped, JSON null kept
    assert select(steps("$.arr.*.c"), document) == ["GB", None]
    assert select(steps("$.obj.*.c"), document) == [1, {"deep": True}]
    assert select(steps("$.obj[*].c"), document) == [1, {"deep": True}]
    assert select(steps("$.nested[*][*]"), document) == [1, 2, 3]
    assert select(steps("$.arr[0].c"), document) == ["GB"]
    assert select(steps("$.arr[10].c"), document) == []
    assert select(steps("$.obj[0]"), document) == []
    assert select(steps("$.arr.c"), document) == []
    assert select(steps("$.missing[*]"), document) == []
    assert select(steps("$"), document) == [document]


CASES = [
    # (document, path, matcher, strategy, expected)
    ('{"user": {"country": "PL"}}', "$.user.country", "PL|DE", "all", True),
    ('{"user": {"country": "PLX"}}', "$.user.country", "PL|DE", "all", False),
    ('{"user": {"country": "PL\\n"}}', "$.user.country", "PL", "all", False),
    ('{"user": {"country": "PL\\n"}}', "$.user.country", "PL\\n", "all", True),
    ('{"user": {"country": null}}', "$.user.country", ".*", "all", False),
    ('{"user": {}}', "$.user.country", ".*", "all", False),
    ('{"a": [{"c": "GB"}, {"c": "PL"}]}', "$.a[*].c", "GB", "all", False),
    ('{"a": [{"c": "GB"}, {"c": "PL"}]}', "$.a[*].c", "GB", "any", True),
    ('{"a": [{"c": "GB"}]}', "$.a[*].c", "GB", "all", True),
    ('{"a": [{"c": "GB"}, {}]}', "$.a[*].c", "GB", "all", True),
    ('{"a": [{"c": "GB"}, {"c": null}]}', "$.a[*].c", "GB", "all", False),
    ('{"a": [{"c": null}, {"c": "GB"}]}', "$.a[*].c", "GB", "any", True),
    ('{"a": []}', "$.a[*]", ".*", "all", False),
    ('{"a": []}', "$.a[*]", ".*", "any", False),
    ('{"a": {"x": {"c": "GB"}, "y": {"c": "GB"}}}', "$.a.*.c", "GB", "all", True),
    ('{"addresses": [{"country": "PL"}, {"country": "PL"}]}', "$.addresses.*.country", "PL", "all", True),
    ('{"n": 1.50}', "$.n", "1\\.5", "all", True),
    ('{"n": 1e2}', "$.n", "100\\.0", "all", True),
    ('{"n": 42}', "$.n", "42", "all", True),
    ('{"b": false}', "$.b", "false", "all", True),
    ('{"o": {"a": 1, "b": [true]}}', "$.o", '\\{"a":1,"b":\\[true\\]\\}', "all", True),
    ("not json", "$.a", ".*", "any", False),
    ('{"a": ', "$.a", ".*", "any", False),
    ('{"a": [{"name": "x"}, {"b": {"name": "y"}}]}', "$..name", "x|y", "all", True),
    ('{"a": [{"name": "x"}, {"b": {"name": "z"}}]}', "$..name", "x|y", "all", False),
    ('{"a": [{"p": 5, "s": "A"}, {"p": 1, "s": "B"}]}', "$.a[?(@.p > 2)].s", "A", "all", True),
    ('{"a": [1, 2, 3]}', "$.a[-1]", "3", "all", True),
]


@pytest.mark.parametrize("document, path, matcher, strategy, expected", CASES)
def test_python_evaluator(document, path, matcher, strategy, expected):
    assert evaluate_rule(jp(path, matcher, strategy), document.encode()) is expected


def test_null_values_and_missing_documents_never_match():
    assert evaluate_rule(jp("$", ".*"), None) is False
    assert evaluate_rule(jp("$.a", ".*", "any"), b"") is False


def test_header_rules():
    rule = FilterRule("header", "v[0-9]+", header="Version")
    assert evaluate_rule(rule, b"{}", [("Version", b"v2")]) is True
    assert evaluate_rule(rule, b"{}", [("version", b"v2")]) is False  # exact, case-sensitive name
    assert evaluate_rule(rule, b"{}", [("Version", b"v2 ")]) is False
    assert evaluate_rule(rule, b"{}", []) is False
    assert evaluate_rule(rule, b"{}", None) is False
    assert evaluate_rule(rule, b"{}", [("Version", None)]) is False
    repeated = [("Version", b"v1"), ("Version", b"beta")]
    assert evaluate_rule(rule, b"{}", repeated) is False
    assert evaluate_rule(FilterRule("header", "v[0-9]+", header="Version", matching_strategy="any"), b"{}", repeated)
    assert evaluate_rule(rule, b"{}", {"Version": "v3"}) is True
    assert evaluate_rule(rule, b"{}", [{"key": "Version", "value": b"v4"}]) is True


def test_rules_are_anded_and_no_rules_pass():
    document = json.dumps({"user": {"country": "PL", "tier": "gold"}}).encode()
    country = jp("$.user.country", "PL")
    tier = jp("$.user.tier", "gold|silver")
    header = FilterRule("header", "web", header="source")
    assert evaluate([], document) is True
    assert evaluate([country, tier], document) is True
    assert evaluate([country, jp("$.user.tier", "bronze")], document) is False
    assert evaluate([country, tier, header], document, [("source", b"web")]) is True
    assert evaluate([country, tier, header], document, [("source", b"app")]) is False


# ------------------------------------------------------------------------------------------ SQL generation


def test_generated_sql_shares_one_parse_and_puts_cheap_rules_first():
    from herald.filters.compile import rules_sql

    rules = [
        jp("$.user.addresses[*].country", "GB", "any"),
        jp("$.user.country", "PL"),
        jp("$..name", "x"),
        jp("$.user.name", "A.*"),
        FilterRule("header", "web", header="source"),
    ]
    sql, python = rules_sql(rules, "`value`", "`headers`")
    assert python == [rules[2]]
    conditions = sql.split(") AND (")
    assert "`headers`" in conditions[0]  # header rules first: no JSON parsing
    shared = "from_json(cast(`value` as string), 'struct<`user`: struct<`country`: string, `name`: string>>', " \
             "map('mode', 'PERMISSIVE'))"
    assert sql.count(shared) == 2 and sql.count("from_json(cast(`value`") == 3  # one text, for both rules
    assert "array<struct<`country`: string>>" in conditions[2]  # the wildcard rule's typed parse comes last


def test_generated_sql_for_single_and_conflicting_member_paths():
    from herald.filters.compile import rules_sql

    single, _ = rules_sql([jp("$.user.country", "PL|DE")], "`value`", "`headers`")
    assert single.startswith("(coalesce(get_json_object(cast(`value` as string), '$.user.country') RLIKE")
    plain, _ = rules_sql([jp("$.user.country", "P\\.L")], "`value`", "`headers`")  # a literal: no regex
    assert plain == "(coalesce(get_json_object(cast(`value` as string), '$.user.country') = 'P.L', false))"
    conflict, _ = rules_sql([jp("$.user", ".*"), jp("$.user.country", "PL")], "`value`", "`headers`")
    assert "from_json" not in conflict and conflict.count("get_json_object") == 2
    assert rules_sql([], "`value`", "`headers`") == ("true", [])


def test_sql_literals():
    from herald.filters.jsonpath_sql import typed_ddl
    from herald.filters.sql import column_ref, ident, lit

    assert lit("$.user.country") == "'$.user.country'"
    assert lit("it's") == "decode(X'69742773', 'UTF-8')"
    assert lit("a\\z") == "decode(X'615c7a', 'UTF-8')"
    assert ident("we`ird") == "`we``ird`"
    assert column_ref("value") == "`value`" and column_ref("a.b") == "`a`.`b`" and column_ref("`a.b`") == "`a.b`"
    assert typed_ddl(parse_jsonpath("$.a[*]['x y'][0]").steps) == "struct<`a`: array<struct<`x y`: array<string>>>>"
