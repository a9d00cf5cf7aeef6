"""The JSON text of a record spark-avro decoded, as Spark column expressions, equal to what fastavro and
`herald.avro.convert.to_json` make of the same record in Python.

The expression is built on the driver from the record's Avro schema (the one `from_avro` decoded it with,
`plain_schema`: logical types other than `decimal` removed, so timestamps and dates stay longs and ints), type by
type, the way `json.dumps(..., ensure_ascii=False, separators=(",", ":"))` writes the Python values:

- records: fields in schema order, `null` fields kept; the top-level `__metadata` dropped; maps (were they
  supported) as objects. A run of fields Spark's JSON writer renders as json.dumps does (booleans, ints, longs,
  strings, enums, and records and arrays of only those) is one `to_json` (nulls kept) instead of an expression per
  value: on a typical record it is most of the record (`writer_renders`);
- unions: the bare value of the branch that is set (spark-avro: a nullable value, or a struct of `member<i>`);
- strings, enums, map keys: Jackson's escaping, as Python's but for the hex case of `\\u001F`-style escapes, which
  is turned to Python's lower case (`finish_json`, over the whole text, in a projection after the one that builds
  it);
- bytes and fixed: ISO-8859-1 strings; decimals: strings, Python's `str(Decimal)` (`1.000E-7` below 1e-6);
- doubles and floats (as the double fastavro gives): Python's `repr` (shortest digits that read back, `1e+16`,
  `1.5e-05`, `12345678.0`; `python_float`); NaN and infinities become `null`.

`UnsupportedSchema` names what this cannot express (a recursive type, a decimal wider than Spark's 38 digits,
a top level that is not a record, a map anywhere but in the dropped `__metadata`: spark-avro reads a map into a
Java HashMap, so its keys come out in hash order, not in the record's order as fastavro's dicts keep them); such
a schema is decoded with fastavro.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from herald.avro.convert import METADATA_FIELD

PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
NAMED = {"record", "enum", "fixed"}


class UnsupportedSchema(ValueError):
    """This schema is decoded with fastavro, not from_avro; the message says why."""


def resolve(schema: Any) -> Any:
    """The schema with named-type references replaced by their definitions (a recursive type raises)."""
    names: dict[str, Any] = {}

    def walk(node: Any, namespace: str | None, stack: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(branch, namespace, stack) for branch in node]
        if isinstance(node, str):
            if node in PRIMITIVES:
                return node
            full = node if "." in node or not namespace else f"{namespace}.{node}"
            name = full if full in names else node
            if name in stack or full in stack:
                raise UnsupportedSchema(f"recursive type {node}")
            if name not in names:
                raise UnsupportedSchema(f"unknown type {node}")
            return names[name]
        kind = node.get("type")
        if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in PRIMITIVES | NAMED
                                              | {"array", "map"}):
            return walk(kind, namespace, stack)
        if kind in NAMED:
            name = node["name"]
            space = node.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
            full = name if "." in name or not space else f"{space}.{name}"
            resolved = dict(node)
            names[full] = resolved
            if kind == "record":
                inner = stack + (full,)
                resolved["fields"] = [{**field, "type": walk(field["type"], space, inner)} for field in node["fields"]]
            return resolved
        if kind == "array":
            return {**node, "items": walk(node["items"], namespace, stack)}
        if kind == "map":
            return {**node, "values": walk(node["values"], namespace, stack)}
        if node.get("logicalType") == "decimal" and int(node.get("precision", 0)) > 38:
            raise UnsupportedSchema(f"decimal({node.get('precision')}) is wider than Spark's 38 digits")
        return node

    top = walk(schema, None, ())
    if not (isinstance(top, dict) and top.get("type") == "record"):
        raise UnsupportedSchema("the schema's top level is not a record")
    for field in top["fields"]:
        if field["name"] != METADATA_FIELD and _has_map(field["type"]):
            raise UnsupportedSchema(f"field {field['name']} holds a map: spark-avro reads maps into a HashMap, "
                                    "which loses the key order fastavro keeps")
    return top


def _has_map(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_has_map(branch) for branch in schema)
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    return kind == "map" or (kind == "array" and _has_map(schema["items"])) or (
        kind == "record" and any(_has_map(field["type"]) for field in schema["fields"]))


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    if schema.get("logicalType") == "decimal" and schema["type"] in ("bytes", "fixed"):
        return "decimal"
    return schema["type"]


def let(value: Column, body) -> Column:
    """`body(v)` with `v` bound to `value`, evaluated once: the expression tree holds `value` once, however often
    `body` uses it (a one-element `transform`)."""
    return F.element_at(F.transform(F.array(value), body), 1)


def record_json(schema: dict, record: Column) -> Column:
    """The JSON text of a top-level record (`__metadata` dropped), but for the hex case of control-character escapes
    Spark's JSON writer made: `finish_json` turns them to Python's, in a projection after this one."""
    text = _record(schema, record, top=True)
    return F.replace(F.replace(text, F.lit(_MARK + "{"), F.lit("")), F.lit("}" + _MARK), F.lit(""))


# Fields Spark's own JSON writer (`to_json`, nulls kept) renders as json.dumps does: runs of them become one
# `to_json` of a struct, much cheaper than an expression per value (no lambda over arrays, no test per string).
# Its text is put between two _MARKs, and `record_json` cuts `{<mark>` and `<mark>}` out of the whole: the run's
# fields without their braces. A raw \x01 is in no JSON text (JSON escapes control characters).
_MARK = "\x01"
_WRITER_OPTIONS = {"ignoreNullFields": "false"}
_WRITER_KINDS = {"boolean", "int", "long", "string", "enum"}


def writer_renders(schema: Any) -> bool:
    """True when Spark's JSON writer gives this value the text json.dumps gives it (escape case aside)."""
    kind = _kind(schema)
    if kind == "union":
        branches = [branch for branch in schema if _kind(branch) != "null"]
        if len(branches) == 2 and {_kind(branch) for branch in branches} == {"int", "long"}:
            return True
        return len(branches) == 1 and writer_renders(branches[0])
    if kind == "record":
        return all(writer_renders(field["type"]) for field in schema["fields"])
    if kind == "array":
        return writer_renders(schema["items"])
    return kind in _WRITER_KINDS


