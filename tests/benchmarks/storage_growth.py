"""Benchmark: what a day of rounds leaves in the tables and their logs, after maintenance (issue 15, section 7).

    .venv/bin/python tests/benchmarks/storage_growth.py [--commits N] [--rounds-per-commit C] [--no-spark]

The job of the issue: 10 subscriptions on one topic of 4 partitions, a round a second, all day. Each round
writes 40 `offsets` rows and 10 `metrics` rows (the two tables every round writes), and the job's lease is
renewed every 30 s (one `leases` commit). A delta-spark commit takes seconds on 2 cores, so a day (86,400
rounds) cannot be written here: the script writes N commits of C rounds each per table through Herald's own
store (`SparkDeltaStore`, then `DeltaRsStore`; C: what the table writer gathers at `storage.commitIntervalMs`),
runs Herald's maintenance on them (`store.maintain`: compaction, vacuum, checkpoint, log cleanup), and measures
per commit what Delta wrote (the commit's JSON, delta-spark's `.crc` checksum file, the data file) and what a
commit's rows take once compacted. A scratch table of 120 files, checkpointed live and then compacted, gives
what a checkpoint costs per live file and per tombstone it lists. The day is then these measures times the
day's commits, with the tables' properties as Herald sets them (`herald.storage.properties`) and the
storage settings' defaults (maintenance every 6 h, retention 168 h):

- commits: 86,400 / C per round table, 8,640 for leases; a checkpoint every `delta.checkpointInterval` commits,
  listing the files written since the last maintenance pass (half an interval's on average) and the
  tombstones of the files compaction removed within the retention (for a retention of a day or more: half a
  day's files on average);
- after the day's last maintenance pass: the compacted data; the compacted copies earlier passes wrote and later
  ones replaced (each at most 16 MB), kept the retention long; and every small file, commit, checksum and
  checkpoint younger than the retention (`storage.maintenanceRetentionHours`, which the log and deleted-file
  retentions are), capped at the day.

No clock is faked: with retentions of a day or more nothing of the day expires in it, so the day is what was
written in it; shorter retentions keep their share. Hadoop's local `.*.crc` side files are not counted (object
stores have none). It prints, per engine and table, the measures, and the lines

    storage: MB per day X (delta-spark)
    storage: MB per day Y (delta-rs)

and their parts: data kept (the day's rows, compacted: all that outlives the retention), small files and
compactions kept (for time travel), log (commits and checksums), checkpoints.
Target (issue 15): X at most 100. It also prints the same day with a 6-hour retention. Nothing is asserted; it
is not collected by pytest. Takes 3-5 minutes on 2 idle cores (much longer when other JVMs share them), most of
it delta-spark commits and maintenance.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from herald.config.settings import StorageSettings  # noqa: E402
from herald.engine.round.result import position_rows  # noqa: E402
from herald.storage.lease import RENEW_S, TTL_S  # noqa: E402
from herald.storage.properties import CHECKPOINT_INTERVAL  # noqa: E402
from herald.storage.store import COMPACT_TARGET_BYTES, DEFAULT_RETENTION_HOURS, Slice, Slices, TableStore  # noqa: E402
from herald.storage.tables import LEASES, LEASES_SCHEMA, METRICS, METRICS_SCHEMA, OFFSETS  # noqa: E402
from herald.storage.writer import MAX_PENDING_ROUNDS  # noqa: E402

SUBSCRIPTIONS, PARTITIONS = 10, 4
DAY_S = 86_400
LEASE_RENEW_S = RENEW_S
NOW = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)
MB = 1_000_000
SCRATCH_FILES = 120


def offsets_rows(batch_id: int) -> pa.Table:
    return pa.concat_tables([position_rows(f"bench.orders.s{i}", "bench.orders",
                                           {p: batch_id * 25 + p for p in range(PARTITIONS)}, "stream:bench.orders",
                                           batch_id, NOW) for i in range(SUBSCRIPTIONS)])


def metrics_rows(batch_id: int) -> pa.Table:
    started = NOW + dt.timedelta(seconds=batch_id)
    return pa.Table.from_pylist([{
        "subscription": f"bench.orders.s{i}", "batch_id": batch_id, "read": 100, "delivered": 97 + i % 3,
        "discarded": 0, "filtered": 3 - i % 3, "inflight": 12 + i, "attempts": 100, "timeouts": 0,
        "other_errors": 0, "codes_2xx": 100, "codes_3xx": 0, "codes_4xx": 0, "codes_5xx": 0, "rate": 812.5 + i,
        "flow_mode": "NORMAL", "flow_rate": None, "started_at": started,
        "finished_at": started + dt.timedelta(milliseconds=130 + i), "parked": 0, "kind": "stream",
        "writer": "stream:bench.orders", "batches_delivered": 0, "batches_discarded": 0, "lost": 0,
        "pending": 25 * i} for i in range(SUBSCRIPTIONS)], schema=METRICS_SCHEMA)


def lease_rows(renewal: int) -> pa.Table:
    at = NOW + dt.timedelta(seconds=LEASE_RENEW_S * renewal)
    return pa.Table.from_pylist([{
        "holder": "bench-host:4242:0f3c9a", "host": "bench-host", "pid": 4242, "acquired_at": NOW, "renewed_at": at,
        "expires_at": at + dt.timedelta(seconds=TTL_S), "released": False, "writer": "lease:bench-host:4242:0f3c9a",
        "batch_id": 0, "space": "boot-1/pid-ns-1"}], schema=LEASES_SCHEMA)


def sizes(directory: Path) -> dict[str, int]:
    """Bytes by kind: data (Parquet files of the table), json (commits), crc (delta-spark checksums),
    checkpoint; Hadoop's hidden `.name.crc` side files and `_last_checkpoint` are left out."""
    found = {"data": 0, "json": 0, "crc": 0, "checkpoint": 0}
    for path in directory.rglob("*"):
        if not path.is_file() or path.name.startswith(".") or path.name == "_last_checkpoint":
            continue
        kind = ("checkpoint" if ".checkpoint" in path.name else "json" if path.suffix == ".json"
                else "crc" if path.suffix == ".crc" else "data" if "_delta_log" not in path.parts else None)
        if kind:
            found[kind] += path.stat().st_size
    return found


