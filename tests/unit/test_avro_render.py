"""Which Avro values Herald leaves to Spark's JSON writer (`to_json`) when it renders a from_avro record: only
those whose text equals json.dumps' (no Spark session needed to decide)."""

from __future__ import annotations

import pytest

from herald.avro.render import resolve, writer_renders

WHO = {"type": "record", "name": "Who", "fields": [{"name": "name", "type": "string"},
                                                   {"name": "age", "type": ["null", "int"]}]}


@pytest.mark.parametrize("schema, renders", [
    ("boolean", True), ("int", True), ("long", True), ("string", True),
    ({"type": "enum", "name": "E", "symbols": ["A"]}, True),
    (["null", "string"], True), (["null", "int", "long"], True), (["int", "long"], True),
    (WHO, True), (["null", WHO], True), ({"type": "array", "items": ["null", WHO]}, True),
    ({"type": "array", "items": {"type": "array", "items": "string"}}, True),
    # Java's and Python's texts differ: doubles (1.0E7), bytes (base64), decimals (numbers), unions of kinds
    ("double", False), ("float", False), (["float", "double"], False), ("bytes", False),
    ({"type": "fixed", "name": "F", "size": 2}, False),
    ({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}, False),
    (["null", "int", "string"], False), ({"type": "map", "values": "int"}, False),
    ({"type": "record", "name": "P", "fields": [{"name": "x", "type": "double"}]}, False),
    ({"type": "array", "items": {"type": "record", "name": "Q", "fields": [
        {"name": "ok", "type": "string"}, {"name": "raw", "type": "bytes"}]}}, False),
])
def test_only_values_whose_text_spark_writes_as_python_does(schema, renders):
    is_map = isinstance(schema, dict) and schema.get("type") == "map"  # resolve() refuses maps (key order)
    field = schema if is_map else resolve({"type": "record", "name": "Top", "fields": [{"name": "v", "type": schema}]})
    assert writer_renders(field if is_map else field["fields"][0]["type"]) is renders