def _record(schema: dict, record: Column, top: bool = False) -> Column:
    fields = [field for field in schema["fields"] if not (top and field["name"] == METADATA_FIELD)]
    if not fields:
        return F.lit("{}")
    parts: list[Column] = []
    run: list[str] = []

    def end_run() -> None:
        if run:
            struct = F.struct(*[record.getField(name).alias(name) for name in run])
            parts.extend([F.lit(_MARK), F.to_json(struct, _WRITER_OPTIONS), F.lit(_MARK), F.lit(",")])
            run.clear()

    for field in fields:
        if writer_renders(field["type"]):
            run.append(field["name"])
            continue
        end_run()
        parts.append(F.lit(json.dumps(field["name"], ensure_ascii=False) + ":"))
        parts.append(value_json(field["type"], record.getField(field["name"])))
        parts.append(F.lit(","))
    end_run()
    return F.concat(F.lit("{"), *parts[:-1], F.lit("}"))


def value_json(schema: Any, value: Column) -> Column:
    """The JSON text of `value` (never null: a null value is `null`)."""
    kind = _kind(schema)
    if kind == "null":
        return F.lit("null")
    if kind == "union":
        branches = [branch for branch in schema if _kind(branch) != "null"]
        kinds = {_kind(branch) for branch in branches}
        if len(branches) == 1 or (len(branches) == 2 and kinds in ({"int", "long"}, {"float", "double"})):
            return value_json(branches[0] if len(branches) == 1 else max(branches, key=_kind), value)
        cases = None
        for index, branch in enumerate(branches):
            member = value.getField(f"member{index}")
            cases = (F.when if cases is None else cases.when)(member.isNotNull(), value_json(branch, member))
        return cases.otherwise(F.lit("null"))
    return F.coalesce(_non_null(kind, schema, value), F.lit("null"))


