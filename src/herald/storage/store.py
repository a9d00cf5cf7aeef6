"""Writing and reading Herald's Delta tables, one slice per (writer, round), replaced whole on a replay.

A round (a micro-batch of a topic's shared query, a catch-up read, a batch of parked retries) writes its rows
of each table as one `Slice`: one atomic commit that replaces whatever that slice held before. A micro-batch
replayed after a crash therefore leaves the tables as if it had run once, whatever it wrote the first time.
Both back-ends do the same: delta-rs with `predicate` overwrite, delta-spark with `replaceWhere`.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from herald.storage.tables import SCHEMAS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slice:
    """The rows `writer` wrote in its round `batch_id`: every table row carries both."""

    writer: str
    batch_id: int

    @property
    def predicate(self) -> str:
        return f"writer = '{_sql_text(self.writer)}' AND batch_id = {int(self.batch_id)}"


@dataclass(frozen=True)
class Slices:
    """Several rounds' slices replaced in one commit (the table writer merges the rounds waiting for it)."""

    parts: tuple[Slice, ...]

    @property
    def predicate(self) -> str:
        return " OR ".join(f"({part.predicate})" for part in self.parts)

    def __str__(self) -> str:
        return f"{len(self.parts)} rounds ({self.parts[0]} .. {self.parts[-1]})"


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


def table_root(storage_path: str) -> str:
    return f"{storage_path.rstrip('/')}/tables"


class TableStore(ABC):
    """Herald's tables under `<storage path>/tables/<name>`."""

    def __init__(self, storage_path: str) -> None:
        self.root = table_root(storage_path)

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    @abstractmethod
    def replace(self, table: str, rows: pa.Table, part: Slice | Slices) -> None:
        """Make `table`'s rows of `part` (one round's slice, or several) exactly `rows` (which must all carry
        their slice's writer and batch_id), in one commit."""

    def read(self, table: str, subscription_id: str | None = None) -> pa.Table:
        """Rows of `table` (all, or one subscription's), read with delta-rs; empty if the table does not exist."""
        return DeltaRsStore.read_table(self.path(table), table, subscription_id, self.storage_options())

    def latest(self, table: str, keys: tuple[str, ...], newest_first: str) -> pa.Table:
        """The newest row (by the SQL ordering `newest_first`) of each distinct `keys` of `table`."""
        keys_sql = ", ".join(keys)
        return self.sql(table, f"SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {keys_sql} "
                               f"ORDER BY {newest_first}) AS herald_rank FROM {table}) WHERE herald_rank = 1")

    def sql(self, table: str, query: str) -> pa.Table:
        """Run a SQL query over `table` (named as itself), with delta-rs; no rows if the table does not exist."""
        return DeltaRsStore.query_table(self.path(table), table, query, self.storage_options())

    def storage_options(self) -> dict[str, str] | None:
        return None

    @abstractmethod
    def maintain(self, table: str, retention_hours: float) -> TableUpkeep:
        """Compact `table`'s small files and delete the files no version younger than `retention_hours` needs."""


@dataclass(frozen=True)
class TableUpkeep:
    """What one maintenance pass did to a table: files compacted away and written, files deleted, and the
    table's data files before and after (None where the engine does not say)."""

    table: str
    files_removed: int
    files_added: int
    files_deleted: int
    files_before: int | None = None
    files_after: int | None = None


def _conform(table: str, rows: pa.Table) -> pa.Table:
    schema = SCHEMAS[table]
    return rows if rows.schema == schema else rows.select(schema.names).cast(schema)


class DeltaRsStore(TableStore):
    """delta-rs (`deltalake`): writes Arrow from the driver, no Spark needed.

    Tables are created (or given the columns a newer Herald added) once per process under a lock; a commit that
    loses a race with another process is retried.
    """

    _lock = threading.Lock()
    _ready: set[str] = set()

    def __init__(self, storage_path: str, storage_options: dict[str, str] | None = None) -> None:
        super().__init__(storage_path)
        self._options = storage_options or None

    def storage_options(self) -> dict[str, str] | None:
        return self._options

    def _ensure(self, table: str) -> None:
        from deltalake import DeltaTable, Field

        path = self.path(table)
        with self._lock:
            if path in self._ready:
                return
            if not DeltaTable.is_deltatable(path, storage_options=self._options):
                DeltaTable.create(path, SCHEMAS[table], mode="ignore", storage_options=self._options)
            current = DeltaTable(path, storage_options=self._options)
            known = {field.name for field in current.schema().fields}
            missing = [field for field in SCHEMAS[table] if field.name not in known]
            if missing:
                log.info("%s: adding columns %s", table, ", ".join(field.name for field in missing))
                current.alter.add_columns([Field.from_arrow(field) for field in missing])
            self._ready.add(path)

    def replace(self, table: str, rows: pa.Table, part: Slice | Slices) -> None:
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import CommitFailedError

        self._ensure(table)
        rows = _conform(table, rows)

        @retry(retry=retry_if_exception_type(CommitFailedError), stop=stop_after_attempt(8),
               wait=wait_random_exponential(multiplier=0.05, max=2), reraise=True)
        def commit() -> None:
            write_deltalake(DeltaTable(self.path(table), storage_options=self._options), rows, mode="overwrite",
                            predicate=part.predicate, storage_options=self._options)

        commit()

    def maintain(self, table: str, retention_hours: float) -> TableUpkeep:
        """delta-rs `optimize.compact()` then `vacuum()`; the retention may be shorter than Delta's 7-day default
        (nothing reads old versions of Herald's tables but time travel)."""
        from deltalake import DeltaTable

        path = self.path(table)
        if not DeltaTable.is_deltatable(path, storage_options=self._options):
            return TableUpkeep(table, 0, 0, 0, 0, 0)
        current = DeltaTable(path, storage_options=self._options)
        before = len(current.file_uris())
        compacted = current.optimize.compact()
        current = DeltaTable(path, storage_options=self._options)
        deleted = current.vacuum(retention_hours=max(0, round(retention_hours)), dry_run=False,
                                 enforce_retention_duration=False)
        current.cleanup_metadata()
        return TableUpkeep(table, int(compacted.get("numFilesRemoved", 0)), int(compacted.get("numFilesAdded", 0)),
                           len(deleted), before, len(DeltaTable(path, storage_options=self._options).file_uris()))

    @staticmethod
    def read_table(path: str, table: str, subscription_id: str | None, options: dict[str, str] | None) -> pa.Table:
        """All rows, or one subscription's, with every declared column (null where an older table lacks it)."""
        query = f"SELECT * FROM {table}"
        if subscription_id:
            query += f" WHERE subscription = '{_sql_text(subscription_id)}'"
        return DeltaRsStore.query_table(path, table, query, options)

    @staticmethod
    def query_table(path: str, table: str, query: str, options: dict[str, str] | None) -> pa.Table:
        """Run `query` with delta-rs' own query engine (its PyArrow-dataset bridge, `to_pyarrow_dataset`, aborts
        the process at exit about one run in three: delta-io/delta-rs#2184)."""
        from deltalake import DeltaTable, QueryBuilder

        declared = SCHEMAS[table]
        if not DeltaTable.is_deltatable(path, storage_options=options):
            return declared.empty_table()
        result = pa.table(QueryBuilder().register(table, DeltaTable(path, storage_options=options)).execute(query)
                          .read_all())
        columns = [result.column(name).cast(declared.field(name).type) if name in result.schema.names
                   else pa.nulls(result.num_rows, declared.field(name).type) for name in declared.names]
        return pa.Table.from_arrays(columns, schema=declared)


