"""One subscription's filter rules compiled to one boolean Spark Column (`filter_column`).

The native rules become one SQL expression (herald.filters.jsonpath_sql, herald.filters.avropath_sql), AND-ed.
Spark's AND stops at the first false, so they are evaluated cheapest first: header rules, the avropath rules'
shared parses, the jsonpath rules' shared parse, the other native rules in declaration order. Paths Spark cannot
express run in Python (pandas UDF over Arrow batches, jsonpath-ng), after them. Every part is deterministic and
cannot fail, so the result is the AND of the rules as declared.

Parses are bound without helper columns, since the result is a Column and not a DataFrame: the member-name paths'
shared `from_json` is the same expression text in every condition, which subexpression elimination evaluates once
per row (no higher-order function, so the predicate stays compiled; the `mode` option only stops the optimizer
from pruning the schema per field access, which would make the expressions differ); typed and avropath parses are
bound with a lambda. herald.filters.targets evaluates many subscriptions' rules in one projection instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

from herald.filters.avropath_sql import avropath_conditions
from herald.filters.jsonpath import native_path, parse_jsonpath
from herald.filters.jsonpath_sql import MemberTrie, header_sql, jsonpath_sql, member_names, member_value
from herald.filters.rules import FilterRule
from herald.filters.sql import Names, column_ref, matched, schema_lit


def _shared_member_rules(text: str, members: list[tuple[FilterRule, tuple[str, ...]]]) -> tuple[str | None, set]:
    """One from_json for the member-name paths of several rules: (their condition, the rules it covers), or
    (None, no rules) when fewer than two fit in one schema."""
    trie = MemberTrie()
    shared = []
    for rule, path_names in members:
        if trie.insert(path_names):
            shared.append((rule, path_names))
    if len(shared) < 2:
        return None, set()
    parsed = f"from_json({text}, {schema_lit(trie.ddl())}, map('mode', 'PERMISSIVE'))"
    condition = " AND ".join(matched(member_value(parsed, path_names), rule.matcher) for rule, path_names in shared)
    return condition, {rule for rule, _ in shared}


def rules_sql(rules: Sequence[FilterRule], value: str, headers: str) -> tuple[str, list[FilterRule]]:
    """SQL for the native rules (AND-ed, cheapest first) and the rules left for Python. `value` is a binary or
    string column holding JSON text (`cast(... as string)` of a string is a no-op); avropath rules read the JSON
    text of a decoded Avro record (herald.filters.avropath_sql) and are always native."""
    names = Names()
    text = f"cast({value} as string)"
    conditions = [header_sql(names, rule, headers) for rule in rules if rule.type == "header"]
    avropath_rules = [rule for rule in rules if rule.type == "avropath"]
    if avropath_rules:
        conditions += avropath_conditions(names, avropath_rules, text)
    paths = {rule: parse_jsonpath(rule.path) for rule in rules if rule.type == "jsonpath"}
    native = [rule for rule, path in paths.items() if native_path(path)]  # in declaration order
    members = [(rule, member_names(paths[rule].steps)) for rule in native if member_names(paths[rule].steps)]
    shared, covered = _shared_member_rules(text, members)
    if shared is not None:
        conditions.append(shared)
    conditions += [jsonpath_sql(names, rule, paths[rule].steps, text) for rule in native if rule not in covered]
    python = [rule for rule, path in paths.items() if not native_path(path)]
    return " AND ".join(f"({condition})" for condition in conditions) or "true", python


def python_udf_column(rule: FilterRule, value: Column) -> Column:
    """A vectorised (Arrow) Python evaluation of one jsonpath rule over the message value column; never null."""

    @pandas_udf("boolean")
    def herald_python_filter(values: pd.Series) -> pd.Series:
        from herald.filters.python_eval import python_rule

        evaluator = python_rule(rule)
        return pd.Series(evaluator.match_values(values), dtype=bool, index=values.index)

    return F.coalesce(herald_python_filter(value), F.lit(False))


def check_column_names(*columns) -> None:
    for column in columns:
        if not isinstance(column, str):
            raise TypeError(f"filters take column names, got {type(column).__name__}: add the column to the "
                            "DataFrame (withColumn/select ... alias) and pass its name")


def compile_rules(rules: Sequence[FilterRule], value_col: str, headers_col: str) -> Column:
    check_column_names(value_col, headers_col)
    sql, python = rules_sql(rules, column_ref(value_col), column_ref(headers_col))
    result = F.expr(sql) if sql != "true" or not python else None
    for rule in python:
        condition = python_udf_column(rule, F.col(value_col))
        result = condition if result is None else (result & condition)
    return result
