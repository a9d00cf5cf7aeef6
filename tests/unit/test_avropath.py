"""avropath filters without Spark: parsing and validation, Hermes' AvroPathPredicate semantics in the Python
reference evaluator (over decoded records and over their JSON text), and the generated SQL's shape."""

from __future__ import annotations

import json
import pickle
import re
from decimal import Decimal

import pytest

from herald.avro.convert import to_json
from herald.filters import FilterError, FilterRule, check_rule, evaluate, evaluate_rule
from herald.filters.avropath import Segment, parse_segments, render, select, select_texts


def ap(path, matcher, strategy="all"):
    return FilterRule("avropath", matcher, path=path, matching_strategy=strategy)


# ------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    "path, segments",
    [
        (".user.name", (Segment("user"), Segment("name"))),
        ("user.name", (Segment("user"), Segment("name"))),
        ("..user.name..", (Segment("user"), Segment("name"))),  # Hermes strips dots at both ends
        (".user.addresses[1].city", (Segment("user"), Segment("addresses", 1), Segment("city"))),
        (".user.addresses[*].city", (Segment("user"), Segment("addresses", "*"), Segment("city"))),
        ("a[007]", (Segment("a", 7),)),
        ("a[*].b[0].c[*]", (Segment("a", "*"), Segment("b", 0), Segment("c", "*"))),
        ("odd key.x-y", (Segment("odd key"), Segment("x-y"))),  # map keys: anything but '.', '[' and ']'
        ("a[2147483647]", (Segment("a", 2**31 - 1),)),
    ],
)
def test_paths_parse_to_segments(path, segments):
    assert parse_segments(path) == segments
    assert parse_segments(render(segments)) == segments


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("", "needs a non-empty 'path'"),
        ("...", "needs a non-empty 'path'"),
        (None, "needs a non-empty 'path'"),
        ("a..b", "empty segment"),
        ("[1]", "segment '[1]' has no field name"),
        ("a.[1]", "segment '[1]' has no field name"),
        ("a.[*].b", "segment '[*]' has no field name"),
        ("a[-1]", "negative index"),
        ("a[x]", "bad array selector in 'a[x]'"),
        ("a[]", "bad array selector"),
        ("a[1][2]", "bad array selector"),
        ("a[1", "bad array selector"),
        ("a]", "bad array selector"),
        ("a[1]b", "bad array selector"),
        ("a[١]", "bad array selector"),  # digits are ASCII, as in Java's \d
        ("a[2147483648]", "larger than 2147483647"),
    ],
)
def test_bad_paths_are_rejected_when_the_config_loads(path, fragment):
    with pytest.raises(FilterError, match=re.escape(fragment)):
        check_rule(ap(path, ".*"))


def test_the_bare_index_error_says_why():
    with pytest.raises(FilterError) as error:
        check_rule(ap(".user.addresses.[1].city", "x"))
    message = str(error.value)
    assert "'.user.addresses.[1].city'" in message and "addresses[1]" in message
    assert "literally named '[1]'" in message and '"null"' in message


def test_check_rule_accepts_avropath_and_checks_the_rest():
    assert check_rule(ap(".user.addresses[*].city", "London|Paris", "ANY")) == []
    assert check_rule(ap(".name", "\\p{L}+")) == []  # Java-only regex: fine, avropath always runs in Spark
    with pytest.raises(FilterError, match="not a valid regular expression"):
        check_rule(ap(".a", "("))
    with pytest.raises(FilterError, match="matchingStrategy 'some'"):
        check_rule(ap(".a", "x", "some"))
    with pytest.raises(FilterError, match="unknown filter type 'xpath' \\(supported: jsonpath, avropath, header\\)"):
        check_rule(FilterRule("xpath", "x", path="a"))
    rule = ap(".a[*]", "x", "Any")
    assert pickle.loads(pickle.dumps(rule)) == rule


# ------------------------------------------------------------------------------------------ selection