class SparkDeltaStore(TableStore):
    """delta-spark (`format("delta")`): for clusters where the Delta jars are on the classpath."""

    def __init__(self, spark, storage_path: str) -> None:
        super().__init__(storage_path)
        self.spark = spark

    def replace(self, table: str, rows: pa.Table, part: Slice | Slices) -> None:
        frame = self.spark.createDataFrame(_conform(table, rows))
        (frame.write.format("delta").mode("overwrite").option("replaceWhere", part.predicate)
         .option("mergeSchema", "true").save(self.path(table)))

    def maintain(self, table: str, retention_hours: float) -> TableUpkeep:
        """`OPTIMIZE` then `VACUUM ... RETAIN n HOURS` (with Delta's retention check off for this statement when
        n is under its 168-hour default)."""
        from pyspark.errors import AnalysisException

        target = f"delta.`{self.path(table)}`"
        try:
            optimized = self.spark.sql(f"OPTIMIZE {target}").collect()
        except AnalysisException:  # no table yet
            return TableUpkeep(table, 0, 0, 0)
        metrics = optimized[0]["metrics"] if optimized else None
        check = "spark.databricks.delta.retentionDurationCheck.enabled"
        previous = self.spark.conf.get(check, "true")
        self.spark.conf.set(check, "false")
        try:
            deleted = self.spark.sql(f"VACUUM {target} RETAIN {max(0, round(retention_hours))} HOURS").count()
        finally:
            self.spark.conf.set(check, previous)
        return TableUpkeep(table, int(metrics["numFilesRemoved"]) if metrics else 0,
                           int(metrics["numFilesAdded"]) if metrics else 0, deleted)

    def read(self, table: str, subscription_id: str | None = None) -> pa.Table:
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        try:
            frame = self.spark.read.format("delta").load(self.path(table))
        except AnalysisException:  # no table yet
            return SCHEMAS[table].empty_table()
        if subscription_id:
            frame = frame.where(F.col("subscription") == subscription_id)
        return frame.toArrow()

    def sql(self, table: str, query: str) -> pa.Table:
        from pyspark.errors import AnalysisException

        try:
            self.spark.read.format("delta").load(self.path(table)).createOrReplaceTempView(table)
        except AnalysisException:  # no table yet
            return SCHEMAS[table].empty_table()
        return self.spark.sql(query).drop("herald_rank").toArrow()


DELTA_SPARK_CLASS = "io.delta.tables.DeltaTable"


def open_store(engine: str, storage_path: str, spark=None, storage_options: dict[str, str] | None = None) -> TableStore:
    """The table store for `engine` ('auto' | 'spark' | 'deltalake'); 'auto' prefers delta-spark when it loads."""
    from herald.session import jvm_class_loads

    if engine not in ("auto", "spark", "deltalake"):
        raise ValueError(f"storage.engine must be auto, spark or deltalake, not {engine!r}")
    has_delta_spark = spark is not None and jvm_class_loads(spark, DELTA_SPARK_CLASS)
    if engine == "spark" and not has_delta_spark:
        raise RuntimeError("storage.engine is 'spark' but the Delta Lake jars are not on Spark's classpath "
                           "(add io.delta:delta-spark to spark.jars.packages, or use engine 'auto')")
    if engine == "spark" or (engine == "auto" and has_delta_spark):
        log.info("tables: delta-spark at %s", table_root(storage_path))
        return SparkDeltaStore(spark, storage_path)
    log.info("tables: delta-rs (deltalake) at %s", table_root(storage_path))
    return DeltaRsStore(storage_path, storage_options)
