"""Filter rules compiled to one Spark SQL expression (Catalyst evaluates it in the JVM).

The expression is generated as SQL text and handed to Spark once (`F.expr`): building the same tree through
PySpark's Column API costs hundreds of py4j round trips per rule (every higher-order function and lambda
variable is one), about 75 ms per wildcard rule.

Three ways to evaluate a jsonpath rule, cheapest first:

1. **Shared parse** (paths made only of member names, e.g. `$.user.country`): the rules of a subscription
   read their values from ONE `from_json` (the same expression text, which subexpression elimination
   evaluates once per row) with a schema merged from their paths (string leaves, so Spark's
   Jackson renders strings unquoted, numbers/booleans as text, objects/arrays as compact JSON). A null there
   means missing, JSON null, or a step into a non-object: all "no match" for Jayway, so it is exact. A single
   such rule uses `get_json_object` instead (no struct to build).
2. **Typed parse with a generic fallback** (paths with `[*]`/`.*`): `from_json` with the path's own schema,
   arrays for wildcards and indexes (`$.a[*].c` -> `struct<a: array<struct<c: string>>>`). Spark's parser is
   strict about types (a string is not an array, an object is not an array), and with partial results a type
   mismatch nulls the nearest enclosing struct field; so the typed values are real path values, and the
   answer is taken from them when it is certain:
   - `any`: a matching value -> true; no null where an array was expected -> false;
   - `all`: no null where an array was expected and no null value (a null value could be a JSON null, which
     fails, or a missing member, which Jayway skips) -> `size > 0 and forall`.
   Otherwise (an object under `.*`, a heterogeneous array, a missing path, a null leaf under `all`) the row
   goes to the generic evaluation. (At the root Spark reads an object as a one-element array of structs, so
   a root array schema is only applied to text that starts with '['.)
3. **Generic evaluation**: `get_json_object` for the prefix before the first wildcard, then the container
   text is exploded: `from_json(t, 'array<string>')` when it starts with '[' or
   `map_values(from_json(t, 'map<string,string>'))` when it starts with '{'; the steps up to the next wildcard
   run per element with `get_json_object`, and the next wildcard explodes again under `flatten`. A member
   that `get_json_object` returns null for is kept as a JSON null only when its parent has the key
   (`map_contains_key`); otherwise it is skipped, as Jayway skips it. A final index reads the parent array
   with `from_json` (`get_json_object` renders a JSON null picked by index as the text 'null').
   Measured pitfalls this avoids: `get_json_object('$.a[*].c')` returns a bare quoted value for one match and
   an array for several, and `get_json_object('$.a.*.c')` returns null for arrays and objects alike.

Definite paths with an index (`$.a[0].b`) use `get_json_object` alone. Paths Spark cannot express run in Python
(pandas UDF over Arrow batches, jsonpath-ng). The strategy: `any` -> `exists`, `all` -> `size > 0 and forall`,
nulls never match, everything wrapped in `coalesce(..., false)`.

avropath rules (over the JSON text of a decoded Avro record) are compiled by herald.filters.avropath_sql.

Rules are AND-ed; Spark's AND stops at the first false, so they are evaluated cheapest first (header rules,
the avropath rules' shared parse, the jsonpath shared parse, the other native rules in declaration order,
Python rules). Every part is deterministic and cannot fail, so the result is the AND of the rules as declared.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

from herald.filters.jsonpath import Field, Index, JsonPath, Step, Wildcard, parse_jsonpath, spark_expressible, spark_path
from herald.filters.regex import spark_pattern
from herald.filters.rules import FilterRule

_ARRAY = "'array<string>'"
_MAP = "'map<string,string>'"
_EMPTY = "cast(array() as array<string>)"
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


class _Names:
    """Fresh lambda variable names for one expression."""

    def __init__(self):
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"_hf{next(self._counter)}"


def _rlike(value: str, pattern: str) -> str:
    return f"coalesce({value} RLIKE {lit(pattern)}, false)"


def _let_bool(names: _Names, value: str, body: Callable[[str], str]) -> str:
    """`body(value)` with `value` computed once per row; `body` must never be null."""
    var = names()
    return f"exists(array({value}), {var} -> {body(var)})"


def _let_array(names: _Names, value: str, body: Callable[[str], str]) -> str:
    """The array `body(value)` with `value` computed once per row; `body` must never be null."""
    var = names()
    return f"flatten(transform(array({value}), {var} -> {body(var)}))"


def _strategy(names: _Names, values: str, pattern: str, strategy: str) -> str:
    var = names()
    if strategy == "any":
        return f"coalesce(exists({values}, {var} -> {var} RLIKE {lit(pattern)}), false)"
    return _let_bool(
        names, values,
        lambda array: f"coalesce(size({array}) > 0 AND forall({array}, {var} -> {_rlike(var, pattern)}), false)",
    )


# ---------------------------------------------------------------------------------------------- generic


def _explode(names: _Names, text: str, trim: bool = False) -> str:
    """Elements of a JSON array, or values of a JSON object, as Jackson texts; an empty array otherwise."""

    def body(t: str) -> str:
        head = f"ltrim({t})" if trim else t
        return (
            f"CASE WHEN startswith({head}, '[') THEN coalesce(from_json({t}, {_ARRAY}), {_EMPTY}) "
            f"WHEN startswith({head}, '{{') THEN coalesce(map_values(from_json({t}, {_MAP})), {_EMPTY}) "
            f"ELSE {_EMPTY} END"
        )

    return _let_array(names, text, body)


def _segments(steps: tuple[Step, ...]) -> tuple[list[Step], list[list[Step]]]:
    """Prefix before the first wildcard, then the runs of steps that follow each wildcard."""
    first = next(i for i, step in enumerate(steps) if isinstance(step, Wildcard))
    runs: list[list[Step]] = []
    for step in steps[first:]:
        if isinstance(step, Wildcard):
            runs.append([])
        else:
            runs[-1].append(step)
    return list(steps[:first]), runs


def _apply_run(names: _Names, elements: str, run: list[Step]) -> str:
    """Apply non-wildcard steps to every element: missing -> dropped, JSON null -> kept as null."""
    if not run:
        return elements
    parent_path = spark_path(run[:-1]) if len(run) > 1 else None
    last = run[-1]

    def parent_of(element: str) -> str:
        return element if parent_path is None else f"get_json_object({element}, {lit(parent_path)})"

    if isinstance(last, Index):
        element, array, item = names(), names(), names()
        arrays = f"transform({elements}, {element} -> from_json({parent_of(element)}, {_ARRAY}))"
        kept = f"filter({arrays}, {array} -> coalesce(size({array}) > {last.index}, false))"
        return f"transform({kept}, {item} -> try_element_at({item}, {last.index + 1}))"

    element, pair, item = names(), names(), names()
    value = f"get_json_object({element}, {lit(spark_path(run))})"
    parent = parent_of(f"{pair}.e")
    present = (f"coalesce(startswith({parent}, '{{') AND "
               f"map_contains_key(from_json({parent}, {_MAP}), {lit(last.name)}), false)")
    pairs = f"transform({elements}, {element} -> named_struct('v', {value}, 'e', {element}))"
    kept = f"filter({pairs}, {pair} -> {pair}.v IS NOT NULL OR {present})"
    return f"transform({kept}, {item} -> {item}.v)"


def generic_values(names: _Names, text: str, steps: tuple[Step, ...]) -> str:
    """array<string> of the values a path with at least one wildcard selects (null elements are JSON nulls)."""
    prefix, runs = _segments(steps)
    if prefix:
        elements = _explode(names, f"get_json_object({text}, {lit(spark_path(prefix))})")
    else:
        elements = _explode(names, text, trim=True)
    for index, run in enumerate(runs):
        if index > 0:
            element = names()
            elements = f"flatten(transform({elements}, {element} -> {_explode(names, element)}))"
        elements = _apply_run(names, elements, run)
    return elements


def definite_value(text: str, steps: tuple[Step, ...]) -> str:
    """The one value a path without wildcards selects (null when none, or a JSON null)."""
    if not steps or isinstance(steps[-1], Field):
        return f"get_json_object({text}, {lit(spark_path(steps))})"
    parent = text if len(steps) == 1 else f"get_json_object({text}, {lit(spark_path(steps[:-1]))})"
    return f"try_element_at(from_json({parent}, {_ARRAY}), {steps[-1].index + 1})"


# ---------------------------------------------------------------------------------------------- typed


def typed_ddl(steps: Sequence[Step]) -> str:
    """The from_json schema that reads exactly the path: structs for members, arrays for indexes and
    wildcards, a string at the end."""
    if not steps:
        return "string"
    step, rest = steps[0], steps[1:]
    if isinstance(step, Field):
        return f"struct<{ident(step.name)}: {typed_ddl(rest)}>"
    return f"array<{typed_ddl(rest)}>"


def _typed_rule(names: _Names, text: str, steps: tuple[Step, ...], pattern: str, strategy: str) -> str:
    parsed = f"from_json({text}, {schema_lit(typed_ddl(steps))})"
    if not isinstance(steps[0], Field):
        parsed = f"CASE WHEN startswith(ltrim({text}), '[') THEN {parsed} END"

    def body(root: str) -> str:
        # Up to the first wildcard there is one node: plain field access and try_element_at, no lambdas.
        node, nodes = root, None
        uncertain: list[str] = []
        for step in steps:
            if nodes is None:
                if isinstance(step, Field):
                    node = f"{node}.{ident(step.name)}"
                    continue
                # a null where an array should be: missing, JSON null, or not an array (an object under `.*`)
                uncertain.append(f"{node} IS NULL")
                if isinstance(step, Index):
                    node = f"try_element_at({node}, {step.index + 1})"
                else:
                    nodes = node
                continue
            var = names()
            if isinstance(step, Field):
                nodes = f"transform({nodes}, {var} -> {var}.{ident(step.name)})"
                continue
            uncertain.append(f"exists({nodes}, {var} -> {var} IS NULL)")
            other = names()
            if isinstance(step, Index):
                nodes = f"transform({nodes}, {other} -> try_element_at({other}, {step.index + 1}))"
            else:
                nodes = f"flatten(filter({nodes}, {other} -> {other} IS NOT NULL))"
        unsure = " OR ".join(uncertain) or "false"
        generic = _strategy(names, generic_values(names, text, steps), pattern, strategy)
        value = names()
        if strategy == "any":
            return (f"CASE WHEN exists({nodes}, {value} -> {value} RLIKE {lit(pattern)}) THEN true "
                    f"WHEN NOT ({unsure}) THEN false ELSE {generic} END")

        def decide(values: str) -> str:
            return (f"CASE WHEN {unsure} OR exists({values}, {value} -> {value} IS NULL) THEN {generic} "
                    f"ELSE coalesce(size({values}) > 0 AND forall({values}, {value} -> {_rlike(value, pattern)}), "
                    f"false) END")

        return _let_bool(names, nodes, decide)

    return _let_bool(names, parsed, body)


# ---------------------------------------------------------------------------------------------- shared


class _Trie:
    """Member-name paths merged into one struct schema; a node is either a leaf (string) or a struct."""

    def __init__(self):
        self.children: dict[str, _Trie] = {}
        self.leaf = False

    def insert(self, path_names: Sequence[str]) -> bool:
        """Add a path; False when it conflicts with one already there (then it is evaluated on its own)."""
        node = self
        for depth, name in enumerate(path_names):
            if node.leaf:
                return False
            child = node.children.get(name)
            if child is None:
                # Spark resolves struct fields case-insensitively by default: keep siblings distinct.
                if any(other.lower() == name.lower() for other in node.children):
                    return False
                child = node.children[name] = _Trie()
            node = child
            if depth == len(path_names) - 1:
                if node.children:
                    return False
                node.leaf = True
        return True

    def ddl(self) -> str:
        if self.leaf:
            return "string"
        return "struct<" + ", ".join(f"{ident(name)}: {child.ddl()}" for name, child in self.children.items()) + ">"


def _shared_rules(names: _Names, text: str, rules: list[tuple[FilterRule, tuple[str, ...]]]) -> tuple[str | None, list]:
    """One from_json for the member-name paths of several rules; returns (condition, rules left over)."""
    trie = _Trie()
    shared, leftover = [], []
    for rule, path_names in rules:
        (shared if trie.insert(path_names) else leftover).append((rule, path_names))
    if len(shared) < 2:
        return None, rules

    # The same from_json text in every condition: Spark's subexpression elimination evaluates it once per row
    # (no higher-order function, so the predicate stays compiled). The option only stops the optimizer from
    # pruning the schema per field access, which would make the expressions differ.
    parsed = f"from_json({text}, {schema_lit(trie.ddl())}, map('mode', 'PERMISSIVE'))"
    conditions = []
    for rule, path_names in shared:
        value = parsed + "".join("." + ident(name) for name in path_names)
        conditions.append(_rlike(value, spark_pattern(rule.matcher)))
    return " AND ".join(conditions), leftover


# ---------------------------------------------------------------------------------------------- rules


def native_path(path: JsonPath) -> bool:
    """True when the path compiles to Spark expressions (otherwise it is evaluated in Python)."""
    return path.steps is not None and spark_expressible(path.steps)


def header_sql(names: _Names, rule: FilterRule, headers: str) -> str:
    header, selected = names(), names()
    values = (f"transform(filter({headers}, {header} -> {header}.key = {lit(rule.header)}), "
              f"{selected} -> cast({selected}.value as string))")
    return _strategy(names, values, spark_pattern(rule.matcher), rule.strategy)


def jsonpath_sql(names: _Names, rule: FilterRule, text: str) -> str:
    """One native jsonpath rule on its own (no shared parse)."""
    path = parse_jsonpath(rule.path)
    pattern = spark_pattern(rule.matcher)
    if path.definite:
        return _rlike(definite_value(text, path.steps), pattern)
    return _typed_rule(names, text, path.steps, pattern, rule.strategy)


def rules_sql(rules: Sequence[FilterRule], value: str, headers: str) -> tuple[str, list[FilterRule]]:
    """SQL for the native rules (AND-ed, cheapest first) and the rules left for Python. `value` is a binary or
    string column holding JSON text (`cast(... as string)` of a string is a no-op); avropath rules read the JSON
    text of a decoded Avro record (herald.filters.avropath_sql) and are always native."""
    names = _Names()
    text = f"cast({value} as string)"
    header_conditions: list[str] = []
    member_paths: list[tuple[int, tuple[str, ...]]] = []
    singles: list[int] = []
    python: list[FilterRule] = []
    avropath_rules: list[FilterRule] = []
    for position, rule in enumerate(rules):
        if rule.type == "header":
            header_conditions.append(header_sql(names, rule, headers))
            continue
        if rule.type == "avropath":
            avropath_rules.append(rule)
            continue
        path = parse_jsonpath(rule.path)
        if not native_path(path):
            python.append(rule)
        elif path.steps and all(isinstance(step, Field) for step in path.steps):
            member_paths.append((position, tuple(step.name for step in path.steps)))
        else:
            singles.append(position)
    conditions = list(header_conditions)
    if avropath_rules:
        from herald.filters.avropath_sql import avropath_conditions  # imports this module

        conditions += avropath_conditions(names, avropath_rules, text)
    shared, leftover = _shared_rules(names, text, [(rules[position], path) for position, path in member_paths])
    if shared is not None:
        conditions.append(shared)
        singles += [position for position, path in member_paths if (rules[position], path) in leftover]
    else:
        singles += [position for position, _ in member_paths]
    conditions += [jsonpath_sql(names, rules[position], text) for position in sorted(set(singles))]
    return " AND ".join(f"({condition})" for condition in conditions) or "true", python


def python_udf_column(rule: FilterRule, value: Column) -> Column:
    """A vectorised (Arrow) Python evaluation of one jsonpath rule over the message value column."""

    @pandas_udf("boolean")
    def herald_python_filter(values: pd.Series) -> pd.Series:
        from herald.filters.python_eval import python_rule

        evaluator = python_rule(rule)
        return pd.Series(evaluator.match_values(values), dtype=bool, index=values.index)

    return F.coalesce(herald_python_filter(value), F.lit(False))


def compile_rules(rules: Sequence[FilterRule], value_col: str, headers_col: str) -> Column:
    for column in (value_col, headers_col):
        if not isinstance(column, str):
            raise TypeError(f"filter_column takes column names, got {type(column).__name__}: add the column to "
                            "the DataFrame (withColumn/select ... alias) and pass its name")
    sql, python = rules_sql(rules, column_ref(value_col), column_ref(headers_col))
    result = F.expr(sql) if sql != "true" or not python else None
    for rule in python:
        condition = python_udf_column(rule, F.col(value_col))
        result = condition if result is None else (result & condition)
    return result
