"""Writing and reading Herald's Delta tables, one slice per (writer, round), replaced whole on a replay.

A round (a micro-batch of a topic's shared query, a catch-up read, a batch of parked retries) writes its rows
of each table as one `Slice`: one atomic commit that replaces whatever that slice held before. A micro-batch
replayed after a crash therefore leaves the tables as if it had run once, whatever it wrote the first time.
Both back-ends do the same: delta-rs with `predicate` overwrite, delta-spark with `replaceWhere`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from herald.storage.local_files import data_files, log_files
from herald.storage.properties import missing_properties, table_properties
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
        """One term per writer, its batch ids listed (a minute of rounds is hundreds of slices of a few writers),
        and bounded: delta-rs prunes files by statistics on a range, not on an IN list of more than 20 values."""
        batches: dict[str, set[int]] = {}
        for part in self.parts:
            batches.setdefault(part.writer, set()).add(int(part.batch_id))
        return " OR ".join(_batches_predicate(writer, sorted(ids)) for writer, ids in batches.items())

    def __str__(self) -> str:
        return f"{len(self.parts)} rounds ({self.parts[0]} .. {self.parts[-1]})"


def _batches_predicate(writer: str, ids: list[int]) -> str:
    if len(ids) == 1:
        return f"({Slice(writer, ids[0]).predicate})"
    return (f"(writer = '{_sql_text(writer)}' AND batch_id BETWEEN {ids[0]} AND {ids[-1]} "
            f"AND batch_id IN ({', '.join(map(str, ids))}))")


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


def sql_string(text: str) -> str:
    """`text` as a SQL string literal (both engines)."""
    return f"'{_sql_text(text)}'"


def table_root(storage_path: str) -> str:
    return f"{storage_path.rstrip('/')}/tables"


DEFAULT_RETENTION_HOURS = 168.0
"""storage.maintenanceRetentionHours' default: a week of time travel (Delta's own default for files)."""
COMPACT_TARGET_BYTES = 16 * 1024 * 1024
"""Compaction writes files up to this size, and leaves files this large alone. Engines default to 100 MB
(delta-rs) or 1 GB (delta-spark): each pass would rewrite a Herald table whole until it reached that, and every
rewritten copy stays the retention long (168 h of 6-hourly passes: 28 copies of the table)."""


class TableStore(ABC):
    """Herald's tables under `<storage path>/tables/<name>`. retention_hours: storage.maintenanceRetentionHours,
    which the tables' log and deleted-file retentions follow (`herald.storage.properties`)."""

    def __init__(self, storage_path: str, retention_hours: float = DEFAULT_RETENTION_HOURS) -> None:
        self.root = table_root(storage_path)
        self.retention_hours = retention_hours

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    @abstractmethod
    def replace(self, table: str, rows: pa.Table, part: Slice | Slices, note: str | None = None) -> None:
        """Make `table`'s rows of `part` (one round's slice, or several) exactly `rows` (which must all carry
        their slice's writer and batch_id), in one commit. note: the commit's `userMetadata` (`read_with_log`)."""

    @abstractmethod
    def append(self, table: str, rows: pa.Table, note: str | None = None) -> None:
        """Add `rows` to `table` in one commit that deletes nothing. Only for rows of a slice no one can have
        written before (a round new to the tables: `TableWriter.submit`), or rows whose readers take the newest
        (a lease holder's): written again, they would be there twice. On delta-spark it costs a tenth of a
        `replace`, which rebuilds the table's state to delete (0.3 s against 2.4 s warm: tests/benchmarks/README.md,
        `delta_commit.py`). note: as `replace`'s."""

    def read(self, table: str, subscription_id: str | None = None) -> pa.Table:
        """Rows of `table` (all, or one subscription's), read with delta-rs; empty if the table does not exist."""
        return DeltaRsStore.read_table(self.path(table), table, subscription_id, self.storage_options())

    def read_with_log(self, table: str, after_version: int, at_most: int) -> Logged:
        """`table`'s rows at its newest version, that version, and the notes of its commits after `after_version`
        (at most `at_most` of the newest), read with delta-rs."""
        return DeltaRsStore.read_table_with_log(self.path(table), table, after_version, at_most, self.storage_options())

    def latest(self, table: str, keys: tuple[str, ...], newest_first: str, columns: tuple[str, ...] | None = None,
               where: str | None = None, newest_where: str | None = None) -> pa.Table:
        """The newest row (by the SQL ordering `newest_first`) of each distinct `keys` of `table`, with `columns`
        only (None: all; delta-rs gives the others as nulls): both engines read no other column. where: only the
        rows that match it count; newest_where: only the newest rows that match it are returned (both SQL)."""
        keys_sql = ", ".join(self.quote(key) for key in keys)
        shown = "*" if columns is None else ", ".join(self.quote(column) for column in columns)
        rows = table if where is None else f"(SELECT * FROM {table} WHERE {where})"
        kept = "" if newest_where is None else f" AND ({newest_where})"
        return self.sql(table, f"SELECT {shown} FROM (SELECT *, row_number() OVER (PARTITION BY {keys_sql} "
                               f"ORDER BY {newest_first}) AS herald_rank FROM {rows}) WHERE herald_rank = 1{kept}")

    def latest_whole(self, table: str, keys: tuple[str, ...], order: tuple[str, ...], columns: tuple[str, ...],
                     newest_where: str) -> pa.Table:
        """As `latest` (the newest row of each distinct `keys` by `order`, each column descending, if it matches
        `newest_where`, which names no key or `order` column), for a table with large columns: the newest rows are
        found on the key, `order` and `newest_where`'s columns alone, then only they are read with `columns` (a join
        on the key and `order`; rows tied on all of them come back together). A start reads the bodies of the
        messages parked now, not those of every retries row."""
        q = self.quote
        ranked = ", ".join(q(column) for column in (*keys, *order))
        on = " AND ".join(f"herald_row.{q(column)} = herald_newest.{q(column)}" for column in (*keys, *order))
        return self.sql(table, (
            f"SELECT {', '.join(f'herald_row.{q(column)}' for column in columns)} FROM {table} AS herald_row "
            f"JOIN (SELECT {ranked} FROM (SELECT *, row_number() OVER (PARTITION BY {', '.join(map(q, keys))} "
            f"ORDER BY {', '.join(f'{q(column)} DESC' for column in order)}) AS herald_rank FROM {table}) "
            f"WHERE herald_rank = 1 AND ({newest_where})) AS herald_newest ON {on} WHERE {newest_where}"))

    def sql(self, table: str, query: str) -> pa.Table:
        """Run a SQL query over `table` (named as itself), with delta-rs; no rows if the table does not exist."""
        return DeltaRsStore.query_table(self.path(table), table, query, self.storage_options())

    def select(self, table: str, query: str) -> pa.Table:
        """Run a SQL query over `table` whose result has columns of its own (an aggregate), as it gives them; no
        rows if the table does not exist. Identifiers quoted with `quote`."""
        return DeltaRsStore.query_table(self.path(table), table, query, self.storage_options(), conform=False)

    def quote(self, column: str) -> str:
        """`column` as an identifier in this store's SQL (delta-rs: double quotes; Spark: backticks)."""
        return f'"{column}"'

    def delete(self, table: str, predicate: str) -> int:
        """Delete the rows of `table` that match `predicate` (SQL over its columns, identifiers quoted with
        `quote`) in one commit; the number deleted (0, and no commit, when the table does not exist)."""
        raise NotImplementedError(f"{type(self).__name__} deletes no rows")

    def storage_options(self) -> dict[str, str] | None:
        return None

    @abstractmethod
    def maintain(self, table: str, retention_hours: float) -> TableUpkeep:
        """Compact `table`'s small files, delete the files no version younger than `retention_hours` needs, write
        a checkpoint and delete the log entries older than the table's log retention."""


