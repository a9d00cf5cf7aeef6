"""Decoding an AVRO topic's records with spark-avro's `from_avro` in the JVM, fastavro where it cannot.

`decode(raw, source, setting)` gives the Kafka rows with the columns of `herald.avro.decode.DECODED_FIELDS`
(json, schema_id, schema_version, decode_error), whichever decoder runs, with the same values (the JSON text is
built by `herald.avro.render` to equal `herald.avro.convert.to_json`'s; tests/integration/test_avro_parity.py).

- herald.yaml `avro.decoder`: `auto` (from_avro where spark-avro's classes load), `spark`, `fastavro`. The choice
  is logged once: `avro decoder: ...`.
- A schema file: one `from_avro` over the value.
- Confluent's wire format: the id is cut from bytes 2-5 and the payload from byte 6 in the JVM. The driver
  knows the ids of the subject's versions (listed at most every `SUBJECT_TTL_S`) and of every id it met before,
  with their schemas and versions (`herald.avro.registry`, cached per process); each such id gets one
  `from_avro`, evaluated only for its rows (`when(id = k, ...)`), in one projection over the data. A record
  whose id the driver does not know (another subject's, registered since the listing, or one the registry
  could not give the driver) or whose schema `from_avro` cannot take (`render.UnsupportedSchema`) is decoded by
  fastavro in an Arrow UDF that sees only those records' values (null for the others), so nothing is read
  twice. That UDF raises when the registry cannot answer (`herald.avro.decode`): the round fails, nothing is
  discarded.
- A record that does not decode: `from_avro` runs PERMISSIVE and reads with a reader schema that adds one field
  with a default (`OK_FIELD`), which is null only when the record did not decode; re-encoding the record
  (`to_avro`) finds bytes left after it. The reasons are fastavro's: a tombstone, not the wire format, an id
  the registry does not know (its answer), `invalid Avro binary: ...`, `... bytes left after the record`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from herald.avro.convert import plain_schema
from herald.avro.decode import DECODED_FIELDS, AvroSource, decode_batches
from herald.avro.registry import RegistryClient, SchemaRegistryError
from herald.avro.render import UnsupportedSchema, finish_json, record_json, resolve

log = logging.getLogger(__name__)

SPARK_AVRO_CLASS = "org.apache.spark.sql.avro.AvroDataToCatalyst"
OK_FIELD = "__herald_decoded"
SUBJECT_TTL_S = 30.0
SUBJECT_RETRY_S = 5.0  # after a listing (or a schema of it) the registry could not give
TOMBSTONE = "the record has no value (a tombstone)"
INVALID = "invalid Avro binary: spark-avro could not read the record with its schema"
_DECODED = "__herald_avro"
_STRAY = "__herald_stray"

_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()


def choose_decoder(spark, setting: str) -> str:
    """'spark' or 'fastavro' for herald.yaml's avro.decoder; the first choice of a process is logged."""
    from herald.session import jvm_class_loads

    if setting not in ("auto", "spark", "fastavro"):
        raise ValueError(f"avro.decoder must be auto, spark or fastavro, not {setting!r}")
    loads = setting != "fastavro" and jvm_class_loads(spark, SPARK_AVRO_CLASS)
    if setting == "spark" and not loads:
        raise RuntimeError("avro.decoder is 'spark' but spark-avro is not on Spark's classpath (add "
                           "org.apache.spark:spark-avro_2.13 to spark.jars.packages, or use 'auto')")
    chosen = "spark" if loads else "fastavro"
    with _lock:
        first = (setting, chosen) not in _logged
        _logged.add((setting, chosen))
    if first:
        log.info("avro decoder: %s", "spark-avro's from_avro (JVM)" if chosen == "spark"
                 else "fastavro (Python, over Arrow batches)")
    return chosen


def decode(raw, source: AvroSource, setting: str = "auto"):
    """`raw` (Kafka rows) with DECODED_FIELDS appended, by the decoder `setting` picks."""
    if choose_decoder(raw.sparkSession, setting) == "fastavro":
        return fastavro_decode(raw, source)
    try:
        if source.registry_url is None:
            try:
                plan = SchemaPlan.of(source.schema_json)
            except UnsupportedSchema as reason:
                log.info("avro decoder: fastavro for this schema file (%s)", reason)
                return fastavro_decode(raw, source)
            return _schema_file(raw, plan)
        return _wire_format(raw, source)
    except Exception as error:  # noqa: BLE001 - Spark refused the plan (a schema from_avro cannot convert, ...)
        log.warning("avro decoder: fastavro for this round, Spark refused the from_avro plan: %s",
                    " ".join(str(error).split())[:500])
        return fastavro_decode(raw, source)


