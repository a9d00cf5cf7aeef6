"""Reading Herald's tables: every engine reads with delta-rs' own query engine, from the driver, and the CLI
reads the same way without starting Spark (`herald.storage.store.TableStore`'s reads call these)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from herald.storage.tables import SCHEMAS


def sql_text(text: str) -> str:
    """`text` inside a SQL string literal (quotes doubled)."""
    return text.replace("'", "''")


def sql_string(text: str) -> str:
    """`text` as a SQL string literal (both engines)."""
    return f"'{sql_text(text)}'"


@dataclass(frozen=True)
class Logged:
    """A table read with its log (`TableStore.read_with_log`): its rows at `version` (-1: no table yet), and
    (version, note) of the commits asked for, newest first; a commit written without a note has None."""

    rows: pa.Table
    version: int
    commits: list[tuple[int, str | None]]


def read_table(path: str, table: str, subscription_id: str | None, options: dict[str, str] | None) -> pa.Table:
    """All rows, or one subscription's, with every declared column (null where an older table lacks it)."""
    query = f"SELECT * FROM {table}"
    if subscription_id:
        query += f" WHERE subscription = '{sql_text(subscription_id)}'"
    return query_table(path, table, query, options)


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
    rows = query_table(path, table, f"SELECT * FROM {table}", options, current)
    return Logged(rows, version, [(v, note) for v, note in commits if after_version < v <= version])


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
