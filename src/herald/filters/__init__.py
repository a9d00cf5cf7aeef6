"""Hermes message filters (jsonpath, avropath, header) compiled to Spark Column expressions.

Semantics follow Hermes' JsonPathPredicate / AvroPathPredicate / HeaderPredicate (Jayway JsonPath underneath the
first):

- `matcher` is a Java regex that must match the WHOLE value (`Matcher.matches()`); in Spark it is anchored as
  `^(?:m)\\z` (not `$`, which would accept a trailing newline)
- `matchingStrategy` all: every selected value matches; any: at least one; an empty selection never matches;
  missing paths, invalid JSON and null message values never match
- `[*]` and `.*` select every element of an array or every value of an object (Jayway), nested ones flatten
- selected values compare as text: strings unquoted, numbers/booleans as their JSON text (decimals as Java
  doubles, as Hermes' json-smart gives them), nested objects/arrays as compact JSON; a JSON null never matches
- avropath filters (Hermes' own path syntax, `.user.addresses[*].city`; see herald.filters.avropath) run on the
  JSON text Herald decodes an Avro record into once (herald.avro.convert.to_json): a missing field, a null or an
  index out of range at the END of the path compares as the string "null"; a missing field or null part-way,
  or `name[..]` on something that is not an array, selects nothing; values compare as text (strings raw, enums
  by symbol, numbers as Spark renders them, nested records/maps/arrays as compact JSON)
- header filters: the Kafka header with exactly that (case-sensitive) name, value decoded as UTF-8; a missing
  header never matches; a repeated header is matched with matchingStrategy over its values
- rules are AND-ed in declaration order; no rules means every message passes

Documented differences from Hermes (see the module docs of jsonpath_sql.py and python_eval.py):
- a nested object compares as compact JSON (`{"a":1}`), where Hermes gives Java's map text (`{a=1}`)
- with `any`, a JSON null before a matching value still lets the message pass (Hermes hits an NPE and filters it)
- Hermes' MatchingStrategy falls back to ALL on an unknown value; Herald rejects it at validation
- a header filter uses matchingStrategy over repeated headers (Hermes looks at the first one only)
- after a wildcard, a *string* element whose text is itself a JSON array/object is navigated as JSON by the
  native compiler (Jayway would not descend into a string); plain paths are exact
- avropath, value text: a nested record/array/map compares as compact JSON (`{"a":1,"b":"x"}`, `[1,2]`), where
  Hermes prints Avro's toString (`{"a": 1, "b": "x"}`, `[1, 2]`, a map as `{k=v}`); bytes and fixed compare as
  ISO-8859-1 text (Hermes: `java.nio.HeapByteBuffer[...]` / `[1, 2]`), decimals as plain decimal text; an Avro
  `float` compares as the double fastavro decodes (`1.100000023841858`, Hermes: `1.1`); NaN and infinities
  compare as "null" (JSON cannot hold them; Hermes: `NaN`)
- avropath, maps: a map is navigated like a record (both are JSON objects), so `m.k[0]` selects element 0 of
  the array under key `k`, where Hermes looks up the key "k[0]" literally
- avropath, `__metadata`: the top-level envelope is dropped by the Avro-to-JSON conversion, so a path into it
  compares as "null" at the end and selects nothing part-way (Hermes sees it)
- avropath syntax Hermes accepts although it cannot name an Avro field or array element is rejected at
  validation: empty segments, a segment starting with '[' (`a.[1]`, a field literally named "[1]" in Hermes),
  more than one selector or a bad one (`a[1][2]`, `a[x]`, `a[-1]`)
"""

from __future__ import annotations

from collections.abc import Sequence

from herald.filters.avropath import parse_segments
from herald.filters.jsonpath import JsonPath, parse_jsonpath, spark_expressible
from herald.filters.python_eval import evaluate, evaluate_rule
from herald.filters.regex import check_matcher, python_pattern
from herald.filters.rules import FilterError, FilterRule, validate_basics

__all__ = [
    "FilterError",
    "FilterRule",
    "check_rule",
    "filter_column",
    "parse_jsonpath",
    "parse_segments",
    "JsonPath",
    "evaluate",
    "evaluate_rule",
]


def check_rule(rule: FilterRule) -> list[str]:
    """Validate one rule without Spark. Raise FilterError when it is invalid or unsupported; return notes
    worth printing (e.g. that the path is evaluated in Python, which is slower)."""
    validate_basics(rule)
    java_only = check_matcher(rule.matcher)
    notes: list[str] = []
    if rule.type == "avropath":
        parse_segments(rule.path)  # raises FilterError for bad syntax; always compiled natively
        return notes
    if rule.type != "jsonpath":
        return notes
    path = parse_jsonpath(rule.path)
    if path.steps is None:
        reason = path.reason
    elif not spark_expressible(path.steps):
        reason = "a member name Spark's get_json_object cannot spell (empty, or with both a quote and '.' or '[')"
    else:
        return notes
    if java_only:
        python_pattern(rule.matcher)  # raises: Python cannot evaluate the Java-only syntax
    notes.append(
        f"path {rule.path!r}: {reason}; evaluated in Python (pandas UDF with jsonpath-ng): slower than "
        "compiled filters"
    )
    return notes


def filter_column(rules: Sequence[FilterRule], value_col="value", headers_col="headers"):
    """A boolean Spark Column, never null: True when the message passes every rule (AND, in order).

    `value_col` names Kafka's binary value column or a string column (cast to string here, a no-op for a string):
    JSON text either way; for an Avro topic, the JSON text Herald decodes each record into (avropath rules read
    it). Content types are not checked here (the config loader does): a jsonpath rule on Avro JSON text, or an
    avropath rule on a JSON topic, simply evaluates over the text. `headers_col` names an
    array<struct<key:string,value:binary>> column. Column names, not Column objects: the native rules become one
    SQL expression. Raises FilterError for an invalid rule. True when `rules` is
    empty. Native rules run in the JVM; paths Spark cannot express run in a pandas UDF (see check_rule notes).
    For the subscriptions of one topic, herald.filters.targets.with_targets evaluates all their filters in one
    projection, parsing each message once.
    """
    from herald.filters.compile import compile_rules

    rules = list(rules or [])
    for rule in rules:
        check_rule(rule)
    return compile_rules(rules, value_col, headers_col)