def _non_null(kind: str, schema: Any, value: Column) -> Column:
    """The JSON text of `value`, null when it is null."""
    if kind == "boolean":
        return F.when(value, F.lit("true")).when(~value, F.lit("false"))
    if kind in ("int", "long"):
        return value.cast("string")
    if kind in ("float", "double"):
        return python_float(value.cast("double"))
    if kind in ("string", "enum"):
        return json_string(value)
    if kind in ("bytes", "fixed"):
        return json_string(F.decode(value, "ISO-8859-1"))
    if kind == "decimal":
        return F.concat(F.lit('"'), python_decimal(value, int(schema.get("scale", 0))), F.lit('"'))
    if kind == "record":
        return F.when(value.isNotNull(), _record(schema, value))
    if kind == "array":
        items = F.transform(value, lambda item: value_json(schema["items"], item))
        return F.concat(F.lit("["), F.array_join(items, ","), F.lit("]"))
    if kind == "map":
        entries = F.transform(F.map_entries(value), lambda entry: F.concat(
            json_string(entry.getField("key")), F.lit(":"), value_json(schema["values"], entry.getField("value"))))
        return F.concat(F.lit("{"), F.array_join(entries, ","), F.lit("}"))
    raise UnsupportedSchema(f"Avro type {kind}")


# Control characters Jackson escapes with upper-case hex digits (`\u001F`), where Python writes `\u001f`.
_UPPER_HEX = (0x0B, 0x0E, 0x0F, *range(0x1A, 0x20))
_NEEDS_CASE = "[" + "".join(chr(code) for code in _UPPER_HEX) + "]"
_ESCAPED = r'[\x00-\x1f"\\]'  # (Java regex) what JSON escapes: control characters, quote, backslash


def _lower_hex(quoted: Column) -> Column:
    """Jackson's `\\u001F`-style escapes in Python's lower case."""
    for code in _UPPER_HEX:  # an escape only where an even number of backslashes precedes it
        quoted = F.regexp_replace(quoted, r"(?<!\\)((?:\\\\)*)\\u" + f"{code:04X}", "$1\\\\u" + f"{code:04x}")
    return quoted


def json_string(text: Column) -> Column:
    """A JSON string literal of `text`, escaped as Python's json.dumps(ensure_ascii=False) escapes it."""
    def quote(whole: Column) -> Column:  # '["..."]' -> '"..."'
        return whole.substr(F.lit(2), F.length(whole) - 2)

    quoted = let(F.to_json(F.array(text)), quote)
    plain = F.concat(F.lit('"'), text, F.lit('"'))  # most strings: nothing to escape, no JSON writer
    return (F.when(~text.rlike(_ESCAPED), plain)
            .when(text.rlike(_NEEDS_CASE), _lower_hex(quoted)).otherwise(quoted))


_UPPER_ESCAPE = r"\\u00(0[BEF]|1[A-F])"  # (Java regex) an escape of one of _UPPER_HEX, as Jackson writes it


def finish_json(text: Column) -> Column:
    """`record_json`'s text with Spark's escapes of control characters in Python's hex case. It uses `text` three
    times: give it a column of a projection before (Spark keeps that projection apart and computes it once)."""
    return F.when(text.contains("\\u00") & text.rlike(_UPPER_ESCAPE), _lower_hex(text)).otherwise(text)


