"""Encoding JSON documents as an AVRO topic's records (for `herald publish`).

With a schemaFile the record is plain Avro binary; with a registry it is Confluent's wire format with the
subject's latest schema id. Unions take plain values (no {"type": value} wrappers), as Herald delivers them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import fastavro
from fastavro.validation import validate

from herald.avro.decode import AvroSource
from herald.avro.registry import RegistryClient


def avro_encoder(source: AvroSource) -> Callable[[Any], bytes]:
    """A function from a JSON document to the topic's record bytes; ValueError when it does not fit the schema."""
    if source.schema_json is not None:
        schema_id, schema_text = None, source.schema_json
    else:
        schema_id, _, schema_text = RegistryClient(source.registry_url).latest(source.subject)
    schema = fastavro.parse_schema(json.loads(schema_text))
    prefix = b"" if schema_id is None else b"\x00" + schema_id.to_bytes(4, "big")

    def encode(document: Any) -> bytes:
        try:
            validate(document, schema, raise_errors=True)
        except Exception as error:  # noqa: BLE001 - fastavro's ValidationError and friends
            raise ValueError(" ".join(f"does not fit the topic's Avro schema: {error}".split())[:500]) from None
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, schema, document)
        return prefix + buffer.getvalue()

    return encode