@dataclass
class TableMeasure:
    table: str
    rounds_per_commit: int
    commits_per_day: float
    commits: int = 0
    written: dict[str, int] = field(default_factory=dict)  # bytes of the N commits, by kind
    compacted_per_commit: float = 0.0  # bytes a commit's rows take once compacted
    checkpoint_entries: int = 0  # the checkpoint maintenance wrote: files it lists (tombstones, 1 add)
    checkpoint_bytes: int = 0
    checkpoint_per_add: float = 0.0  # bytes per live file a checkpoint lists (from a larger scratch table)
    checkpoint_per_tombstone: float = 0.0  # and per tombstone

    def per_commit(self, kind: str) -> float:
        return self.written.get(kind, 0) / max(1, self.commits)


def write_table(store: TableStore, table: str, commits: int, rounds_per_commit: int) -> TableMeasure:
    """N commits of C rounds each (leases: N renewals of its one row), then maintenance; the table's measures."""
    per_day = DAY_S / rounds_per_commit if table != LEASES else DAY_S / LEASE_RENEW_S
    measure = TableMeasure(table, rounds_per_commit if table != LEASES else 1, per_day)
    first = (offsets_rows if table == OFFSETS else metrics_rows if table == METRICS else lease_rows)(0)
    store.replace(table, first, Slice(first.column("writer")[0].as_py(), 0))  # creates the table: not counted
    root = Path(store.path(table))
    before = sizes(root)
    for commit in range(commits):
        if table == LEASES:
            store.replace(LEASES, lease_rows(commit + 1), Slice("lease:bench-host:4242:0f3c9a", 0))
            continue
        batches = range(1 + commit * rounds_per_commit, 1 + (commit + 1) * rounds_per_commit)
        rows = pa.concat_tables([(offsets_rows if table == OFFSETS else metrics_rows)(b) for b in batches])
        parts = tuple(Slice("stream:bench.orders", b) for b in batches)
        store.replace(table, rows, parts[0] if len(parts) == 1 else Slices(parts))
    after = sizes(root)
    measure.commits = commits
    measure.written = {kind: after[kind] - before[kind] for kind in after}
    upkeep = store.maintain(table, 0)  # every replaced small file deleted: what the day's rows take compacted
    maintained = sizes(root)
    if table != LEASES:
        measure.compacted_per_commit = maintained["data"] / (commits + 1)
    else:
        measure.compacted_per_commit = 0.0  # one live row whatever the renewals
    measure.checkpoint_entries = (upkeep.files_removed or commits) + 1  # a tombstone per file compacted away, 1 add
    measure.checkpoint_bytes = newest_checkpoint(root)
    return measure


