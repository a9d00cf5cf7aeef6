"""delta-spark (`format("delta")`): Herald's tables through the job's Spark session, for clusters where the Delta
jars are on the classpath (`herald.storage.store` says what every engine does)."""

from __future__ import annotations

import contextlib
import logging
import threading

import pyarrow as pa

from herald.storage.local_files import data_files, log_files
from herald.storage.properties import missing_properties, table_properties
from herald.storage.store import (
    COMPACT_TARGET_BYTES,
    DEFAULT_RETENTION_HOURS,
    Logged,
    Slice,
    Slices,
    TableStore,
    TableUpkeep,
    conform,
    sql_text,
)
from herald.storage.tables import SCHEMAS

log = logging.getLogger(__name__)

CHECKSUM_SETTING = "spark.databricks.delta.writeChecksumFile.enabled"
"""delta-spark writes a `.crc` checksum beside every commit (3-5 KB: the table's protocol, metadata, histograms
and, under 50 files, every file), three times the commit itself; Delta reads tables without them. Herald's
session turns them off unless the job sets it, in its Spark conf or in its session beforehand
(tests/benchmarks/README.md, storage_growth)."""


class SparkDeltaStore(TableStore):
    """delta-spark (`format("delta")`): for clusters where the Delta jars are on the classpath. Tables are created
    with Herald's properties (or given them) once per store and table; a round's rows are one small file."""

    def __init__(self, spark, storage_path: str, retention_hours: float = DEFAULT_RETENTION_HOURS) -> None:
        super().__init__(storage_path, retention_hours)
        self.spark = spark
        self._lock = threading.Lock()
        self._ready: set[str] = set()
        if not _set_for_the_job(spark, CHECKSUM_SETTING):
            spark.conf.set(CHECKSUM_SETTING, "false")

    def _ensure(self, table: str) -> None:
        from delta.tables import DeltaTable

        path = self.path(table)
        with self._lock:
            if path in self._ready:
                return
            if not DeltaTable.isDeltaTable(self.spark, path):
                builder = DeltaTable.createIfNotExists(self.spark).location(self._qualified(path)).addColumns(
                    self.spark.createDataFrame(SCHEMAS[table].empty_table()).schema)
                for key, value in table_properties(table, self.retention_hours).items():
                    builder = builder.property(key, value)
                builder.execute()
            else:
                # its properties alone (`detail()` would count the table's files: its whole state rebuilt)
                current = {row["key"]: row["value"]
                           for row in self.spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
                properties = missing_properties(table, self.retention_hours, current)
                if properties:
                    log.info("%s: setting table properties %s", table, properties)
                    settings = ", ".join(f"'{key}' = '{sql_text(value)}'" for key, value in properties.items())
                    self.spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({settings})")
            self._ready.add(path)

    def _qualified(self, path: str) -> str:
        """`path` as Hadoop qualifies it (`file:///data/t` is `file:/data/t`), with the session's Hadoop settings
        as delta-spark uses them. delta-spark's CREATE TABLE compares the location it is given with the qualified
        path of the table it creates, and refuses a URI written otherwise (DELTA_AMBIGUOUS_PATHS_IN_CREATE_TABLE).
        Without the JVM (Spark Connect): `file:///` written as `file:/`."""
        jvm = getattr(self.spark, "_jvm", None)
        if jvm is None:
            return "file:/" + path[len("file:///"):] if path.startswith("file:///") else path
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        file_system = hadoop_path.getFileSystem(self.spark._jsparkSession.sessionState().newHadoopConf())
        return str(file_system.makeQualified(hadoop_path).toString())

    def replace(self, table: str, rows: pa.Table, part: Slice | Slices, note: str | None = None) -> None:
        """One attempt: a commit that loses a race with another writer of the table raises (Delta's
        ConcurrentAppendException and kin). The table writer tries its rounds again while it may write (not
        once the job lost its lease), and the lease tries its own rows again."""
        self._ensure(table)
        frame = self.spark.createDataFrame(conform(table, rows)).coalesce(1)  # one file, not one per core
        writer = frame.write.format("delta").mode("overwrite").option("replaceWhere", part.predicate)
        self._noted(writer, note).option("mergeSchema", "true").save(self.path(table))

    def append(self, table: str, rows: pa.Table, note: str | None = None) -> None:
        """One attempt, as `replace`; appends alone never conflict with each other (Delta's blind appends)."""
        self._ensure(table)
        frame = self.spark.createDataFrame(conform(table, rows)).coalesce(1)
        writer = frame.write.format("delta").mode("append")
        self._noted(writer, note).option("mergeSchema", "true").save(self.path(table))

    @staticmethod
    def _noted(writer, note: str | None):
        return writer if note is None else writer.option("userMetadata", note)

    def maintain(self, table: str, retention_hours: float) -> TableUpkeep:
        """`OPTIMIZE`, `VACUUM ... RETAIN n HOURS` (with Delta's retention check off for this statement when n is
        under the table's deleted-file retention), then a checkpoint and the log cleanup delta-spark otherwise
        does only when a commit writes a checkpoint."""
        from delta.tables import DeltaTable

        path = self.path(table)
        target = f"delta.`{path}`"
        logs_before = log_files(path)
        if not DeltaTable.isDeltaTable(self.spark, path):  # no table yet
            return TableUpkeep(table, 0, 0, 0, log_files_before=logs_before, log_files_after=logs_before)
        self._ensure(table)
        sizes = {f"spark.databricks.delta.optimize.{name}": str(COMPACT_TARGET_BYTES)
                 for name in ("minFileSize", "maxFileSize")}
        with _session_conf(self.spark, sizes):
            optimized = self.spark.sql(f"OPTIMIZE {target}").collect()
        metrics = optimized[0]["metrics"] if optimized else None
        before = data_files(path)  # VACUUM says only where it ran; a DRY RUN to list them would double its cost
        with _session_conf(self.spark, {"spark.databricks.delta.retentionDurationCheck.enabled": "false"}):
            self.spark.sql(f"VACUUM {target} RETAIN {max(0, round(retention_hours))} HOURS").collect()
        after = data_files(path)
        # a round written meanwhile adds a file: then this counts one fewer than VACUUM deleted
        deleted = None if before is None or after is None else max(0, before - after)
        self._checkpoint(path)
        return TableUpkeep(table, int(metrics["numFilesRemoved"]) if metrics else 0,
                           int(metrics["numFilesAdded"]) if metrics else 0, deleted,
                           log_files_before=logs_before, log_files_after=log_files(path))

    def _checkpoint(self, path: str) -> None:
        """A checkpoint of the current version, then the log entries older than the log retention deleted (Delta's
        `DeltaLog.checkpoint` and `doLogCleanup`, through the JVM: there is no SQL for them)."""
        try:
            jvm = self.spark._jvm
            delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, path)
            delta_log.checkpoint()
            delta_log.doLogCleanup(delta_log.unsafeVolatileSnapshot(), jvm.scala.Option.empty())
        except Exception:  # noqa: BLE001 - Delta internals, or Spark Connect: the next checkpoint cleans up
            log.warning("%s: no checkpoint or log cleanup (delta-spark does both at its next checkpoint commit)",
                        path, exc_info=True)

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

    def read_with_log(self, table: str, after_version: int, at_most: int) -> Logged:
        """As delta-rs' (`TableStore.read_with_log`), with delta-spark: the newest commit first (`DESCRIBE
        HISTORY`), the others after `after_version` only when there are more, then the rows of that version."""
        from pyspark.errors import AnalysisException

        path = self.path(table)
        history = f"DESCRIBE HISTORY delta.`{path}`"
        try:
            newest = self.spark.sql(f"{history} LIMIT 1").select("version", "userMetadata").collect()
        except AnalysisException:  # no table yet
            return Logged(SCHEMAS[table].empty_table(), -1, [])
        version = int(newest[0]["version"])
        asked = min(at_most, version - after_version)
        commits = newest if asked == 1 else [] if asked < 1 else \
            self.spark.sql(f"{history} LIMIT {int(asked)}").select("version", "userMetadata").collect()
        rows = self.spark.read.format("delta").option("versionAsOf", version).load(path).toArrow()
        return Logged(rows, version, [(int(c["version"]), c["userMetadata"]) for c in commits
                                      if after_version < int(c["version"]) <= version])

    def sql(self, table: str, query: str) -> pa.Table:
        from pyspark.errors import AnalysisException

        try:
            self.spark.read.format("delta").load(self.path(table)).createOrReplaceTempView(table)
        except AnalysisException:  # no table yet
            return SCHEMAS[table].empty_table()
        return self.spark.sql(query).drop("herald_rank").toArrow()

    def select(self, table: str, query: str) -> pa.Table:
        from pyspark.errors import AnalysisException

        try:
            self.spark.read.format("delta").load(self.path(table)).createOrReplaceTempView(table)
        except AnalysisException:  # no table yet
            return pa.table({})
        return self.spark.sql(query).toArrow()

    def quote(self, column: str) -> str:
        return f"`{column}`"

    def delete(self, table: str, predicate: str) -> int:
        """SQL `DELETE`, one attempt (a commit that loses a race raises; maintenance tries again next pass)."""
        from delta.tables import DeltaTable

        path = self.path(table)
        if not DeltaTable.isDeltaTable(self.spark, path):
            return 0
        done = self.spark.sql(f"DELETE FROM delta.`{path}` WHERE {predicate}").collect()
        return int(done[0]["num_affected_rows"]) if done and "num_affected_rows" in done[0] else 0


def _set_for_the_job(spark, key: str) -> bool:
    """The job set `key` itself: in its Spark conf (spark-submit `--conf`, herald.yaml `spark.conf`) or in its
    session before Herald's store was built (a notebook's `spark.conf.set`). Such a setting is left as it is."""
    if spark.sparkContext.getConf().contains(key):
        return True
    try:
        return key in spark.conf.getAll  # the session's explicit settings (pyspark 4)
    except Exception:  # noqa: BLE001 - an older or remote session: the Spark conf alone decides
        return False


@contextlib.contextmanager
def _session_conf(spark, settings: dict[str, str]):
    """Spark session settings for one statement, then back as they were."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


DELTA_SPARK_CLASS = "io.delta.tables.DeltaTable"
