"""Hermes message filters (jsonpath, header) compiled to Spark Column expressions.

Semantics follow Hermes' JsonPathPredicate / HeaderPredicate (Jayway JsonPath underneath):

- `matcher` is a Java regex that must match the WHOLE value (`Matcher.matches()`); in Spark it is anchored as
  `^(?:m)\\z` (not `$`, which would accept a trailing newline)
- `matchingStrategy` all: every selected value matches; any: at least one; an empty selection never matches;
  missing paths, invalid JSON and null message values never match
- `[*]` and `.*` select every element of an array or every value of an object (Jayway), nested ones flatten
- selected values compare as text: strings unquoted, numbers/booleans as their JSON text (decimals as Java
  doubles, as Hermes' json-smart gives them), nested objects/arrays as compact JSON; a JSON null never matches
- header filters: the Kafka header with exactly that (case-sensitive) name, value decoded as UTF-8; a missing
  header never matches; a repeated header is matched with matchingStrategy over its values
- rules are AND-ed in declaration order; no rules means every message passes

Documented differences from Hermes (see the module docs of compile.py and python_eval.py):
- a nested object compares as compact JSON (`{"a":1}`), where Hermes gives Java's map text (`{a=1}`)
- with `any`, a JSON null before a matching value still lets the message pass (Hermes hits an NPE and filters it)
- Hermes' MatchingStrategy falls back to ALL on an unknown value; Herald rejects it at validation
- a header filter uses matchingStrategy over repeated headers (Hermes looks at the first one only)
- after a wildcard, a *string* element whose text is itself a JSON array/object is navigated as JSON by the
  native compiler (Jayway would not descend into a string); plain paths are exact
"""

from __future__ import annotations

from collections.abc import Sequence

from herald.filters.jsonpath import JsonPath, parse_avropath, parse_jsonpath
from herald.filters.regex import check_matcher, python_pattern
from herald.filters.rules import FilterError, FilterRule, validate_basics

__all__ = [
    "FilterError",
    "FilterRule",
    "check_rule",
    "filter_column",
    "parse_jsonpath",
    "parse_avropath",
    "JsonPath",
    "evaluate",
    "evaluate_rule",
]


def check_rule(rule: FilterRule) -> list[str]:
    """Validate one rule without Spark. Raise FilterError when it is invalid or unsupported; return notes
    worth printing (e.g. that the path is evaluated in Python, which is slower)."""
    from herald.filters.jsonpath import spark_expressible

    validate_basics(rule)
    java_only = check_matcher(rule.matcher)
    notes: list[str] = []
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

    `value_col` names Kafka's binary value column (cast to string here; a string column works too);
    `headers_col` names an array<struct<key:string,value:binary>> column. Column names, not Column objects:
    the native rules become one SQL expression. Raises FilterError for an invalid rule. True when `rules` is
    empty. Native rules run in the JVM; paths Spark cannot express run in a pandas UDF (see check_rule notes).
    """
    from herald.filters.compile import compile_rules

    rules = list(rules or [])
    for rule in rules:
        check_rule(rule)
    return compile_rules(rules, value_col, headers_col)


def evaluate_rule(rule: FilterRule, value, headers=None) -> bool:
    """Pure-Python evaluation of one rule for one message (reference semantics; no Spark)."""
    from herald.filters.python_eval import evaluate_rule as _evaluate_rule

    return _evaluate_rule(rule, value, headers)


def evaluate(rules: Sequence[FilterRule], value, headers=None) -> bool:
    """Pure-Python evaluation of rules AND-ed in order for one message (True when there are none)."""
    from herald.filters.python_eval import evaluate as _evaluate

    return _evaluate(rules, value, headers)