def python_decimal(value: Column, scale: int) -> Column:
    """Python's str() of the Decimal fastavro decodes: plain, or scientific when its adjusted exponent is below
    -6 (`1.000E-7`, `0E-10`); Spark's cast to string is always plain."""
    if scale <= 6:
        return value.cast("string")

    def text(plain: Column) -> Column:
        significant = F.regexp_replace(plain, "^-?[0.]*|[.]", "")
        return let(F.when(significant == "", F.lit("0")).otherwise(significant), lambda digits: F.when(
            F.length(digits) - 1 - scale < -6,
            F.concat(F.when(plain.startswith("-"), F.lit("-")).otherwise(F.lit("")), F.substring(digits, 1, 1),
                     F.when(F.length(digits) > 1, F.concat(F.lit("."), F.substring(digits, 2, 1 << 30)))
                     .otherwise(F.lit("")), F.lit("E"), (F.length(digits) - 1 - scale).cast("string")))
            .otherwise(plain))

    return let(value.cast("string"), text)


SHORTEST = "com.fasterxml.jackson.core.io.schubfach.DoubleToDecimal"  # in jackson-core, which Spark ships
MIN_SUBNORMAL = 5e-324


def python_float(value: Column) -> Column:
    """Python's repr() of a double, `null` for NaN and infinities (JSON has neither).

    The digits are Schubfach's (jackson-core's `DoubleToDecimal`, the algorithm of JDK 19's Double.toString: the
    shortest that read back, as Python's repr); Java 17's own Double.toString is not always shortest. Java's
    layout (scientific below 1e-3 and from 1e7, `1.5E-5`) becomes Python's (scientific below 1e-4 and from 1e16,
    `1.5e-05`); the smallest subnormal is Java's `4.9E-324`, Python's `5e-324`."""
    java = F.reflect(F.lit(SHORTEST), F.lit("toString"), value)
    magnitude = F.abs(value)
    return (F.when(((magnitude >= 1e-3) & (magnitude < 1e7)) | (value == 0), java)  # Java's fixed notation
            .when(F.isnan(value) | (magnitude == float("inf")), F.lit(None).cast("string"))
            .when(magnitude == MIN_SUBNORMAL, F.when(value < 0, F.lit("-5e-324")).otherwise(F.lit("5e-324")))
            .otherwise(let(java, _python_layout)))


def _python_layout(java: Column) -> Column:
    """Java's `[-]d.dddE[-]n` as Python writes it; Java's fixed notation (1e-3 <= |x| < 1e7) is Python's."""
    def scientific(parts: Column) -> Column:  # parts: [sign, digits without the point, exponent]
        sign, digits, exponent = parts[0], parts[1], parts[2].cast("int")
        count = F.length(digits)
        fixed = (F.when(exponent < 0, F.concat(F.lit("0."), F.repeat(F.lit("0"), -exponent - 1), digits))
                 .when(count <= exponent + 1,
                       F.concat(digits, F.repeat(F.lit("0"), exponent + 1 - count), F.lit(".0")))
                 .otherwise(F.concat(F.substring(digits, 1, 1 << 30).substr(F.lit(1), exponent + 1), F.lit("."),
                                     digits.substr(exponent + 2, F.lit(1 << 30)))))
        python = F.concat(F.substring(digits, 1, 1),
                          F.when(count > 1, F.concat(F.lit("."), F.substring(digits, 2, 1 << 30)))
                          .otherwise(F.lit("")),
                          F.lit("e"), F.when(exponent < 0, F.lit("-")).otherwise(F.lit("+")),
                          F.when(F.abs(exponent) < 10, F.lit("0")).otherwise(F.lit("")),
                          F.abs(exponent).cast("string"))
        return F.concat(sign, F.when((exponent >= -4) & (exponent < 16), fixed).otherwise(python))

    # "-1.50E7" -> ["-", "15", "7"] (a mantissa's ".0" is no digit)
    parts = F.split(F.regexp_replace(java, r"^(-?)([0-9])\.?([0-9]*?)0*E(-?[0-9]+)$", "$1,$2$3,$4"), ",")
    return F.when(java.contains("E"), let(parts, scientific)).otherwise(java)