def newest_checkpoint(root: Path) -> int:
    checkpoints = sorted((root / "_delta_log").glob("*.checkpoint*.parquet"))
    return checkpoints[-1].stat().st_size if checkpoints else 0


def checkpoint(store: TableStore, table: str) -> int:
    """A checkpoint of the table's current version, outside maintenance; its bytes."""
    path = store.path(table)
    if getattr(store, "spark", None) is not None:
        store._checkpoint(path)
    else:
        from deltalake import DeltaTable

        DeltaTable(path).create_checkpoint()
    return newest_checkpoint(Path(path))


def scratch_checkpoints(store: TableStore, files: int) -> tuple[int, int, int]:
    """(files, bytes of a checkpoint listing them as live files, bytes once they are tombstones) of a scratch
    metrics table: `files` files (delta-spark: one commit of a frame of that many partitions; delta-rs: that many
    quick commits), checkpointed, then compacted (whose checkpoint lists them as tombstones)."""
    rows = pa.concat_tables([metrics_rows(b) for b in range(files)])
    spark = getattr(store, "spark", None)
    store.replace(METRICS, metrics_rows(0), Slice("stream:bench.orders", 0))  # the table, with its properties
    if spark is not None:
        spark.createDataFrame(rows).repartition(files).write.format("delta").mode("append").save(store.path(METRICS))
    else:
        for batch in range(1, files):
            store.replace(METRICS, rows.slice(batch * SUBSCRIPTIONS, SUBSCRIPTIONS),
                          Slice("stream:bench.orders", batch))
    live = checkpoint(store, METRICS)
    upkeep = store.maintain(METRICS, DEFAULT_RETENTION_HOURS)
    return upkeep.files_removed + 1, live, newest_checkpoint(Path(store.path(METRICS)))


@dataclass(frozen=True)
class Day:
    rounds_per_commit: int
    retention_hours: float
    maintenance_hours: float
    checkpoint_interval: int = CHECKPOINT_INTERVAL


def day(measures: list[TableMeasure], plan: Day) -> dict[str, float]:
    """The day's bytes left after its last maintenance, by part (see the module's docstring)."""
    kept_h = min(24.0, plan.retention_hours)  # the end of the day younger than the retentions
    passes = [plan.maintenance_hours * n for n in range(1, int(24 / plan.maintenance_hours) + 1)]
    parts = {"data kept": 0.0, "small files kept": 0.0, "compactions kept": 0.0, "log": 0.0, "checkpoints": 0.0}
    for m in measures:
        per_day = m.commits_per_day
        per_hour = per_day / 24
        compacted = per_day * m.compacted_per_commit
        parts["data kept"] += compacted
        parts["small files kept"] += per_hour * kept_h * m.per_commit("data")
        # each pass but the last rewrote the table so far (at most COMPACT_TARGET_BYTES of it): that copy stays
        parts["compactions kept"] += sum(min(compacted * h / 24, COMPACT_TARGET_BYTES) for h in passes[:-1]
                                         if 24 - h < plan.retention_hours)
        parts["log"] += per_day * (kept_h / 24) * (m.per_commit("json") + m.per_commit("crc"))
        live = per_hour * plan.maintenance_hours / 2  # files since the last pass, on average
        tombstones = per_hour * min(plan.retention_hours, 24.0) / 2 if plan.maintenance_hours < 24 else 0.0
        per_checkpoint = m.checkpoint_bytes + live * m.checkpoint_per_add + tombstones * m.checkpoint_per_tombstone
        parts["checkpoints"] += per_day * (kept_h / 24) / plan.checkpoint_interval * per_checkpoint
    return parts


