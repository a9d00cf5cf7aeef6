"""Decoding an AVRO topic's records, once each, vectorised over Arrow batches (runs in Spark tasks).

Two encodings, as the topic declares:

- `schemaFile`: every record is plain Avro binary written with that schema;
- a schema registry: records are in Confluent's wire format, a 0 byte, a 4-byte big-endian schema id, then
  Avro binary written with that (writer) schema. Records written with an older registered schema decode with
  their own schema, so schema evolution needs nothing more.

Each record becomes: `json` (the record as plain JSON, see `herald.avro.convert`), `schema_id` /
`schema_version` (for the Schema-Id / Schema-Version headers), or `decode_error` saying why it could not be
decoded (such a record is not delivered: it goes to the undelivered table, and the subscription carries on).
A record cannot be decoded when its bytes do not decode, or when the registry says its schema id does not exist;
a registry that cannot answer (down, 5xx, 429, credentials refused: `herald.avro.registry`) raises its
`SchemaRegistryError` instead, naming the schema id, which fails the Spark task and so the round: the position
stays and the round is run again later, with backoff.
What an AVRO subscription receives, the Avro binary without the wire-format prefix, is cut from the value in
the JVM (`AvroSource.payload_sql`), so the bytes do not travel through Python twice.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

import fastavro
import pyarrow as pa

from herald.avro.convert import plain_schema, to_json
from herald.avro.registry import RegistryClient, SchemaRegistryError, UnknownSchemaError

WIRE_MAGIC = 0

DECODED_FIELDS = [
    pa.field("json", pa.string()),
    pa.field("schema_id", pa.int32()),
    pa.field("schema_version", pa.int32()),
    pa.field("decode_error", pa.string()),
]


class DecodeError(ValueError):
    """This record cannot be decoded; the message says why."""


@dataclass(frozen=True)
class Decoded:
    json: str
    schema_id: int | None = None
    schema_version: int | None = None


@dataclass(frozen=True)
class AvroSource:
    """How a topic's records are encoded (plain, picklable): a schema's JSON text, or a registry and subject."""

    schema_json: str | None = None
    registry_url: str | None = None
    subject: str | None = None

    @property
    def payload_sql(self) -> str:
        """Spark SQL for the plain Avro binary of the `value` column (wire format: skip magic byte and id)."""
        return "value" if self.registry_url is None else "substring(value, 6)"

    def decoder(self) -> AvroDecoder:
        return AvroDecoder(self)


class AvroDecoder:
    """Decodes records of one topic; parsed schemas are kept for the life of the decoder."""

    def __init__(self, source: AvroSource) -> None:
        self.source = source
        self._registry = RegistryClient(source.registry_url) if source.registry_url else None
        self._schemas: dict[int | None, object] = {}
        if source.schema_json is not None:
            self._schemas[None] = _parse(source.schema_json)

    def decode(self, value: bytes | None) -> Decoded:
        if value is None:
            raise DecodeError("the record has no value (a tombstone)")
        if self._registry is None:
            return Decoded(self._to_json(self._schemas[None], value))
        if len(value) < 5 or value[0] != WIRE_MAGIC:
            raise DecodeError(f"not in the schema registry's wire format (first byte {value[:1].hex() or 'none'}, "
                              f"{len(value)} bytes)")
        schema_id = int.from_bytes(value[1:5], "big")
        payload = value[5:]
        try:
            schema = self._schemas.get(schema_id) or self._schemas.setdefault(
                schema_id, _parse(self._registry.schema(schema_id)))
            version = self._registry.version(schema_id, self.source.subject) if self.source.subject else None
        except UnknownSchemaError as error:
            raise DecodeError(f"schema id {schema_id}: {error}") from None
        except SchemaRegistryError as error:  # the registry could not say: the round fails, nothing is discarded
            raise type(error)(f"schema id {schema_id}: {error}") from None
        return Decoded(self._to_json(schema, payload), schema_id, version)

    @staticmethod
    def _to_json(schema, payload: bytes) -> str:
        stream = io.BytesIO(payload)
        try:
            record = fastavro.schemaless_reader(stream, schema)
        except Exception as error:  # noqa: BLE001 - fastavro raises many kinds for bad bytes
            raise DecodeError(f"invalid Avro binary: {type(error).__name__}: {error}"[:300]) from None
        if stream.tell() != len(payload):
            raise DecodeError(f"invalid Avro binary: {len(payload) - stream.tell()} bytes left after the record")
        if not isinstance(record, dict):
            raise DecodeError("the schema's top level is not a record")
        return to_json(record)


def _parse(schema_json: str):
    return fastavro.parse_schema(plain_schema(json.loads(schema_json)))


def decode_batches(source: AvroSource):
    """The `mapInArrow` function: each Kafka batch with the DECODED_FIELDS appended."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = source.decoder()
        for batch in batches:
            rows = []
            for value in batch.column("value").to_pylist():
                try:
                    decoded = decoder.decode(value)
                    rows.append((decoded.json, decoded.schema_id, decoded.schema_version, None))
                except DecodeError as error:
                    rows.append((None, None, None, str(error)))
            columns = [pa.array(list(column), field.type) for column, field in zip(zip(*rows), DECODED_FIELDS)] \
                if rows else [pa.array([], field.type) for field in DECODED_FIELDS]
            yield pa.RecordBatch.from_arrays(batch.columns + columns, schema=_with_decoded(batch.schema))

    return run


def _with_decoded(schema: pa.Schema) -> pa.Schema:
    for field in DECODED_FIELDS:
        schema = schema.append(field)
    return schema
