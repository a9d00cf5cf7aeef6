"""avropath rules compiled to Spark SQL over the JSON text of a decoded Avro record.

An Avro topic's records are decoded once, upstream of the filters, into JSON text (herald.avro.convert.to_json:
records and maps are objects, unions are bare values). Hermes' AvroPathPredicate semantics (herald.filters.avropath)
then need three facts per step: is the value an object, is it an array, is it missing or null. Spark's `from_json`
with a schema shaped like the path gives all three cheaply:

- each segment reads a struct field; a plain segment in the middle is a `struct` (null when the field is missing,
  null, or not an object: all three make Hermes' selection empty), the last one a `string` (Jackson's text:
  strings unquoted, numbers as Java doubles/longs, objects and arrays as compact JSON; null when missing or null,
  which Hermes compares as "null");
- a `name[N]` / `name[*]` segment reads `array<...>` (null when missing, null or not an array: empty selection).

Spark nulls a struct field whose JSON value has the wrong type and keeps its siblings (partial results, the Spark 4
default), so those answers are exact. One case is not: an array that must be read as `array<struct>` (segments
follow its selector) whose elements are not all objects or nulls, e.g. an Avro array of a union of a record and a
string, comes back as null as a whole. The typed evaluation therefore returns NULL (not an empty selection) when
such an array is null, and the rule then re-reads that array as `array<string>` (element texts) zipped with
`array<variant>` (element kinds: only objects are navigated, so a string holding JSON text is never mistaken for
a record), and evaluates the rest of the path on each object element's text the same way, recursively. Rows
where such an array is missing or null pay one extra (pruned) parse; rows where it is mixed also pay the variant
parse and one parse per element.

All avropath rules of one `filter_column` call, or of every rule set of one `with_targets` call, read one
`from_json` (`shape_groups`: their path schemas merged; rules whose paths disagree on a field's shape, or name
siblings that differ only in case, get their own), bound once per row with a lambda (filter_column) or as a helper
column (with_targets). The selection is an `array<string>` without nulls; `any` -> exists, `all` -> size > 0 and
forall, with the matcher matching the whole value, as for jsonpath rules (herald.filters.sql).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from herald.filters.avropath import NULL_TEXT, Segment, parse_segments
from herald.filters.rules import FilterRule
from herald.filters.sql import EMPTY, Names, ident, let_array, let_bool, lit, schema_lit, strategy_match

_NULL = lit(NULL_TEXT)


@dataclass
class Shape:
    """The from_json type that reads some paths: `string` leaves, `struct` for records/maps, `array`."""

    kind: str  # "string" | "struct" | "array"
    fields: dict[str, Shape] = field(default_factory=dict)
    element: Shape | None = None

    def ddl(self) -> str:
        if self.kind == "array":
            return f"array<{self.element.ddl()}>"
        if self.kind == "struct":
            return "struct<" + ", ".join(f"{ident(name)}: {shape.ddl()}" for name, shape in self.fields.items()) + ">"
        return "string"


def shape_parse(text: str, shape: Shape) -> str:
    """The JSON text `text` read with `shape`."""
    return f"from_json({text}, {schema_lit(shape.ddl())})"


def path_shape(segments: Sequence[Segment]) -> Shape:
    """The shape that reads exactly one path."""
    shape = Shape("string")
    for segment in reversed(segments):
        value = Shape("array", element=shape) if segment.array else shape
        shape = Shape("struct", {segment.name: value})
    return shape


def merge(one: Shape, other: Shape) -> Shape | None:
    """One shape reading both, or None when they disagree (Spark resolves struct fields case-insensitively by
    default, so siblings that differ only in case also disagree)."""
    if one.kind != other.kind:
        return None
    if one.kind == "array":
        element = merge(one.element, other.element)
        return None if element is None else Shape("array", element=element)
    if one.kind == "string":
        return one
    fields = dict(one.fields)
    for name, shape in other.fields.items():
        if name in fields:
            merged = merge(fields[name], shape)
            if merged is None:
                return None
            fields[name] = merged
        elif any(existing.lower() == name.lower() for existing in fields):
            return None
        else:
            fields[name] = shape
    return Shape("struct", fields)


def _needs_fallback(segments: Sequence[Segment]) -> bool:
    """True when some array must be read as structs (a selector with segments after it)."""
    return any(segment.array for segment in segments[:-1])


def _typed(names: Names, node: str, segments: Sequence[Segment]) -> str:
    """array<string> the path selects under the non-null struct `node`; NULL when an array that must hold
    records came back null (missing, null, not an array, or mixed elements: the caller decides)."""
    segment, rest = segments[0], segments[1:]
    value = f"{node}.{ident(segment.name)}"
    if not segment.array:
        if not rest:
            return f"array(coalesce({value}, {_NULL}))"
        return f"CASE WHEN {value} IS NULL THEN {EMPTY} ELSE {_typed(names, value, rest)} END"
    if not rest:  # array<string>: every element reads as text, so null means missing, null or not an array
        if segment.selector == "*":
            item = names()
            selected = f"transform({value}, {item} -> coalesce({item}, {_NULL}))"
        else:
            selected = f"array(coalesce(try_element_at({value}, {segment.selector + 1}), {_NULL}))"
        return f"CASE WHEN {value} IS NULL THEN {EMPTY} ELSE {selected} END"
    if segment.selector == "*":
        item = names()
        per_item = f"CASE WHEN {item} IS NULL THEN {EMPTY} ELSE {_typed(names, item, rest)} END"
        selected = f"flatten(transform({value}, {item} -> {per_item}))"  # NULL when any item's answer is NULL
    else:
        element = f"try_element_at({value}, {segment.selector + 1})"
        selected = f"CASE WHEN {element} IS NULL THEN {EMPTY} ELSE {_typed(names, element, rest)} END"
    return f"CASE WHEN {value} IS NOT NULL THEN {selected} END"


def _array_ddl(prefix: Sequence[Segment], name: str, element: str) -> str:
    ddl = f"struct<{ident(name)}: array<{element}>>"
    for segment in reversed(prefix):
        ddl = f"struct<{ident(segment.name)}: {ddl}>"
    return ddl


def _fallback(names: Names, text: str, segments: Sequence[Segment]) -> str:
    """array<string> (never null) the path selects from `text`, reading the first array of records element by
    element: texts from `array<string>`, kinds from `array<variant>`."""
    position = next(i for i, segment in enumerate(segments[:-1]) if segment.array)
    prefix, segment, rest = segments[:position], segments[position], segments[position + 1:]
    access = "".join(f".{ident(s.name)}" for s in prefix) + f".{ident(segment.name)}"
    texts = f"from_json({text}, {schema_lit(_array_ddl(prefix, segment.name, 'string'))}){access}"
    kinds = f"from_json({text}, {schema_lit(_array_ddl(prefix, segment.name, 'variant'))}){access}"

    def is_object(kind: str) -> str:
        return f"try_variant_get({kind}, '$', 'map<string,variant>') IS NOT NULL"

    def body(elements: str) -> str:
        if segment.selector == "*":
            element, kind = names(), names()
            per_element = (f"CASE WHEN {is_object(kind)} THEN {text_values(names, element, rest)} "
                           f"ELSE {EMPTY} END")
            picked = f"flatten(zip_with({elements}, {kinds}, ({element}, {kind}) -> {per_element}))"
        else:
            index = segment.selector + 1
            picked = (f"CASE WHEN {is_object(f'try_element_at({kinds}, {index})')} "
                      f"THEN {text_values(names, f'try_element_at({elements}, {index})', rest)} ELSE {EMPTY} END")
        return f"CASE WHEN {elements} IS NULL THEN {EMPTY} ELSE {picked} END"

    return let_array(names, texts, body)


def selected_values(names: Names, root: str, segments: Sequence[Segment], text: str) -> str:
    """array<string> (never null) the path selects; `root` is `text` parsed with a shape that covers the path."""
    typed = f"CASE WHEN {root} IS NULL THEN {EMPTY} ELSE {_typed(names, root, segments)} END"
    if not _needs_fallback(segments):
        return typed
    return f"coalesce({typed}, {_fallback(names, text, segments)})"


def text_values(names: Names, text: str, segments: Sequence[Segment]) -> str:
    """array<string> (never null) the path selects from the JSON text `text` on its own."""
    return let_array(names, shape_parse(text, path_shape(segments)),
                     lambda root: selected_values(names, root, segments, text))


def shape_groups(rules: Sequence[FilterRule]) -> list[tuple[Shape, list[FilterRule]]]:
    """avropath rules grouped so that each group's paths merge into one shape (one `from_json` per group): each
    rule joins the first group it merges with."""
    groups: list[tuple[Shape, list[FilterRule]]] = []
    for rule in rules:
        shape = path_shape(parse_segments(rule.path))
        for position, (group_shape, members) in enumerate(groups):
            merged = merge(group_shape, shape)
            if merged is not None:
                groups[position] = (merged, [*members, rule])
                break
        else:
            groups.append((shape, [rule]))
    return groups


def avropath_condition(names: Names, root: str, text: str, rule: FilterRule) -> str:
    """One avropath rule (never null); `root` is `shape_parse(text, shape)` for a shape that covers its path,
    bound once per row by the caller."""
    segments = parse_segments(rule.path)
    return strategy_match(names, selected_values(names, root, segments, text), rule.matcher, rule.strategy)


def avropath_conditions(names: Names, rules: Sequence[FilterRule], text: str) -> list[str]:
    """SQL conditions (never null) for the avropath rules, AND-ed: one per from_json the rules share."""
    return [
        let_bool(names, shape_parse(text, shape),
                 lambda root, members=members: " AND ".join(f"({avropath_condition(names, root, text, rule)})"
                                                            for rule in members))
        for shape, members in shape_groups(rules)
    ]