@dataclass(frozen=True)
class Logged:
    """A table read with its log (`TableStore.read_with_log`): its rows at `version` (-1: no table yet), and
    (version, note) of the commits asked for, newest first; a commit written without a note has None."""

    rows: pa.Table
    version: int
    commits: list[tuple[int, str | None]]


@dataclass(frozen=True)
class TableUpkeep:
    """What one maintenance pass did to a table: files compacted away and written, files deleted, the
    table's data files before and after, its `_delta_log` files (commits, checkpoints, checksums) before and
    after (None where the engine does not say), and the rows of history it deleted."""

    table: str
    files_removed: int
    files_added: int
    files_deleted: int | None  # None: the engine does not say (delta-spark on remote storage)
    files_before: int | None = None
    files_after: int | None = None
    log_files_before: int | None = None
    log_files_after: int | None = None
    rows_deleted: int | None = None  # history past its retention (herald.storage.history); None: keeps every row


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

    def __init__(self, storage_path: str, storage_options: dict[str, str] | None = None,
                 retention_hours: float = DEFAULT_RETENTION_HOURS) -> None:
        super().__init__(storage_path, retention_hours)
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
                DeltaTable.create(path, SCHEMAS[table], mode="ignore", storage_options=self._options,
                                  configuration=table_properties(table, self.retention_hours))
            current = DeltaTable(path, storage_options=self._options)
            known = {field.name for field in current.schema().fields}
            missing = [field for field in SCHEMAS[table] if field.name not in known]
            if missing:
                log.info("%s: adding columns %s", table, ", ".join(field.name for field in missing))
                current.alter.add_columns([Field.from_arrow(field) for field in missing])
            self._upgrade(table, current)
            self._ready.add(path)

    def _upgrade(self, table: str, current) -> None:
        """Give a table created by an older Herald (or with another retention) Herald's properties: one commit."""
        properties = missing_properties(table, self.retention_hours, dict(current.metadata().configuration))
        if properties:
            log.info("%s: setting table properties %s", table, properties)
            current.alter.set_table_properties(properties, raise_if_not_exists=False)

    def replace(self, table: str, rows: pa.Table, part: Slice | Slices, note: str | None = None) -> None:
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import CommitFailedError

        self._ensure(table)
        rows = _conform(table, rows)

        @retry(retry=retry_if_exception_type(CommitFailedError), stop=stop_after_attempt(8),
               wait=wait_random_exponential(multiplier=0.05, max=2), reraise=True)
        def commit() -> None:
            write_deltalake(DeltaTable(self.path(table), storage_options=self._options), rows, mode="overwrite",
                            predicate=part.predicate, storage_options=self._options,
                            commit_properties=_noted(note))

        commit()

    def append(self, table: str, rows: pa.Table, note: str | None = None) -> None:
        """One attempt: delta-rs reports a log entry that may have landed (a timeout on remote storage) as a failed
        commit too, and an append tried again would then be there twice. Callers that try again replace; appends
        never conflict with each other (delta-rs commits them at the next version itself)."""
        from deltalake import write_deltalake

        self._ensure(table)
        write_deltalake(self.path(table), _conform(table, rows), mode="append", storage_options=self._options,
                        commit_properties=_noted(note))

    def delete(self, table: str, predicate: str) -> int:
        """A commit that loses a race is tried again on the newer version (delta-rs counts a concurrent append as
        one: its delete read the table), up to 8 times; then it raises."""
        from deltalake import DeltaTable
        from deltalake.exceptions import CommitFailedError

        path = self.path(table)
        if not DeltaTable.is_deltatable(path, storage_options=self._options):
            return 0

        @retry(retry=retry_if_exception_type(CommitFailedError), stop=stop_after_attempt(8),
               wait=wait_random_exponential(multiplier=0.05, max=2), reraise=True)
        def commit() -> int:
            return int(DeltaTable(path, storage_options=self._options).delete(predicate).get("num_deleted_rows", 0))

        return commit()

    def maintain(self, table: str, retention_hours: float) -> TableUpkeep:
        """delta-rs `optimize.compact()`, `vacuum()`, then a checkpoint and `cleanup_metadata()` (the log entries
        older than the table's log retention; they need a checkpoint after them). The retention may be shorter
        than Delta's 7-day default (nothing reads old versions of Herald's tables but time travel). A table still
        without Herald's properties gets them first."""
        from deltalake import DeltaTable

        path = self.path(table)
        if not DeltaTable.is_deltatable(path, storage_options=self._options):
            return TableUpkeep(table, 0, 0, 0, 0, 0, 0, 0)
        self._ensure(table)
        logs_before = log_files(path)
        current = DeltaTable(path, storage_options=self._options)
        before = len(current.file_uris())
        compacted = current.optimize.compact(target_size=COMPACT_TARGET_BYTES)
        current = DeltaTable(path, storage_options=self._options)
        deleted = current.vacuum(retention_hours=max(0, round(retention_hours)), dry_run=False,
                                 enforce_retention_duration=False)
        current = DeltaTable(path, storage_options=self._options)
        current.create_checkpoint()
        current.cleanup_metadata()
        return TableUpkeep(table, int(compacted.get("numFilesRemoved", 0)), int(compacted.get("numFilesAdded", 0)),
                           len(deleted), before, len(DeltaTable(path, storage_options=self._options).file_uris()),
                           logs_before, log_files(path))

    @staticmethod
    def read_table(path: str, table: str, subscription_id: str | None, options: dict[str, str] | None) -> pa.Table:
        """All rows, or one subscription's, with every declared column (null where an older table lacks it)."""
        query = f"SELECT * FROM {table}"
        if subscription_id:
            query += f" WHERE subscription = '{_sql_text(subscription_id)}'"
        return DeltaRsStore.query_table(path, table, query, options)

    @staticmethod
    def read_table_with_log(path: str, table: str, after_version: int, at_most: int,
                            options: dict[str, str] | None) -> Logged:
        """`TableStore.read_with_log`: the rows and the commits of one snapshot (the newest)."""
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(path, storage_options=options):
            return Logged(SCHEMAS[table].empty_table(), -1, [])
        current = DeltaTable(path, storage_options=options)
        version = current.version()
        asked = min(at_most, version - after_version)
        # `history` of the newest version only: of a version loaded by time travel, delta-rs 1.6 numbers them wrong
        commits = [(entry["version"], entry.get("userMetadata")) for entry in current.history(asked)] \
            if asked > 0 else []
        rows = DeltaRsStore.query_table(path, table, f"SELECT * FROM {table}", options, current)
        return Logged(rows, version, [(v, note) for v, note in commits if after_version < v <= version])

    @staticmethod
    def query_table(path: str, table: str, query: str, options: dict[str, str] | None, loaded=None,
                    conform: bool = True) -> pa.Table:
        """Run `query` with delta-rs' own query engine (its PyArrow-dataset bridge, `to_pyarrow_dataset`, aborts
        the process at exit about one run in three: delta-io/delta-rs#2184). loaded: the table already loaded
        (a `DeltaTable` of `path`). conform: give the result the table's columns (those it lacks as nulls); else
        the query's own (an empty table with none when the table does not exist)."""
        from deltalake import DeltaTable, QueryBuilder

        declared = SCHEMAS[table]
        if loaded is None and not DeltaTable.is_deltatable(path, storage_options=options):
            return declared.empty_table() if conform else pa.table({})
        loaded = loaded if loaded is not None else DeltaTable(path, storage_options=options)
        result = pa.table(QueryBuilder().register(table, loaded).execute(query).read_all())
        if not conform:
            return result
        columns = [result.column(name).cast(declared.field(name).type) if name in result.schema.names
                   else pa.nulls(result.num_rows, declared.field(name).type) for name in declared.names]
        return pa.Table.from_arrays(columns, schema=declared)


