"""Spark SQL text shared by the filter compilers: literals, identifiers, lambda variables, values bound once per
row, and selected values tested against a matcher.

Filters are generated as SQL text and handed to Spark once (`F.expr`): building the same tree through PySpark's
Column API costs hundreds of py4j round trips per rule (every higher-order function and lambda variable is one),
about 75 ms per wildcard rule.

A matcher must match the whole value. One that is a plain literal (herald.filters.regex.literal: `PL`,
`order\\.created`) compiles to `=`, or to `array_contains` / `array_distinct` over a selection: Spark's code
generation evaluates those without a regex and without a lambda, which matters when a topic's rows are tested
against the filters of many subscriptions. Any other matcher compiles to `RLIKE`, anchored
(herald.filters.regex.spark_pattern).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from herald.filters.regex import literal, spark_pattern

EMPTY = "cast(array() as array<string>)"
_SAFE_LITERAL = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 $.[]*_-:@,<>(){}?!=+/#%&|~^")


def lit(text: str) -> str:
    """A SQL string literal. Texts with quotes, backslashes or control characters go through UTF-8 hex, which
    reads the same whatever `spark.sql.parser.escapedStringLiterals` says (constant-folded by Catalyst)."""
    if all(char in _SAFE_LITERAL or ord(char) > 127 for char in text):
        return f"'{text}'"
    return f"decode(X'{text.encode('utf-8').hex()}', 'UTF-8')"


def schema_lit(ddl: str) -> str:
    """from_json needs a true string literal for its schema."""
    return "'" + ddl.replace("\\", "\\\\").replace("'", "\\'") + "'"


def ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def column_ref(name: str) -> str:
    """A column name as F.col reads it: dots separate nested fields unless the name is quoted with backticks."""
    if "`" in name:
        return name
    return ".".join(ident(part) for part in name.split("."))


class Names:
    """Fresh lambda variable names for one expression."""

    def __init__(self):
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"_hf{next(self._counter)}"


def let_bool(names: Names, value: str, body: Callable[[str], str]) -> str:
    """`body(value)` with `value` computed once per row; `body` must never be null."""
    var = names()
    return f"exists(array({value}), {var} -> {body(var)})"


def let_array(names: Names, value: str, body: Callable[[str], str]) -> str:
    """The array `body(value)` with `value` computed once per row; `body` must never be null."""
    var = names()
    return f"flatten(transform(array({value}), {var} -> {body(var)}))"


# ---------------------------------------------------------------------------------------------- matching


def match(value: str, matcher: str) -> str:
    """The string `value` matches the whole Java regex `matcher`; null when `value` is null."""
    text = literal(matcher)
    if text is not None:
        return f"{value} = {lit(text)}"
    return f"{value} RLIKE {lit(spark_pattern(matcher))}"


def matched(value: str, matcher: str) -> str:
    """`match`, never null: a null value does not match."""
    return f"coalesce({match(value, matcher)}, false)"


def any_match(names: Names, values: str, matcher: str) -> str:
    """Some element of the array<string> `values` matches: true, false, or null (no match but a null element, or
    no array)."""
    text = literal(matcher)
    if text is not None:
        return f"array_contains({values}, {lit(text)})"
    var = names()
    return f"exists({values}, {var} -> {match(var, matcher)})"


def all_match(names: Names, values: str, matcher: str) -> str:
    """The array<string> `values` is not empty and every element matches (a null element does not); never null.
    `values` may appear twice: pass a column or a lambda variable."""
    text = literal(matcher)
    if text is not None:  # its distinct elements are exactly the literal: no null, not empty
        return f"coalesce(array_distinct({values}) = array({lit(text)}), false)"
    var = names()
    return f"coalesce(size({values}) > 0 AND forall({values}, {var} -> {matched(var, matcher)}), false)"


def strategy_match(names: Names, values: str, matcher: str, strategy: str) -> str:
    """The array<string> `values` passes the matching strategy (`any` or `all`); never null. `values` is
    evaluated once per row, whatever its size."""
    if strategy == "any":
        return f"coalesce({any_match(names, values, matcher)}, false)"
    if literal(matcher) is not None:
        return all_match(names, values, matcher)
    return let_bool(names, values, lambda array: all_match(names, array, matcher))