def fastavro_decode(raw, source: AvroSource):
    """The Python decoder: fastavro over Arrow batches (`herald.avro.decode.decode_batches`)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    schema = StructType(raw.schema.fields + [StructField(f.name, from_arrow_type(f.type)) for f in DECODED_FIELDS])
    return raw.mapInArrow(decode_batches(source), schema)


@dataclass(frozen=True)
class SchemaPlan:
    """One writer schema, as from_avro reads it (logical types but decimal removed, as fastavro's path does)."""

    writer: str  # the plain schema's JSON: from_avro's jsonFormatSchema, and to_avro's
    reader: str  # the same with OK_FIELD added: from_avro's avroSchema option
    resolved: dict  # for herald.avro.render

    @classmethod
    def of(cls, schema_json: str) -> SchemaPlan:
        plain = plain_schema(json.loads(schema_json))
        resolved = resolve(plain)
        if any(field["name"] == OK_FIELD for field in resolved["fields"]):
            raise UnsupportedSchema(f"a field is named {OK_FIELD}")
        reader = {**plain, "fields": [*plain["fields"], {"name": OK_FIELD, "type": "boolean", "default": True}]}
        return cls(json.dumps(plain), json.dumps(reader), resolved)

    def from_avro(self, payload: Column) -> Column:
        from pyspark.sql.avro.functions import from_avro

        return from_avro(payload, self.writer, {"avroSchema": self.reader, "mode": "PERMISSIVE"})

    def error(self, decoded: Column, payload: Column) -> Column:
        """Why the record in `decoded` (this plan's from_avro of `payload`) is not delivered, or null."""
        from pyspark.sql.avro.functions import to_avro

        left = F.length(payload) - F.length(to_avro(decoded.dropFields(OK_FIELD), self.writer))
        return (F.when(decoded.getField(OK_FIELD).isNull(), F.lit(INVALID))
                .when(left != 0, F.format_string("invalid Avro binary: %d bytes left after the record", left)))

    def json(self, decoded: str) -> Column:
        """The JSON text of the record in column `decoded`; built once per schema, column and Spark application
        (hundreds of py4j calls for a large schema), then reused by every round."""
        from pyspark import SparkContext

        key = (self.writer, decoded, SparkContext._active_spark_context.applicationId)
        with _lock:
            built = _json_columns.get(key)
        if built is None:
            built = record_json(self.resolved, F.col(decoded))
            with _lock:
                _json_columns[key] = built
        return built


_json_columns: dict[tuple[str, str, str], Column] = {}


def _schema_file(raw, plan: SchemaPlan):
    columns = raw.columns
    value = F.col("value")
    staged = raw.select(*columns, plan.from_avro(value).alias(_DECODED))  # its own projection: decoded once
    decoded = F.col(_DECODED)
    error = F.when(value.isNull(), F.lit(TOMBSTONE)).otherwise(plan.error(decoded, value))
    errors = staged.select(*columns, _DECODED, error.alias("decode_error"))
    ok = F.col("decode_error").isNull()
    return _finished(errors.select(*columns, F.when(ok, plan.json(_DECODED)).alias("json"),
                                   F.lit(None).cast("int").alias("schema_id"),
                                   F.lit(None).cast("int").alias("schema_version"), "decode_error"))


def _finished(decoded):
    """`decoded` with its json text finished (`render.finish_json`), in a projection of its own."""
    return decoded.select(*[finish_json(F.col(name)).alias(name) if name == "json" else name
                            for name in decoded.columns])


@dataclass(frozen=True)
class KnownId:
    plan: SchemaPlan | None  # None: decoded by fastavro (its schema is not one from_avro takes)
    version: int | None


class RegistryPlans:
    """The driver's view of a registry subject's schema ids, shared by the rounds of a process. An id it could not
    learn (the registry did not answer) is not kept: its records go to fastavro on the executors, which ask the
    registry themselves (and fail the round if it still cannot answer), and the subject is listed again after
    `SUBJECT_RETRY_S` rather than `SUBJECT_TTL_S`. `clock`: monotonic seconds."""

    def __init__(self, source: AvroSource, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.client = RegistryClient(source.registry_url)
        self.known: dict[int, KnownId] = {}
        self._clock = clock
        self._next_listing = float("-inf")

    def current(self) -> dict[int, KnownId]:
        if self.source.subject and self._clock() >= self._next_listing:
            complete = True
            try:
                listed = self.client.subject_ids(self.source.subject)
            except SchemaRegistryError as error:
                log.warning("schema registry: the versions of %s could not be listed (%s); records with ids "
                            "not seen before are decoded by fastavro", self.source.subject, error)
                listed, complete = {}, False
            for schema_id in listed:
                if schema_id not in self.known:
                    learnt = self._learn(schema_id)
                    if learnt is None:
                        complete = False
                    else:
                        self.known[schema_id] = learnt
            self._next_listing = self._clock() + (SUBJECT_TTL_S if complete else SUBJECT_RETRY_S)
        return dict(self.known)

    def _learn(self, schema_id: int) -> KnownId | None:
        """The plan of `schema_id`, or None when the registry could not give its schema or version (logged)."""
        try:
            text = self.client.schema(schema_id)
            version = self.client.version(schema_id, self.source.subject) if self.source.subject else None
        except SchemaRegistryError as error:
            log.warning("schema registry: schema id %d of %s could not be fetched (%s); its records are decoded "
                        "by fastavro", schema_id, self.source.subject, error)
            return None
        try:
            return KnownId(SchemaPlan.of(text), version)
        except UnsupportedSchema as reason:
            log.info("avro decoder: fastavro for schema id %d (%s)", schema_id, reason)
            return KnownId(None, version)


_registries: dict[tuple[str, str | None], RegistryPlans] = {}


def _registry_plans(source: AvroSource) -> RegistryPlans:
    with _lock:
        return _registries.setdefault((source.registry_url, source.subject), RegistryPlans(source))


def _wire_format(raw, source: AvroSource):
    known = _registry_plans(source).current()
    plans = {schema_id: entry.plan for schema_id, entry in known.items() if entry.plan is not None}
    columns = raw.columns
    value = F.col("value")
    wire = value.isNotNull() & (F.length(value) >= 5) & (F.substring(value, 1, 1) == F.lit(b"\x00"))
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    payload = value.substr(F.lit(6), F.lit(1 << 30))
    stray = wire & ~schema_id.isin(list(plans)) if plans else wire
    staged = raw.select(
        *columns, F.when(wire, schema_id).alias("__herald_id"),
        *[F.when(wire & (schema_id == k), plan.from_avro(payload)).alias(f"{_DECODED}{k}")
          for k, plan in plans.items()],
        _fallback(source)(F.when(stray, value)).alias(_STRAY))
    the_id = F.col("__herald_id")
    error = (F.when(value.isNull(), F.lit(TOMBSTONE))
             .when(~wire, F.format_string("not in the schema registry's wire format (first byte %s, %d bytes)",
                                          F.when(F.length(value) == 0, F.lit("none"))
                                          .otherwise(F.lower(F.hex(F.substring(value, 1, 1)))), F.length(value))))
    for k, plan in plans.items():
        error = error.when(the_id == k, plan.error(F.col(f"{_DECODED}{k}"), payload))
    error = error.otherwise(F.col(_STRAY).getField("decode_error"))
    errors = staged.select(*columns, *staged.columns[len(columns):], error.alias("decode_error"))
    ok = F.col("decode_error").isNull()
    text = F.col(_STRAY).getField("json")
    version = F.col(_STRAY).getField("schema_version")
    if plans:
        cases = None
        for k, plan in plans.items():
            branch = plan.json(f"{_DECODED}{k}")
            cases = (F.when if cases is None else cases.when)(ok & (the_id == k), branch)
        text = cases.otherwise(F.col(_STRAY).getField("json"))
        versions = None
        for k, entry in known.items():
            if entry.plan is not None:
                versions = (F.when if versions is None else versions.when)(the_id == k, F.lit(entry.version))
        version = versions.otherwise(F.col(_STRAY).getField("schema_version"))
    return _finished(errors.select(*columns, text.alias("json"), F.when(ok, the_id).try_cast("int").alias("schema_id"),
                                   F.when(ok, version).try_cast("int").alias("schema_version"), "decode_error"))


def _fallback(source: AvroSource):
    """An Arrow UDF decoding with fastavro the values it is given (null: not its record, null out)."""
    import pyarrow as pa
    from pyspark.sql.functions import arrow_udf

    fields = pa.struct(DECODED_FIELDS)

    def run(values: pa.Array) -> pa.Array:
        from herald.avro.decode import DecodeError

        decoder = None
        rows = []
        for value in values.to_pylist():
            if value is None:
                rows.append(None)
                continue
            decoder = decoder or source.decoder()
            try:
                decoded = decoder.decode(value)
                rows.append({"json": decoded.json, "schema_id": decoded.schema_id,
                             "schema_version": decoded.schema_version, "decode_error": None})
            except DecodeError as error:
                rows.append({"json": None, "schema_id": None, "schema_version": None, "decode_error": str(error)})
        return pa.array(rows, fields)

    run.__annotations__ = {"values": pa.Array, "return": pa.Array}  # not strings: Spark reads the UDF's kind here
    return arrow_udf(run, "json string, schema_id int, schema_version int, decode_error string")