def measure_engine(name: str, store: TableStore, scratch: TableStore, commits: int,
                   rounds_per_commit: int) -> list[TableMeasure]:
    started = time.monotonic()
    files, live, big = scratch_checkpoints(scratch, SCRATCH_FILES)
    print(f"{name:>11} checkpoints listing {files} files: {live} B live, {big} B as tombstones "
          f"({time.monotonic() - started:.1f} s)", flush=True)
    measures = []
    for table in (OFFSETS, METRICS, LEASES):
        started = time.monotonic()
        measure = write_table(store, table, commits if table != LEASES else max(2, commits // 2), rounds_per_commit)
        more = max(1, files - measure.checkpoint_entries)
        measure.checkpoint_per_tombstone = max(0.0, (big - measure.checkpoint_bytes) / more)
        measure.checkpoint_per_add = max(0.0, (live - measure.checkpoint_bytes) / more)
        measures.append(measure)
        print(f"{name:>11} {table:>8}: {measure.commits} commits in {time.monotonic() - started:5.1f} s; per commit "
              f"json {measure.per_commit('json'):6.0f} B, crc {measure.per_commit('crc'):6.0f} B, data file "
              f"{measure.per_commit('data'):6.0f} B; compacted {measure.compacted_per_commit:6.0f} B per commit; "
              f"checkpoint {measure.checkpoint_bytes} B, then {measure.checkpoint_per_add:.0f} B per live file, "
              f"{measure.checkpoint_per_tombstone:.0f} B per tombstone", flush=True)
    return measures


def report(name: str, measures: list[TableMeasure], plan: Day, label: str = "") -> float:
    parts = day(measures, plan)
    total = sum(parts.values()) / MB
    shown = ", ".join(f"{part} {value / MB:.1f}" for part, value in parts.items())
    print(f"storage: MB per day {total:.1f} ({name}{label}; {shown})")
    return total


def main() -> None:
    defaults = StorageSettings(path="/bench")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=3,
                        help="delta-spark commits written per round table (default 3; delta-rs writes at least 30)")
    parser.add_argument("--rounds-per-commit", type=int,
                        default=min(defaults.commitIntervalMs // 1000, MAX_PENDING_ROUNDS // 2),
                        help="rounds the table writer merges into one commit (default: storage.commitIntervalMs's "
                             "seconds at a round a second, at most half the writer's queue: 8)")
    parser.add_argument("--retention-hours", type=float, default=defaults.maintenanceRetentionHours,
                        help="storage.maintenanceRetentionHours (default 168)")
    parser.add_argument("--maintenance-hours", type=float, default=defaults.maintenanceIntervalHours,
                        help="storage.maintenanceIntervalHours (default 6)")
    parser.add_argument("--no-spark", action="store_true", help="delta-rs only")
    args = parser.parse_args()
    plan = Day(args.rounds_per_commit, args.retention_hours, args.maintenance_hours)
    work = Path(tempfile.mkdtemp(prefix="herald-storage-growth-"))
    results = {}
    try:
        if not args.no_spark:
            from herald.session import get_or_create_session
            from herald.storage.delta_spark import SparkDeltaStore

            started = time.monotonic()
            # Delta rebuilds a table's state in 50 tasks by default: minutes a commit on 2 busy cores, same bytes
            spark = get_or_create_session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                                       "spark.databricks.delta.snapshotPartitions": "2"},
                                          app_name="herald-storage-growth")
            print(f"SparkSession started in {time.monotonic() - started:.1f} s (not counted)", flush=True)
            store = SparkDeltaStore(spark, str(work / "spark"), args.retention_hours)
            scratch = SparkDeltaStore(spark, str(work / "spark-scratch"), args.retention_hours)
            results["delta-spark"] = measure_engine("delta-spark", store, scratch, args.commits,
                                                    args.rounds_per_commit)
        from herald.storage import DeltaRsStore

        store = DeltaRsStore(str(work / "rs"), retention_hours=args.retention_hours)
        scratch = DeltaRsStore(str(work / "rs-scratch"), retention_hours=args.retention_hours)
        results["delta-rs"] = measure_engine("delta-rs", store, scratch, max(args.commits, 30),
                                             args.rounds_per_commit)
        print(f"day: 10 subscriptions x 4 partitions, a round a second, {plan.rounds_per_commit} round(s) per "
              f"commit, lease renewed every {LEASE_RENEW_S} s, maintenance every {plan.maintenance_hours:g} h, "
              f"retention {plan.retention_hours:g} h, checkpoint every {plan.checkpoint_interval} commits")
        for name, measures in results.items():
            report(name, measures, plan)
        for name, measures in results.items():  # for comparison: the same day with a 6-hour retention
            report(name, measures, Day(plan.rounds_per_commit, 6, plan.maintenance_hours), ", retention 6 h")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
