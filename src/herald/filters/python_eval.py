"""Filters evaluated in plain Python: the reference semantics, and the fallback for paths Spark cannot express.

Semantics (Hermes' JsonPathPredicate on Jayway, with the choices documented in herald.filters):

- the document is parsed as JSON; text after the first complete JSON value is ignored, as Spark's parser does;
  anything unparseable selects nothing
- the path selects a list of values (IR paths with Jayway's rules: `[*]`/`.*` take every array element or
  object value; missing members, out-of-range indexes and steps into non-containers select nothing)
- each value becomes a string as Spark renders it with Jackson, which for numbers is Java's `Double.toString`
  (what Hermes' json-smart gives): strings unquoted, `true`/`false`, integers as written, decimals as Java
  doubles (`1.50` -> `1.5`, `1e2` -> `100.0`, `0.00001` -> `1.0E-5`), objects and arrays as compact JSON
- a JSON null is a value that never matches; an empty selection never matches
- `all`: every value fully matches the matcher; `any`: at least one does

avropath rules follow Hermes' AvroPathPredicate instead (herald.filters.avropath.select_texts): the value is a
decoded Avro record (dict) or the JSON text Herald converts it to.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence

from herald.filters.avropath import parse_segments, select_texts
from herald.filters.jsonpath import Field, Index, JsonPath, Wildcard, compiled_jsonpath_ng, parse_jsonpath
from herald.filters.regex import python_pattern
from herald.filters.rules import FilterRule, validate_basics
from herald.filters.values import INVALID, parse_json, value_text


def select(steps: Sequence, document) -> list:
    """Values the IR steps select from a parsed document (Jayway rules); JSON null appears as None."""
    current = [document]
    for step in steps:
        selected = []
        if isinstance(step, Field):
            for value in current:
                if isinstance(value, dict) and step.name in value:
                    selected.append(value[step.name])
        elif isinstance(step, Index):
            for value in current:
                if isinstance(value, list) and step.index < len(value):
                    selected.append(value[step.index])
        elif isinstance(step, Wildcard):
            for value in current:
                if isinstance(value, list):
                    selected.extend(value)
                elif isinstance(value, dict):
                    selected.extend(value.values())
        else:  # pragma: no cover - the IR has three steps
            raise TypeError(f"unknown step {step!r}")
        current = selected
    return current


def select_path(path: JsonPath, document) -> list:
    """Values `path` selects: the IR evaluator for native paths, jsonpath-ng's ext evaluator for the rest."""
    if document is INVALID:
        return []
    if path.steps is not None:
        return select(path.steps, document)
    try:
        return [match.value for match in compiled_jsonpath_ng(path).find(document)]
    except Exception:  # noqa: BLE001 - a failing evaluation filters the message, as in Hermes
        return []


def match_strategy(texts: Sequence[str | None], pattern, strategy: str) -> bool:
    if not texts:
        return False
    if strategy == "any":
        return any(text is not None and pattern.fullmatch(text) is not None for text in texts)
    return all(text is not None and pattern.fullmatch(text) is not None for text in texts)


def _decode(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return bytes(value).decode("utf-8", errors="replace")


def _header_items(headers) -> Iterable[tuple[str, object]]:
    if headers is None:
        return ()
    if isinstance(headers, Mapping):
        return headers.items()
    items = []
    for header in headers:
        if isinstance(header, Mapping):
            items.append((header.get("key"), header.get("value")))
        elif hasattr(header, "asDict"):  # pyspark Row
            items.append((header["key"], header["value"]))
        else:
            key, value = header
            items.append((key, value))
    return items


class PythonRule:
    """One rule, ready to evaluate row by row in Python."""

    def __init__(self, rule: FilterRule):
        validate_basics(rule)
        self.rule = rule
        self.strategy = rule.strategy
        self.pattern = python_pattern(rule.matcher)
        self.path = parse_jsonpath(rule.path) if rule.type == "jsonpath" else None
        self.segments = parse_segments(rule.path) if rule.type == "avropath" else None

    def values(self, value, headers=None) -> list[str | None]:
        """The strings the rule compares (None for JSON null / a null header value)."""
        if self.rule.type == "header":
            return [_decode(v) for key, v in _header_items(headers) if key == self.rule.header]
        if self.segments is not None:
            return select_texts(self.segments, value)
        return [value_text(v) for v in select_path(self.path, parse_json(value))]

    def __call__(self, value, headers=None) -> bool:
        return match_strategy(self.values(value, headers), self.pattern, self.strategy)

    def match_values(self, values: Iterable) -> list[bool]:
        """A batch of message values (bytes, str or None) for a jsonpath rule."""
        return [self(value) for value in values]


@functools.lru_cache(maxsize=256)
def python_rule(rule: FilterRule) -> PythonRule:
    return PythonRule(rule)


def evaluate_rule(rule: FilterRule, value, headers=None) -> bool:
    """Pure-Python evaluation of one rule for one message (the reference semantics; no Spark): True when it
    passes. value: JSON as bytes or str; for avropath rules also a decoded Avro record (dict); headers: (key,
    value) pairs."""
    return python_rule(rule)(value, headers)


def evaluate(rules: Sequence[FilterRule], value, headers=None) -> bool:
    """Pure-Python evaluation of rules AND-ed in declaration order for one message (True when there are none)."""
    return all(evaluate_rule(rule, value, headers) for rule in rules)
