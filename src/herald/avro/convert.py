"""Avro values as plain JSON, the way Hermes delivers an Avro topic to a JSON subscription.

fastavro decodes records to dicts, unions to their bare value and enums to their symbol; on top of that:

- the top-level `__metadata` field (Hermes' envelope) is dropped;
- bytes and fixed become strings with one character per byte (ISO-8859-1), Avro's own JSON encoding;
- decimals become plain decimal strings ("12.30"); other logical types stay as their Avro value (a
  timestamp-millis is its long, a date its int), because `plain_schema` keeps only `decimal`;
- non-finite floats (NaN, Infinity), which JSON cannot hold, become null.
"""

from __future__ import annotations

import decimal
import json
import math
from typing import Any

METADATA_FIELD = "__metadata"


def plain_schema(schema: Any) -> Any:
    """The schema with every logicalType but `decimal` removed (so fastavro returns the raw Avro values)."""
    if isinstance(schema, list):
        return [plain_schema(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    result = {}
    for key, value in schema.items():
        if key == "logicalType" and value != "decimal":
            continue
        if key in ("type", "items", "values"):
            result[key] = plain_schema(value)
        elif key == "fields":
            result[key] = [{**field, "type": plain_schema(field["type"])} for field in value]
        else:
            result[key] = value
    return result


def plain_value(value: Any) -> Any:
    """A decoded Avro value as JSON-ready Python values."""
    if isinstance(value, dict):
        return {key: plain_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_value(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json_default(value: Any) -> Any:
    """Called by json.dumps only for what JSON has no type for: bytes/fixed and decimals."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not an Avro value")


def to_json(record: dict) -> str:
    """A decoded top-level record as compact JSON text, without Hermes' `__metadata` field.

    json.dumps converts bytes and decimals as it meets them (no walk over the record first); only a record
    holding a non-finite float, which JSON cannot hold, takes the slower walk that turns it into null.
    """
    if METADATA_FIELD in record:
        record = {key: value for key, value in record.items() if key != METADATA_FIELD}
    try:
        return json.dumps(record, default=_json_default, **_COMPACT)
    except ValueError:  # NaN or Infinity somewhere
        return json.dumps(plain_value(record), **_COMPACT)


_COMPACT = {"ensure_ascii": False, "separators": (",", ":"), "allow_nan": False}
