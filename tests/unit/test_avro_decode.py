"""Avro -> plain JSON, and decoding plain and wire-format records (a local registry server, no Spark)."""

from __future__ import annotations

import decimal
import json

import pyarrow as pa
import pytest

from herald.avro.decode import AvroSource, DecodeError, decode_batches
from herald.avro.registry import clear_cache
from tests.support.registry import SchemaRegistryServer, avro_bytes, wire_bytes

USER_V1 = {
    "type": "record", "name": "User", "namespace": "shop",
    "fields": [
        {"name": "__metadata", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "name", "type": ["null", "string"]},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["NEW", "VIP"]}},
        {"name": "seen", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}},
        {"name": "tag", "type": "bytes"},
        {"name": "score", "type": "double"},
        {"name": "addresses", "type": {"type": "array", "items": {
            "type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]}}},
    ],
}
USER_V2 = {**USER_V1, "fields": USER_V1["fields"] + [{"name": "tier", "type": "int", "default": 0}]}
RECORD = {"__metadata": {"trace": "t1"}, "name": "ann", "kind": "VIP", "seen": 1700000000123,
          "price": decimal.Decimal("12.30"), "tag": b"\x00\xff", "score": 1.0,
          "addresses": [{"city": "Krakow"}, {"city": "Berlin"}]}


def test_plain_json_has_no_union_wrappers_no_metadata_and_raw_logical_values():
    decoded = AvroSource(schema_json=json.dumps(USER_V1)).decoder().decode(avro_bytes(USER_V1, RECORD))
    assert json.loads(decoded.json) == {"name": "ann", "kind": "VIP", "seen": 1700000000123, "price": "12.30",
                                        "tag": "\u0000\u00ff", "score": 1.0,
                                        "addresses": [{"city": "Krakow"}, {"city": "Berlin"}]}
    assert decoded.schema_id is None and decoded.schema_version is None


def test_non_finite_doubles_become_null():
    decoded = AvroSource(schema_json=json.dumps(USER_V1)).decoder().decode(
        avro_bytes(USER_V1, {**RECORD, "score": float("nan")}))
    assert json.loads(decoded.json)["score"] is None


@pytest.mark.parametrize("value, reason", [
    (b"\x02", "invalid Avro binary"),
    (avro_bytes(USER_V1, RECORD) + b"junk", "bytes left after the record"),
    (None, "no value"),
])
def test_undecodable_plain_records_say_why(value, reason):
    with pytest.raises(DecodeError, match=reason):
        AvroSource(schema_json=json.dumps(USER_V1)).decoder().decode(value)


def test_wire_format_with_schema_evolution_ids_and_versions():
    clear_cache()
    with SchemaRegistryServer() as registry:
        v1 = registry.register("shop.users-value", USER_V1)
        v2 = registry.register("shop.users-value", USER_V2)
        decoder = AvroSource(registry_url=registry.url, subject="shop.users-value").decoder()
        old = decoder.decode(wire_bytes(v1, USER_V1, RECORD))
        new = decoder.decode(wire_bytes(v2, USER_V2, {**RECORD, "tier": 3}))
        assert (old.schema_id, old.schema_version, new.schema_id, new.schema_version) == (v1, 1, v2, 2)
        assert "tier" not in json.loads(old.json) and json.loads(new.json)["tier"] == 3
        with pytest.raises(DecodeError, match="schema id 99: .*not found"):
            decoder.decode(wire_bytes(99, USER_V1, RECORD))
        with pytest.raises(DecodeError, match="not in the schema registry's wire format"):
            decoder.decode(avro_bytes(USER_V1, RECORD))
        for _ in range(20):
            decoder.decode(wire_bytes(v1, USER_V1, RECORD))
        assert registry.calls[f"GET /schemas/ids/{v1}"] == 1, "one registry call per schema id"


def test_decode_batches_appends_columns_and_keeps_every_row():
    source = AvroSource(schema_json=json.dumps(USER_V1))
    batch = pa.RecordBatch.from_pydict({"value": [avro_bytes(USER_V1, RECORD), b"\x02", None],
                                        "offset": [0, 1, 2]})
    [out] = list(decode_batches(source)([batch]))
    assert out.num_rows == 3 and out.column("offset").to_pylist() == [0, 1, 2]
    assert json.loads(out.column("json")[0].as_py())["name"] == "ann"
    errors = out.column("decode_error").to_pylist()
    assert errors[0] is None and "invalid Avro binary" in errors[1] and "no value" in errors[2]