RECORD = {
    "__metadata": {"trace": "t-1"},
    "user": {
        "name": "Alice",
        "nickname": None,
        "age": 42,
        "score": 1e-05,
        "ratio": 1.100000023841858,  # an Avro float 1.1, as fastavro decodes it
        "vip": True,
        "status": "ACTIVE",  # an enum: fastavro gives the symbol
        "avatar": b"\x00\xffab",
        "price": Decimal("12.30"),
        "nan": float("nan"),
        "tags": ["a", "b"],
        "scores": [None, 2.5, 100.0],
        "empty": [],
        "matrix": [[1, 2], [3]],
        "addresses": [
            {"street": "Baker St", "city": "London", "geo": {"lat": 51.5, "lon": -0.12}},
            {"street": "Marszalkowska", "city": "Warsaw", "geo": None},
            None,
            {"street": "Nowhere", "city": None, "geo": None},
        ],
        "attributes": {"color": "blue", "list": ["x"]},
    },
}


@pytest.mark.parametrize(
    "path, texts",
    [
        # Hermes' examples
        (".user.name", ["Alice"]),
        (".user.addresses[1].city", ["Warsaw"]),
        (".user.addresses[*].city", ["London", "Warsaw", "null"]),  # the null element is skipped part-way
        # the end of the path: missing, null, out of range -> "null"
        (".user.missing", ["null"]),
        (".missing", ["null"]),
        (".user.nickname", ["null"]),
        (".user.tags[5]", ["null"]),
        (".user.addresses[2]", ["null"]),
        (".user.scores[*]", ["null", "2.5", "100.0"]),
        (".user.addresses[*].geo", ['{"lat":51.5,"lon":-0.12}', "null", "null"]),
        # part-way: missing, null, scalar, array, out of range -> nothing
        (".user.missing.deeper", []),
        (".missing.deeper", []),
        (".user.nickname.deeper", []),
        (".user.name.deeper", []),
        (".user.tags.deeper", []),
        (".user.tags[0].deeper", []),
        (".user.addresses[2].city", []),
        (".user.addresses[9].city", []),
        (".user.addresses[*].geo.lat", ["51.5"]),
        (".user.matrix[*].x", []),
        # [..] on something that is not an array -> nothing, even at the end
        (".user.name[0]", []),
        (".user.missing[0]", []),
        (".user.nickname[*]", []),
        (".user.attributes[*]", []),
        # empty arrays
        (".user.empty[*]", []),
        (".user.empty[0]", ["null"]),
        # maps are navigated like records
        (".user.attributes.color", ["blue"]),
        (".user.attributes.nope", ["null"]),
        (".user.attributes.list[0]", ["x"]),
        # value texts
        (".user.age", ["42"]),
        (".user.score", ["1.0E-5"]),
        (".user.ratio", ["1.100000023841858"]),
        (".user.vip", ["true"]),
        (".user.status", ["ACTIVE"]),
        (".user.avatar", ["\x00\xffab"]),
        (".user.price", ["12.30"]),
        (".user.nan", ["null"]),
        (".user.tags", ['["a","b"]']),
        (".user.matrix[*]", ["[1,2]", "[3]"]),
        (".user.attributes", ['{"color":"blue","list":["x"]}']),
        # the top-level __metadata is not part of the JSON the filters see
        (".__metadata", ["null"]),
        (".__metadata.trace", []),
    ],
)
def test_select_texts_over_a_decoded_record_and_its_json(path, texts):
    segments = parse_segments(path)
    assert select_texts(segments, RECORD) == texts
    document = to_json(RECORD)
    assert select_texts(segments, document) == texts
    assert select_texts(segments, document.encode()) == texts


def test_select_returns_raw_values_and_none_for_null():
    segments = parse_segments(".user.addresses[*].city")
    assert select(segments, RECORD) == ["London", "Warsaw", None]
    assert select(parse_segments(".user.addresses[0]"), RECORD) == [RECORD["user"]["addresses"][0]]
    assert select(parse_segments(".a"), ["not", "a", "record"]) == []


@pytest.mark.parametrize("value", [None, "", "not json", '{"a": ', b"\xff", "[1, 2]", 42])
def test_values_that_are_not_records_never_match(value):
    assert evaluate_rule(ap(".a", ".*"), value) is False
    assert evaluate_rule(ap(".a", "null"), value) is False