def _noted(note: str | None):
    """delta-rs' commit properties writing `note` as the commit's `userMetadata` (as delta-spark's option does)."""
    if note is None:
        return None
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={"userMetadata": note})


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
                    settings = ", ".join(f"'{key}' = '{_sql_text(value)}'" for key, value in properties.items())
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
        frame = self.spark.createDataFrame(_conform(table, rows)).coalesce(1)  # one file, not one per core
        writer = frame.write.format("delta").mode("overwrite").option("replaceWhere", part.predicate)
        self._noted(writer, note).option("mergeSchema", "true").save(self.path(table))

    def append(self, table: str, rows: pa.Table, note: str | None = None) -> None:
        """One attempt, as `replace`; appends alone never conflict with each other (Delta's blind appends)."""
        self._ensure(table)
        frame = self.spark.createDataFrame(_conform(table, rows)).coalesce(1)
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


def open_store(engine: str, storage_path: str, spark=None, storage_options: dict[str, str] | None = None,
               retention_hours: float = DEFAULT_RETENTION_HOURS) -> TableStore:
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
        return SparkDeltaStore(spark, storage_path, retention_hours)
    log.info("tables: delta-rs (deltalake) at %s", table_root(storage_path))
    return DeltaRsStore(storage_path, storage_options, retention_hours)
