"""Writing and reading Herald's Delta tables, one slice per (writer, round), replaced whole on a replay.

A round (a micro-batch of a topic's shared query, a catch-up read, a batch of parked retries) writes its rows
of each table as one `Slice`: one atomic commit that replaces whatever that slice held before. A micro-batch
replayed after a crash therefore leaves the tables as if it had run once, whatever it wrote the first time.
Both back-ends do the same: delta-rs with `predicate` overwrite, delta-spark with `replaceWhere`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from herald.storage.reads import Logged, query_table, read_table, read_table_with_log, sql_text
from herald.storage.tables import SCHEMAS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slice:
    """The rows `writer` wrote in its round `batch_id`: every table row carries both."""

    writer: str
    batch_id: int

    @property
    def predicate(self) -> str:
        return f"writer = '{sql_text(self.writer)}' AND batch_id = {int(self.batch_id)}"


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
    return (f"(writer = '{sql_text(writer)}' AND batch_id BETWEEN {ids[0]} AND {ids[-1]} "
            f"AND batch_id IN ({', '.join(map(str, ids))}))")


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
        return read_table(self.path(table), table, subscription_id, self.storage_options())

    def read_with_log(self, table: str, after_version: int, at_most: int) -> Logged:
        """`table`'s rows at its newest version, that version, and the notes of its commits after `after_version`
        (at most `at_most` of the newest), read with delta-rs."""
        return read_table_with_log(self.path(table), table, after_version, at_most, self.storage_options())

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
        return query_table(self.path(table), table, query, self.storage_options())

    def select(self, table: str, query: str) -> pa.Table:
        """Run a SQL query over `table` whose result has columns of its own (an aggregate), as it gives them; no
        rows if the table does not exist. Identifiers quoted with `quote`."""
        return query_table(self.path(table), table, query, self.storage_options(), conform=False)

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


def conform(table: str, rows: pa.Table) -> pa.Table:
    """`rows` with the columns and types of `table`'s schema, in its order."""
    schema = SCHEMAS[table]
    return rows if rows.schema == schema else rows.select(schema.names).cast(schema)


def open_store(engine: str, storage_path: str, spark=None, storage_options: dict[str, str] | None = None,
               retention_hours: float = DEFAULT_RETENTION_HOURS) -> TableStore:
    """The table store for `engine` ('auto' | 'spark' | 'deltalake'); 'auto' prefers delta-spark when it loads."""
    from herald.session import jvm_class_loads
    from herald.storage.delta_rs import DeltaRsStore  # each engine's module builds on this one
    from herald.storage.delta_spark import DELTA_SPARK_CLASS, SparkDeltaStore

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
