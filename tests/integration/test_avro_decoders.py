"""spark-avro's from_avro and fastavro give the same decoded columns (json text, schema id and version, reason)
for the same records: every Avro type and logical type, awkward values (escapes, NaN, long digit strings, tiny
decimals), records that do not decode. A real SparkSession with spark-avro's jar; no broker (the end-to-end
parity is tests/integration/test_avro_parity.py)."""

from __future__ import annotations

import decimal
import json
import random
import struct

import pytest

from herald.avro.decode import AvroSource
from herald.avro.jvm import SPARK_AVRO_CLASS, SchemaPlan, decode
from herald.avro.registry import clear_cache
from herald.avro.render import UnsupportedSchema
from tests.support.herald_env import require_jars
from tests.support.registry import SchemaRegistryServer, avro_bytes, wire_bytes

pytestmark = [pytest.mark.spark]

EVERYTHING = {
    "type": "record", "name": "Everything", "namespace": "t",
    "fields": [
        {"name": "__metadata", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "money", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "tiny", "type": {"type": "fixed", "name": "Tiny", "size": 8, "logicalType": "decimal",
                                  "precision": 18, "scale": 10}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "opt", "type": ["null", "string"], "default": None},
        {"name": "num", "type": ["null", "int", "long"], "default": None},
        {"name": "real", "type": ["float", "double"]},
        {"name": "any", "type": ["null", "int", "string", {"type": "record", "name": "P", "fields": [
            {"name": "x", "type": "double"}]}], "default": None},
        {"name": "again", "type": ["null", "P"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
        {"name": "nested", "type": {"type": "array", "items": {"type": "array", "items": "Color"}}},
        {"name": "points", "type": {"type": "array", "items": "P"}},
    ],
}

TEXT = ["", "plain", 'quote " and \\ backslash', "new\nline\ttab\r\b\f", "ctl \x00 \x01 \x0b \x1f \x7f end",
        "\\u001F literal", "zażółć 日本 🎉", "\u2028\u2029", "/slash/"]
DOUBLES = [0.0, -0.0, 1.0, -2.5, 0.1, 0.1 + 0.2, 1e16, 1.5e-5, 1e-4, 0.001, 12345678.9, 1e22, 1e23, 2.0 ** 63,
           123456789012345680.0, 5e-324, 1.7976931348623157e308, float("nan"), float("inf"), float("-inf"),
           4.0348432812821232e16, 2.404510665593078e17, 0.0020, 100.0, 1234567.0]


def record(n: int, rng: random.Random) -> dict:
    double = DOUBLES[n % len(DOUBLES)] if n < 3 * len(DOUBLES) else struct.unpack("d", rng.randbytes(8))[0]
    choice = n % 4
    return {
        "__metadata": {"trace": str(n)} if n % 2 else None,
        "b": n % 3 == 0, "i": rng.randint(-2**31, 2**31 - 1), "l": rng.randint(-2**63, 2**63 - 1),
        "f": struct.unpack("f", struct.pack("f", rng.uniform(-1e6, 1e6)))[0] if n % 5 else 1.1,
        "d": double, "s": TEXT[n % len(TEXT)], "raw": bytes([n % 256, 0, 255, 34, 92, 10, 31]),
        "fx": bytes([0, 1, 0x1f, n % 256]), "e": "GREEN" if n % 2 else "RED",
        "money": decimal.Decimal(rng.randint(-10**9, 10**9)).scaleb(-2),
        "tiny": decimal.Decimal([0, 1, 1000, 123456789, -5][n % 5]).scaleb(-10),
        "ts": 1700000000123 + n, "us": 1700000000123456, "day": 19000 + n, "id": f"00000000-0000-0000-0000-{n:012d}",
        "opt": None if n % 3 else f"o{n}", "num": [None, 7, 2**40][n % 3],
        "real": double if n % 2 else 0.5,
        "any": [None, 42, "str", {"x": double}][choice], "again": {"x": 2.5} if n % 2 else None,
        "tags": ["a", None, TEXT[n % len(TEXT)]], "nested": [["RED", "GREEN"], []] if n % 2 else [],
        "points": [{"x": double}, {"x": -1.25}],
    }


def rows_of(frame) -> list[tuple]:
    return [(r["offset"], r["json"], r["schema_id"], r["schema_version"], r["decode_error"])
            for r in frame.orderBy("offset").collect()]


def uses_from_avro(frame) -> bool:
    return "from_avro" in frame._jdf.queryExecution().executedPlan().toString()


def frame(spark, values: list[bytes | None]):
    return spark.createDataFrame([(value, n) for n, value in enumerate(values)], "value binary, offset long")


def test_a_schema_file_topic_decodes_the_same_with_both_decoders(spark):
    require_jars(spark, SPARK_AVRO_CLASS)
    rng = random.Random(7)
    values = [avro_bytes(EVERYTHING, record(n, rng)) for n in range(400)]
    values += [None, b"", b"\x02", values[0] + b"junk", values[1][:-3], bytes(rng.randbytes(40))]
    source = AvroSource(schema_json=json.dumps(EVERYTHING))
    df = frame(spark, values)
    by_jvm = decode(df, source, "spark")
    assert uses_from_avro(by_jvm) and not uses_from_avro(decode(df, source, "fastavro"))
    jvm, python = rows_of(by_jvm), rows_of(decode(df, source, "fastavro"))
    assert len(jvm) == len(python) == len(values)
    decoded = [(j, p) for j, p in zip(jvm, python) if p[4] is None]
    assert len(decoded) >= 400 and all(j == p for j, p in decoded), \
        next((j, p) for j, p in decoded if j != p)
    for j, p in zip(jvm, python):
        if p[4] is not None:  # the same rows are not delivered, for the same kind of reason
            assert j[1] is None and j[4] is not None, (j, p)
            assert j[4].split(":")[0] == p[4].split(":")[0], (j, p)
    reasons = [j[4] for j in jvm[400:]]
    assert reasons[0] == "the record has no value (a tombstone)"
    assert reasons[3] == "invalid Avro binary: 4 bytes left after the record" == python[403][4]


# Only types Spark's JSON writer renders as json.dumps does: the whole record is one to_json (render.writer_renders)
WRITER_ONLY = {
    "type": "record", "name": "Plain", "namespace": "t",
    "fields": [
        {"name": "__metadata", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "s", "type": "string"},
        {"name": "opt", "type": ["null", "string"], "default": None},
        {"name": "n", "type": ["null", "int", "long"], "default": None},
        {"name": "who", "type": ["null", {"type": "record", "name": "Who", "fields": [
            {"name": "name", "type": "string"}, {"name": "age", "type": ["null", "int"]},
            {"name": "color", "type": {"type": "enum", "name": "Hue", "symbols": ["RED", "GREEN"]}}]}]},
        {"name": "many", "type": {"type": "array", "items": ["null", "Who"]}},
        {"name": "words", "type": {"type": "array", "items": {"type": "array", "items": ["null", "string"]}}},
        {"name": "flag", "type": "boolean"},
    ],
}


def test_a_record_spark_writes_in_one_piece_keeps_nulls_order_and_escapes(spark):
    require_jars(spark, SPARK_AVRO_CLASS)
    rng = random.Random(3)

    def plain(n: int) -> dict:
        who = {"name": TEXT[(n + 3) % len(TEXT)], "age": None if n % 2 else n, "color": "GREEN" if n % 3 else "RED"}
        return {"__metadata": {"k": "v"} if n % 2 else None, "s": TEXT[n % len(TEXT)],
                "opt": None if n % 3 else TEXT[(n + 1) % len(TEXT)], "n": [None, -7, 2 ** 40][n % 3],
                "who": None if n % 4 == 0 else who, "many": [who, None, who] if n % 2 else [],
                "words": [[TEXT[(n + 5) % len(TEXT)], None], []], "flag": bool(rng.getrandbits(1))}

    values = [avro_bytes(WRITER_ONLY, plain(n)) for n in range(120)]
    source = AvroSource(schema_json=json.dumps(WRITER_ONLY))
    df = frame(spark, values)
    by_jvm = decode(df, source, "spark")
    plan = by_jvm._jdf.queryExecution().optimizedPlan().toString()
    assert uses_from_avro(by_jvm) and "StructsToJson" in plan and "transform(" not in plan  # no lambda per value
    jvm, python = rows_of(by_jvm), rows_of(decode(df, source, "fastavro"))
    assert all(p[4] is None for p in python) and len(jvm) == 120
    assert jvm == python, next((j, p) for j, p in zip(jvm, python) if j != p)
    assert any("\\u001f" in p[1] for p in python) and any('"opt":null' in p[1] for p in python)


def test_the_wire_format_decodes_each_schema_id_with_its_own_schema(spark):
    require_jars(spark, SPARK_AVRO_CLASS)
    clear_cache()
    rng = random.Random(11)
    v2 = {**EVERYTHING, "fields": EVERYTHING["fields"] + [{"name": "extra", "type": "int", "default": 0}]}
    recursive = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}]}
    with SchemaRegistryServer() as registry:
        first = registry.register("t-value", EVERYTHING)
        second = registry.register("t-value", v2)
        elsewhere = registry.register("other-value", EVERYTHING | {"name": "Other"})
        nodes = registry.register("t-value", recursive)  # from_avro cannot: fastavro decodes its records
        values = [wire_bytes(first, EVERYTHING, record(n, rng)) for n in range(100)]
        values += [wire_bytes(second, v2, {**record(n, rng), "extra": n}) for n in range(100)]
        values += [wire_bytes(elsewhere, EVERYTHING | {"name": "Other"}, record(n, rng)) for n in range(10)]
        values += [wire_bytes(nodes, recursive, {"v": 1, "next": {"v": 2, "next": None}})]
        values += [None, b"", b"\x00\x00", b"\x01abcdef", wire_bytes(99, EVERYTHING, record(0, rng)),
                   wire_bytes(first, EVERYTHING, record(0, rng)) + b"x", b"\x00" + first.to_bytes(4, "big") + b"\x02"]
        source = AvroSource(registry_url=registry.url, subject="t-value")
        df = frame(spark, values)
        by_jvm = decode(df, source, "spark")
        assert uses_from_avro(by_jvm)
        jvm, python = rows_of(by_jvm), rows_of(decode(df, source, "fastavro"))
    assert len(jvm) == len(python) == len(values)
    for j, p in zip(jvm, python):
        if p[4] is None or not p[4].startswith("invalid Avro binary") or "bytes left" in p[4]:
            assert j == p
        else:
            assert j[:4] == p[:4] and j[4].startswith("invalid Avro binary"), (j, p)
    assert {p[2] for p in python if p[4] is None} == {first, second, elsewhere, nodes}
    assert "schema id 99: " in python[-3][4] and "not found" in python[-3][4]


def test_what_from_avro_cannot_take_is_named():
    recursive = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    with pytest.raises(UnsupportedSchema, match="recursive type Node"):
        SchemaPlan.of(json.dumps(recursive))
    wide = {"type": "record", "name": "W", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}}]}
    with pytest.raises(UnsupportedSchema, match="38 digits"):
        SchemaPlan.of(json.dumps(wide))
    mapped = {"type": "record", "name": "M", "fields": [{"name": "m", "type": {"type": "map", "values": "int"}}]}
    with pytest.raises(UnsupportedSchema, match="key order"):
        SchemaPlan.of(json.dumps(mapped))
    with pytest.raises(UnsupportedSchema, match="not a record"):
        SchemaPlan.of(json.dumps({"type": "array", "items": "int"}))
