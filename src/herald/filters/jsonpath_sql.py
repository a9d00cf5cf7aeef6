"""jsonpath and header rules as Spark SQL text (Catalyst evaluates it in the JVM).

Three ways to evaluate a jsonpath rule, cheapest first:

1. **Shared parse** (paths made only of member names, e.g. `$.user.country`): several rules read their values
   from ONE `from_json` whose schema merges their paths (`MemberTrie`; string leaves, so Spark's Jackson renders
   strings unquoted, numbers/booleans as text, objects/arrays as compact JSON). A null there means missing, JSON
   null, or a step into a non-object: all "no match" for Jayway, so it is exact. A lone such rule of a
   `filter_column` uses `get_json_object` instead (no struct to build).
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

Definite paths with an index (`$.a[0].b`) use `get_json_object` alone. The strategy: `any` -> `exists`, `all`
-> `size > 0 and forall`, nulls never match, everything wrapped in `coalesce(..., false)` (herald.filters.sql).

A parse (shared or typed) is a separate expression (`typed_parse`, `MemberTrie.ddl`) from the conditions that
read it (`typed_condition`, `member_value`), so that a caller can bind it once per row the way it prefers: a
lambda (herald.filters.compile) or a helper column (herald.filters.targets).
"""

from __future__ import annotations

from collections.abc import Sequence

from herald.filters.jsonpath import Field, Index, Step, Wildcard, spark_path
from herald.filters.rules import FilterRule
from herald.filters.sql import (
    EMPTY,
    Names,
    all_match,
    any_match,
    ident,
    let_array,
    let_bool,
    lit,
    matched,
    schema_lit,
    strategy_match,
)

_ARRAY = "'array<string>'"
_MAP = "'map<string,string>'"

# ---------------------------------------------------------------------------------------------- generic


def _explode(names: Names, text: str, trim: bool = False) -> str:
    """Elements of a JSON array, or values of a JSON object, as Jackson texts; an empty array otherwise."""

    def body(t: str) -> str:
        head = f"ltrim({t})" if trim else t
        return (
            f"CASE WHEN startswith({head}, '[') THEN coalesce(from_json({t}, {_ARRAY}), {EMPTY}) "
            f"WHEN startswith({head}, '{{') THEN coalesce(map_values(from_json({t}, {_MAP})), {EMPTY}) "
            f"ELSE {EMPTY} END"
        )

    return let_array(names, text, body)


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


def _apply_run(names: Names, elements: str, run: list[Step]) -> str:
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


def generic_values(names: Names, text: str, steps: tuple[Step, ...]) -> str:
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


def typed_parse(text: str, steps: tuple[Step, ...]) -> str:
    """The typed parse of a wildcard path (null for a root array schema over text that is not an array)."""
    parsed = f"from_json({text}, {schema_lit(typed_ddl(steps))})"
    if not isinstance(steps[0], Field):
        parsed = f"CASE WHEN startswith(ltrim({text}), '[') THEN {parsed} END"
    return parsed


def typed_condition(names: Names, root: str, text: str, steps: tuple[Step, ...], matcher: str,
                    strategy: str) -> str:
    """A wildcard rule (never null): `root` is `typed_parse(text, steps)`, bound once per row by the caller."""
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
    generic = strategy_match(names, generic_values(names, text, steps), matcher, strategy)
    if strategy == "any":
        return (f"CASE WHEN {any_match(names, nodes, matcher)} THEN true "
                f"WHEN NOT ({unsure}) THEN false ELSE {generic} END")

    def decide(values: str) -> str:
        value = names()
        return (f"CASE WHEN {unsure} OR exists({values}, {value} -> {value} IS NULL) THEN {generic} "
                f"ELSE {all_match(names, values, matcher)} END")

    return let_bool(names, nodes, decide)


# ---------------------------------------------------------------------------------------------- shared


class MemberTrie:
    """Member-name paths merged into one struct schema; a node is either a leaf (string) or a struct."""

    def __init__(self):
        self.children: dict[str, MemberTrie] = {}
        self.leaf = False

    def insert(self, path_names: Sequence[str]) -> bool:
        """Add a path; False (and the trie unchanged) when it conflicts with one already there: a leaf on the way,
        children under its end, or a sibling that differs only in case (Spark resolves struct fields
        case-insensitively by default)."""
        node = self
        for depth, name in enumerate(path_names):
            if node.leaf:
                return False
            child = node.children.get(name)
            if child is None:
                if any(other.lower() == name.lower() for other in node.children):
                    return False
                child = node.children[name] = MemberTrie()
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


def member_names(steps: tuple[Step, ...] | None) -> tuple[str, ...] | None:
    """The member names of a non-empty path made only of them (`$.a.b`, `$['a']`), else None."""
    if not steps or not all(isinstance(step, Field) for step in steps):
        return None
    return tuple(step.name for step in steps)


def member_value(root: str, path_names: Sequence[str]) -> str:
    """The string a member-name path selects from `root`, a parse whose schema covers it."""
    return root + "".join("." + ident(name) for name in path_names)


# ---------------------------------------------------------------------------------------------- single rules


def header_values(names: Names, name: str, headers: str) -> str:
    """array<string>: the values of the header `name` (exact, case-sensitive), decoded as UTF-8."""
    header, selected = names(), names()
    return (f"transform(filter({headers}, {header} -> {header}.key = {lit(name)}), "
            f"{selected} -> cast({selected}.value as string))")


def header_sql(names: Names, rule: FilterRule, headers: str) -> str:
    return strategy_match(names, header_values(names, rule.header, headers), rule.matcher, rule.strategy)


def jsonpath_sql(names: Names, rule: FilterRule, steps: tuple[Step, ...], text: str) -> str:
    """One native jsonpath rule on its own (no shared parse)."""
    if not any(isinstance(step, Wildcard) for step in steps):
        return matched(definite_value(text, steps), rule.matcher)
    return let_bool(names, typed_parse(text, steps),
                    lambda root: typed_condition(names, root, text, steps, rule.matcher, rule.strategy))
