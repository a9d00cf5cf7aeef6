"""Writing and reading Herald's Delta tables, exactly once per (subscription, micro-batch).

Every write carries an application transaction (`BatchTxn`): Delta records the highest version written for
an app id, so a micro-batch replayed after a crash does not write its rows twice.
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
class BatchTxn:
    """A Delta application transaction: `version` must grow for `app_id`; writes at or below it are skipped."""

    app_id: str
    version: int


def table_root(storage_path: str) -> str:
    return f"{storage_path.rstrip('/')}/tables"


class TableStore(ABC):
    """Herald's tables under `<storage path>/tables/<name>`."""

    def __init__(self, storage_path: str) -> None:
        self.root = table_root(storage_path)

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    @abstractmethod
    def append(self, table: str, rows: pa.Table, txn: BatchTxn) -> bool:
        """Append `rows` unless `txn` was already written to `table`; True when written."""

    def read(self, table: str, subscription_id: str | None = None) -> pa.Table:
        """Rows of `table` (all, or one subscription's), read with delta-rs; empty if the table does not exist."""
        return DeltaRsStore.read_table(self.path(table), table, subscription_id, self.storage_options())

    def storage_options(self) -> dict[str, str] | None:
        return None


class DeltaRsStore(TableStore):
    """delta-rs (`deltalake`): writes Arrow from the driver, no Spark needed.

    Tables are created once (under a process lock) with their full schema, so concurrent writers only ever
    append; a commit that loses a race with another process is retried.
    """

    _create_lock = threading.Lock()

    def __init__(self, storage_path: str, storage_options: dict[str, str] | None = None) -> None:
        super().__init__(storage_path)
        self._options = storage_options or None

    def storage_options(self) -> dict[str, str] | None:
        return self._options

    def _ensure(self, table: str) -> None:
        from deltalake import DeltaTable

        path = self.path(table)
        with self._create_lock:
            if not DeltaTable.is_deltatable(path, storage_options=self._options):
                DeltaTable.create(path, SCHEMAS[table], mode="ignore", storage_options=self._options)

    def append(self, table: str, rows: pa.Table, txn: BatchTxn) -> bool:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        self._ensure(table)
        rows = rows.cast(SCHEMAS[table]) if rows.schema != SCHEMAS[table] else rows

        @retry(retry=retry_if_exception_type(CommitFailedError), stop=stop_after_attempt(8),
               wait=wait_random_exponential(multiplier=0.05, max=2), reraise=True)
        def commit() -> bool:
            current = DeltaTable(self.path(table), storage_options=self._options)
            done = current.transaction_version(txn.app_id)
            if done is not None and done >= txn.version:
                log.info("%s: batch %s of %s already written, skipped", table, txn.version, txn.app_id)
                return False
            known = {field.name for field in current.schema().fields}
            write_deltalake(
                current,
                rows,
                mode="append",
                schema_mode="merge" if not set(rows.schema.names) <= known else None,
                storage_options=self._options,
                commit_properties=CommitProperties(app_transactions=[Transaction(txn.app_id, txn.version)]),
            )
            return True

        return commit()

    @staticmethod
    def read_table(path: str, table: str, subscription_id: str | None, options: dict[str, str] | None) -> pa.Table:
        """Read with delta-rs' own query engine. (Its PyArrow-dataset bridge, `to_pyarrow_dataset`, aborts the
        process at exit about one run in three: delta-io/delta-rs#2184.)"""
        from deltalake import DeltaTable, QueryBuilder

        if not DeltaTable.is_deltatable(path, storage_options=options):
            return SCHEMAS[table].empty_table()
        query = f"SELECT * FROM {table}"
        if subscription_id:
            query += " WHERE subscription = '" + subscription_id.replace("'", "''") + "'"
        result = pa.table(QueryBuilder().register(table, DeltaTable(path, storage_options=options)).execute(query)
                          .read_all())
        declared = SCHEMAS[table]
        return result.cast(pa.schema([declared.field(f.name) if f.name in declared.names else f for f in result.schema]))


class SparkDeltaStore(TableStore):
    """delta-spark (`format("delta")`): for clusters where the Delta jars are on the classpath."""

    def __init__(self, spark, storage_path: str) -> None:
        super().__init__(storage_path)
        self.spark = spark

    def append(self, table: str, rows: pa.Table, txn: BatchTxn) -> bool:
        frame = self.spark.createDataFrame(rows.cast(SCHEMAS[table]))
        (frame.write.format("delta").mode("append")
         .option("txnAppId", txn.app_id).option("txnVersion", txn.version).option("mergeSchema", "true")
         .save(self.path(table)))
        return True

    def read(self, table: str, subscription_id: str | None = None) -> pa.Table:
        from pyspark.sql import functions as F

        frame = self.spark.read.format("delta").load(self.path(table))
        if subscription_id:
            frame = frame.where(F.col("subscription") == subscription_id)
        return frame.toArrow()


DELTA_SPARK_CLASS = "io.delta.tables.DeltaTable"


def open_store(engine: str, storage_path: str, spark=None, storage_options: dict[str, str] | None = None) -> TableStore:
    """The table store for `engine` ('auto' | 'spark' | 'deltalake'); 'auto' prefers delta-spark when it loads."""
    from herald.engine.session import jvm_class_loads

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