CASES = [
    # (path, matcher, strategy, expected)
    (".user.name", "Alice", "all", True),
    (".user.name", "Ali", "all", False),  # the whole value must match
    (".user.addresses[1].city", "Warsaw", "all", True),
    (".user.addresses[*].city", "London|Warsaw", "all", False),  # the last address has a null city
    (".user.addresses[*].city", "London|Warsaw|null", "all", True),
    (".user.addresses[*].city", "Warsaw", "any", True),
    (".user.addresses[*].city", "Paris", "any", False),
    (".user.missing", "null", "all", True),
    (".user.missing", "null", "any", True),
    (".user.missing.deeper", "null", "any", False),
    (".user.missing.deeper", ".*", "all", False),
    (".user.addresses[9].city", ".*", "any", False),
    (".user.tags[9]", "null", "all", True),
    (".user.empty[*]", ".*", "all", False),
    (".user.empty[*]", ".*", "any", False),
    (".user.scores[*]", "null", "any", True),
    (".user.scores[*]", "[0-9.]+", "all", False),
    (".user.scores[*]", "[0-9.]+", "any", True),
    (".user.status", "ACTIVE|INACTIVE", "all", True),
]


@pytest.mark.parametrize("path, matcher, strategy, expected", CASES)
def test_python_evaluator(path, matcher, strategy, expected):
    rule = ap(path, matcher, strategy)
    assert evaluate_rule(rule, RECORD) is expected
    assert evaluate_rule(rule, to_json(RECORD).encode()) is expected


def test_rules_are_anded_with_header_and_jsonpath_rules():
    web = FilterRule("header", "web", header="source")
    name = ap(".user.name", "Alice")
    london = ap(".user.addresses[*].city", "London", "any")
    assert evaluate([name, london, web], RECORD, [("source", b"web")]) is True
    assert evaluate([name, london, web], RECORD, [("source", b"app")]) is False
    assert evaluate([name, ap(".user.vip", "false")], RECORD) is False
    text = to_json(RECORD)
    assert evaluate([name, FilterRule("jsonpath", "Warsaw", path="$.user.addresses[1].city")], text) is True
    assert json.loads(text)["user"]["name"] == "Alice"


# ------------------------------------------------------------------------------------------ SQL generation


def test_generated_sql_shares_one_parse_and_keeps_headers_first():
    from herald.filters.compile import rules_sql

    rules = [
        ap(".user.addresses[*].city", "London", "any"),
        FilterRule("header", "web", header="source"),
        ap(".user.name", "Alice"),
        ap(".user.addresses[0].geo.lat", "5.*"),
    ]
    sql, python = rules_sql(rules, "`value`", "`headers`")
    assert python == []
    assert sql.split(") AND (")[0].count("`headers`") == 1  # the header rule comes first
    shared = ("'struct<`user`: struct<`addresses`: array<struct<`city`: string, `geo`: struct<`lat`: string>>>, "
              "`name`: string>>'")
    assert sql.count("from_json(cast(`value` as string), " + shared + ")") == 1
    # the fallback re-reads the first array of records as texts and kinds, for rows where it is null
    assert "'struct<`user`: struct<`addresses`: array<string>>>'" in sql
    assert "'struct<`user`: struct<`addresses`: array<variant>>>'" in sql


def test_conflicting_shapes_get_their_own_parse():
    from herald.filters.compile import rules_sql

    sql, _ = rules_sql([ap(".a", "x"), ap(".a.b", "y"), ap(".A", "z"), ap(".a[0]", "w")], "`v`", "`h`")
    for ddl in ["'struct<`a`: string>'", "'struct<`a`: struct<`b`: string>>'", "'struct<`A`: string>'",
                "'struct<`a`: array<string>>'"]:
        assert sql.count(f"from_json(cast(`v` as string), {ddl})") == 1, ddl
    plain, _ = rules_sql([ap(".user.name", "x")], "`v`", "`h`")
    assert "variant" not in plain and "zip_with" not in plain  # no array of records: no fallback
