"""delta-rs (`deltalake`): Herald's tables written and read as Arrow from the driver, no Spark needed
(`herald.storage.store` says what every engine does)."""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from herald.storage.local_files import log_files
from herald.storage.properties import missing_properties, table_properties
from herald.storage.store import (
    COMPACT_TARGET_BYTES,
    DEFAULT_RETENTION_HOURS,
    Slice,
    Slices,
    TableStore,
    TableUpkeep,
    conform,
)
from herald.storage.tables import SCHEMAS

log = logging.getLogger(__name__)


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
        rows = conform(table, rows)

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
        write_deltalake(self.path(table), conform(table, rows), mode="append", storage_options=self._options,
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


def _noted(note: str | None):
    """delta-rs' commit properties writing `note` as the commit's `userMetadata` (as delta-spark's option does)."""
    if note is None:
        return None
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={"userMetadata": note})
