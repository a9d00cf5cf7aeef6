"""The Delta table properties Herald gives its tables, on both engines (docs/operations.md, "Upkeep").

Every round commits to a few tables, so what the log keeps, and for how long, is most of what the tables cost:

- `delta.logRetentionDuration` and `delta.deletedFileRetentionDuration`: `storage.maintenanceRetentionHours`
  (168) for both. Time travel needs a version's log entry and its files, so keeping one longer than the other
  buys nothing; Delta's own 30 days of log for 7 days of files kept ~620 MB of log a day for a month. Equal to the
  vacuum retention, VACUUM also passes delta-spark's retention check as it is.
- `delta.checkpointInterval` 500 (delta-spark's default is 10, delta-rs' 100): a checkpoint lists every live
  file and every tombstone younger than the retention, and every checkpoint of the retention is kept, so with a
  commit every few seconds the checkpoints cost more than the commits (storage_growth.py: 300 of 520 MB a day at
  100). The price is the replay: a reader opening a table reads up to 500 commits after the last checkpoint
  (delta-rs: 0.26 s at 450 on local disk, against 0.01 s just after a checkpoint; maintenance writes one).
- `delta.enableExpiredLogCleanup` true (both engines' default, written down): log entries and checkpoints older
  than the log retention are deleted when a checkpoint is written.
- `delta.dataSkippingStatsColumns`: statistics only for the columns Herald's writes and reads filter on (the
  slice's writer and batch_id, the subscription): they are repeated in every add action of the log and in
  every checkpoint, and a table like metrics has 26 columns.

The upgrade path: a table created by an older Herald (or with another retention) gets them when a store first
writes or maintains it (`missing_properties`; one commit, only when something differs).
"""

from __future__ import annotations

import math

from herald.storage.tables import SCHEMAS

CHECKPOINT_INTERVAL = 500
MIN_LOG_RETENTION_HOURS = 1
"""The least log retention a table gets, whatever retention a store is built with (herald.yaml asks for at least
an hour; stores built directly, as benchmarks and tests do, may ask for less): a shorter one would let a writer's
log cleanup delete the versions a reader is still listing."""

_STATS_COLUMNS = ("subscription", "holder", "writer", "batch_id")


def retention_interval(retention_hours: float) -> str:
    """A Delta interval of whole hours, at least `MIN_LOG_RETENTION_HOURS`."""
    return f"interval {max(MIN_LOG_RETENTION_HOURS, math.ceil(retention_hours))} hours"


def stats_columns(table: str) -> str:
    names = set(SCHEMAS[table].names)
    return ",".join(name for name in _STATS_COLUMNS if name in names)


def table_properties(table: str, retention_hours: float) -> dict[str, str]:
    """The properties `table` is created with, for `storage.maintenanceRetentionHours` = `retention_hours`."""
    retention = retention_interval(retention_hours)
    return {
        "delta.logRetentionDuration": retention,
        "delta.deletedFileRetentionDuration": retention,
        "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
        "delta.enableExpiredLogCleanup": "true",
        "delta.dataSkippingStatsColumns": stats_columns(table),
    }


def missing_properties(table: str, retention_hours: float, current: dict[str, str]) -> dict[str, str]:
    """The properties `table` should have and does not (or has with another value)."""
    wanted = table_properties(table, retention_hours)
    return {key: value for key, value in wanted.items() if current.get(key) != value}

