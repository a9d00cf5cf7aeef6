"""Table upkeep: delete history past its retention, compact small files, delete unreferenced ones and clean the
commit log up, on demand (`herald maintain`) or every `storage.maintenanceIntervalHours` in a running job.

Every round writes a few small files (a slice per table), so a job that runs for a day leaves tens of
thousands of them; compaction rewrites them into a few and vacuum deletes those no version younger than the
retention needs; a checkpoint then lets the log entries older than the tables' log retention go
(`herald.storage.properties`). Before that, each table's rows that only record the past are deleted once older
than their retention, never a row that says where things stand (`herald.storage.history`). All run beside the
writers: delta-rs and Delta commit them with conflict checks, and a pass that loses a race is simply tried again
next time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from herald.storage.history import HistoryRetention, prune
from herald.storage.lease import StorageLease, forget_ended
from herald.storage.store import DEFAULT_RETENTION_HOURS, TableStore, TableUpkeep
from herald.storage.tables import SCHEMAS

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_RETENTION_HOURS", "MIN_RUNNING_RETENTION_HOURS", "MaintenancePass", "PeriodicMaintenance",
           "maintain_storage", "maintain_tables"]


def maintain_tables(store: TableStore, retention_hours: float = DEFAULT_RETENTION_HOURS,
                    stopping: Callable[[], bool] = lambda: False, history: HistoryRetention | None = None,
                    now_ms: int | None = None) -> list[TableUpkeep]:
    """One pass over every Herald table (old lease rows deleted first, `lease.forget_ended`): its history older
    than `history` says deleted (None: none; `now_ms`: the pass's clock, epoch ms), then compacted and vacuumed
    with `retention_hours`. A table whose pass fails is logged and skipped (a failed deletion of history is tried
    again next time; its compaction goes on). `stopping` is asked before each table: once it says True, no other
    table's pass starts."""
    results = []
    try:
        forget_ended(store)
    except Exception:  # noqa: BLE001 - the rows stay for the next pass; the tables' upkeep goes on
        log.warning("old lease rows could not be deleted; they are tried again next time", exc_info=True)
    for table in SCHEMAS:
        if stopping():
            break
        deleted = None
        if history is not None:
            try:
                deleted = prune(store, table, history, now_ms)
            except Exception:  # noqa: BLE001 - e.g. a commit race with the job's writes: next time
                log.warning("history of table %s could not be deleted; it is tried again next time", table,
                            exc_info=True)
        try:
            results.append(dataclasses.replace(store.maintain(table, retention_hours), rows_deleted=deleted))
        except Exception:  # noqa: BLE001 - one table's failure (e.g. a commit race) must not stop the others
            log.warning("maintenance of table %s failed; it is tried again next time", table, exc_info=True)
    return results


MIN_RUNNING_RETENTION_HOURS = 1.0
"""The least retention a job's own maintenance vacuums with, as it runs beside the job's writes and reads. With
delta-spark a vacuum deletes every file the log does not name once it is older than the retention, so at 0 hours
also a file the table writer has written and not committed yet, which the commit then names; with delta-rs (it
deletes only files the log removed) a vacuum at 0 hours deletes the files a compaction has just replaced while
a read of the version before it may still need them."""

MAINTAIN_LEASE_S = 900.0
"""How long a pass under an hour's retention (`maintain_storage`) holds the storage path's lease (seconds); it is
not renewed, so that no lease row is written while files are deleted (a write in progress could lose its new file;
old holders' rows are deleted before the first table's pass, `lease.forget_ended`)."""
MAINTAIN_TABLE_S = 300.0
"""Time left on that lease (seconds) below which no other table's pass starts (delta-rs: seconds a table)."""


@dataclasses.dataclass(frozen=True)
class MaintenancePass:
    """What `maintain_storage` did: each table's upkeep, and whether it stopped before every table (its lease was
    running out)."""

    results: list[TableUpkeep]
    stopped: bool = False


def maintain_storage(store: TableStore, retention_hours: float, history: HistoryRetention | None = None,
                     monotonic: Callable[[], float] = time.monotonic) -> MaintenancePass:
    """`herald maintain`: one pass over every table. A retention under `MIN_RUNNING_RETENTION_HOURS` could delete
    files a running job still reads, so that pass holds the storage path's lease (`MAINTAIN_LEASE_S`, not renewed)
    and raises `herald.storage.lease.LeaseHeld` when a job holds it; it starts no table's pass once less than
    `MAINTAIN_TABLE_S` of the lease is left (`monotonic`: seconds)."""
    if retention_hours >= MIN_RUNNING_RETENTION_HOURS:
        return MaintenancePass(maintain_tables(store, retention_hours, history=history))
    lease = StorageLease(store, ttl_s=MAINTAIN_LEASE_S)  # not renewed: no lease row is written during the pass
    lease.acquire()  # a holder whose row does not look current on this clock is watched first
    ends = monotonic() + MAINTAIN_LEASE_S - MAINTAIN_TABLE_S
    stopped: list[bool] = []

    def running_out() -> bool:  # asked before each table: its pass starts only while the lease outlasts it
        if monotonic() > ends:
            stopped.append(True)
        return bool(stopped)

    try:
        results = maintain_tables(store, retention_hours, stopping=running_out, history=history)
    finally:
        lease.release()
    return MaintenancePass(results, bool(stopped))


class PeriodicMaintenance:
    """Runs `maintain_tables` every `interval_hours` on a thread of its own until stopped, with retentions (of
    files, and of `history`) of at least `MIN_RUNNING_RETENTION_HOURS`.

    A table's pass cannot be cut short (with delta-spark on a small machine it took minutes), so `stop` lets the
    one in progress end and starts no other: a job being stopped is not held up for the whole pass."""

    def __init__(self, store: TableStore, interval_hours: float,
                 retention_hours: float = DEFAULT_RETENTION_HOURS, history: HistoryRetention | None = None) -> None:
        self.store = store
        self.interval_s = interval_hours * 3600
        self.retention_hours = max(retention_hours, MIN_RUNNING_RETENTION_HOURS)
        self.history = None if history is None else HistoryRetention(*(
            None if hours is None else max(hours, MIN_RUNNING_RETENTION_HOURS)
            for hours in (history.offsets_hours, history.history_hours)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="herald-table-maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """No table's pass starts from now on; wait up to `timeout_s` seconds (None: as long as it takes) for the
        one in progress. False when it still runs: the thread is a daemon, and the process may end under it
        without changing a row (a compaction or a checkpoint is one atomic commit or none; vacuum deletes only
        files no version within the retention reads; an unfinished pass leaves at most unreferenced files,
        which a later vacuum deletes)."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for upkeep in maintain_tables(self.store, self.retention_hours, self._stop.is_set, self.history):
                log.info("table %s: %s history row(s) deleted, %d file(s) compacted into %d, %s deleted; log %s "
                         "file(s) -> %s", upkeep.table, upkeep.rows_deleted or 0, upkeep.files_removed,
                         upkeep.files_added, upkeep.files_deleted, upkeep.log_files_before, upkeep.log_files_after)
