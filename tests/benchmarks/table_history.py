"""Benchmark: offsets rows per hour, and what a job's start reads, against a history of N rounds (issue 32, item 15).

    .venv/bin/python tests/benchmarks/table_history.py [--rounds N] [--moving K] [--parked M] [--spark]

The job: 10 subscriptions on a topic of 12 partitions, a round a second, records in K of the 12 partitions each
round (default 3: sparse traffic; 12: every partition moves every round). N rounds (default 86,400: a day) are
written through Herald's delta-rs store as the table writer writes them (60 rounds a commit, the default
storage.commitIntervalMs at a round a second), the tables compacted as a maintenance pass would, twice:

- before: every round writes an offsets row per subscription and partition of its range (the old rule), and
  nothing is ever deleted; a start reads the newest rows with `SELECT *` (the old `stored_offsets`).
- after: a round writes the positions it moved (`TopicPipeline._to_write`), a maintenance pass deletes the
  offsets history older than storage.offsetsRetentionHours (6 h by default; `--retention-hours`), and a start
  reads the columns it needs (`stored_offsets`).

The retries table gets M parked messages (default 5,000), each parked again by 10 retry rounds (a 1 KB body
every time, as a PARKED row carries), 10% still parked, 2% held, the rest ended, within the week
storage.historyRetentionHours keeps; a start reads them before with the old query (every column of every newest
row) and after with `stored_parked` and `stored_held`.

Each read is timed best of 5 (delta-rs; `--spark` adds delta-spark's, on a local[2] session, as a job on
delta-spark reads them). It prints the lines

    offsets rows per hour: before X, after Y (ratio X/Y)
    start read of offsets: before A s (R rows), after B s (S rows) (ratio A/B)
    start read of retries: before C s, after D s (ratio C/D)

and the time of the maintenance pass that deleted the history. Nothing is asserted; not collected by pytest.
Takes about a minute with the defaults on 2 cores (delta-rs only).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from herald.engine.round.state import stored_held, stored_offsets, stored_parked  # noqa: E402
from herald.storage import DeltaRsStore  # noqa: E402
from herald.storage.history import DEFAULT_OFFSETS_RETENTION_HOURS, HistoryRetention, prune  # noqa: E402
from herald.storage.store import TableStore  # noqa: E402
from herald.storage.tables import OFFSETS, OFFSETS_SCHEMA, RETRIES, RETRIES_SCHEMA  # noqa: E402

SUBSCRIPTIONS, PARTITIONS = 10, 12
ROUNDS_PER_COMMIT = 60
START = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc)
RETRY_ROUNDS = 10


def full(columns: dict, schema: pa.Schema) -> pa.Table:
    """A table of `schema` from `columns` (name -> array), the others null."""
    rows = len(next(iter(columns.values())))
    return pa.Table.from_arrays([pa.array(columns[field.name], field.type) if field.name in columns
                                 else pa.nulls(rows, field.type) for field in schema], schema=schema)


def offsets_rows(first: int, rounds: int, moving: int, every_partition: bool) -> pa.Table:
    """The offsets rows of rounds first .. first + rounds - 1 (round i at START + i s): partition p has records in
    round i when (i + p) % 12 < moving; the old rule writes every partition, the new one those that moved."""
    batch = np.repeat(np.arange(first, first + rounds), SUBSCRIPTIONS * PARTITIONS)
    subscription = np.tile(np.repeat(np.arange(SUBSCRIPTIONS), PARTITIONS), rounds)
    partition = np.tile(np.arange(PARTITIONS), rounds * SUBSCRIPTIONS)
    moved = (batch + partition) % PARTITIONS < moving
    reached = batch + partition  # rounds 0 .. i in which p moved, 10 offsets each: f(i + p) - f(p - 1)
    offset = 10 * ((reached // PARTITIONS) * moving + np.minimum(reached % PARTITIONS + 1, moving)
                   - np.minimum(partition, moving))
    keep = np.ones_like(moved) if every_partition else moved
    batch, subscription, partition, offset = batch[keep], subscription[keep], partition[keep], offset[keep]
    committed = (int(START.timestamp() * 1_000_000) + batch * 1_000_000).astype("int64")
    return full({"subscription": [f"bench.orders.s{i}" for i in subscription], "topic": ["bench.orders"] * len(batch),
                 "partition": partition, "offset": offset, "batch_id": batch,
                 "committed_at": pa.array(committed, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                 "writer": ["stream:bench.orders"] * len(batch), "topic_id": ["id-1"] * len(batch)}, OFFSETS_SCHEMA)


def write_offsets(store: TableStore, rounds: int, moving: int, every_partition: bool) -> int:
    written = 0
    for first in range(0, rounds, ROUNDS_PER_COMMIT):
        rows = offsets_rows(first, min(ROUNDS_PER_COMMIT, rounds - first), moving, every_partition)
        store.append(OFFSETS, rows)
        written += rows.num_rows
    store.maintain(OFFSETS, 0)
    return written


def write_retries(store: TableStore, messages: int, rounds: int) -> None:
    """`messages` parked, each parked again by `RETRY_ROUNDS` retry rounds spread over the history (a body each
    time); the last round leaves 10% parked, 2% held, the rest delivered."""
    rng = np.random.default_rng(7)
    bodies = [base64.b64encode(rng.bytes(750)) for _ in range(997)]  # ~1 KB, as good as incompressible
    key = np.arange(messages)
    for n in range(RETRY_ROUNDS + 1):
        last = n == RETRY_ROUNDS
        state = (["PARKED"] * messages if not last else
                 ["PARKED" if k % 10 == 0 else "HELD" if k % 50 == 1 else "DELIVERED" for k in key])
        body = [bodies[(k + n) % 997] if s == "PARKED" else None for k, s in zip(key, state)]
        at = START + dt.timedelta(seconds=rounds * n / (RETRY_ROUNDS + 1))
        store.append(RETRIES, full({
            "subscription": [f"bench.orders.s{k % SUBSCRIPTIONS}" for k in key],
            "topic_name": ["bench.orders"] * messages, "partition": key % PARTITIONS, "offset": key,
            "message_id": [f"m{k}" for k in key], "state": state,
            "message": [b.decode() if b else None for b in body], "body": body, "recorded_at": [at] * messages,
            "attempts": [n + 1] * messages, "batch_id": [n] * messages, "writer": ["retry:bench"] * messages},
            RETRIES_SCHEMA))
    store.maintain(RETRIES, 0)


def old_stored_offsets(store: TableStore):
    """The start's read of positions before: every column of every newest row."""
    rows = store.latest(OFFSETS, ("subscription", "topic", "partition"), "committed_at DESC, batch_id DESC")
    return rows.select(["subscription", "topic", "partition", "offset", "topic_id"]).to_pylist()


def old_stored_retries(store: TableStore):
    """The start's reads of parked and held messages before: twice every column of every newest row."""
    for _ in range(2):
        store.latest(RETRIES, ("subscription", "partition", "offset"), "recorded_at DESC, batch_id DESC").to_pylist()


def new_stored_retries(store: TableStore):
    stored_parked(store).to_pylist()
    stored_held(store)


def best_s(read, times: int = 5) -> float:
    best = float("inf")
    for _ in range(times):
        started = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - started)
    return best


def rows_of(store: TableStore, table: str) -> int:
    return store.select(table, f"SELECT count(*) AS n FROM {table}").column("n")[0].as_py()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=86_400, help="rounds of history, a second each (a day)")
    parser.add_argument("--moving", type=int, default=3, help="partitions of 12 with records each round")
    parser.add_argument("--parked", type=int, default=5_000, help="messages parked over the history")
    parser.add_argument("--retention-hours", type=float, default=DEFAULT_OFFSETS_RETENTION_HOURS,
                        help="storage.offsetsRetentionHours (default 6)")
    parser.add_argument("--spark", action="store_true", help="also time the reads with delta-spark")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="herald-table-history-"))
    try:
        before, after = DeltaRsStore(str(work / "before")), DeltaRsStore(str(work / "after"))
        started = time.monotonic()
        old_rows = write_offsets(before, args.rounds, args.moving, every_partition=True)
        new_rows = write_offsets(after, args.rounds, args.moving, every_partition=False)
        for store in (before, after):
            write_retries(store, args.parked, args.rounds)
        print(f"history: {args.rounds} rounds ({args.rounds / 3600:.1f} h), {SUBSCRIPTIONS} subscriptions x "
              f"{PARTITIONS} partitions, records in {args.moving} partitions a round; {args.parked} parked messages "
              f"x {RETRY_ROUNDS + 1} rows; written in {time.monotonic() - started:.0f} s", flush=True)
        hours = args.rounds / 3600
        print(f"offsets rows per hour: before {old_rows / hours:,.0f}, after {new_rows / hours:,.0f} "
              f"(ratio {old_rows / max(1, new_rows):.1f})")
        now_ms = int(START.timestamp() * 1000) + args.rounds * 1000
        started = time.monotonic()
        deleted = prune(after, OFFSETS, HistoryRetention(args.retention_hours, None), now_ms)
        pruned_s = time.monotonic() - started
        after.maintain(OFFSETS, 0)
        print(f"maintenance deleted {deleted:,} offsets rows older than {args.retention_hours:g} h in "
              f"{pruned_s:.1f} s; {rows_of(after, OFFSETS):,} left", flush=True)
        stores = [("delta-rs", before, after)]
        if args.spark:
            from herald.session import get_or_create_session
            from herald.storage.delta_spark import SparkDeltaStore

            spark = get_or_create_session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                                       "spark.databricks.delta.snapshotPartitions": "2"},
                                          app_name="herald-table-history")
            stores.append(("delta-spark", SparkDeltaStore(spark, str(work / "before")),
                           SparkDeltaStore(spark, str(work / "after"))))
        for name, old, new in stores:
            positions = {(r["subscription"], r["partition"]): r["offset"] for r in old_stored_offsets(old)}
            assert positions == {(sid, p): offset for (sid, _), by_partition in stored_offsets(new)[0].items()
                                 for p, offset in by_partition.items()}, "both give the same positions"
            read_old = best_s(lambda old=old: old_stored_offsets(old))
            read_projected = best_s(lambda old=old: stored_offsets(old))
            read_new = best_s(lambda new=new: stored_offsets(new))
            print(f"start read of offsets ({name}): before {read_old:.3f} s ({rows_of(before, OFFSETS):,} rows), "
                  f"after {read_new:.3f} s ({rows_of(after, OFFSETS):,} rows) (ratio {read_old / read_new:.1f}; "
                  f"the columns alone on the old table: {read_projected:.3f} s)")
            retries_old = best_s(lambda old=old: old_stored_retries(old))
            retries_new = best_s(lambda new=new: new_stored_retries(new))
            print(f"start read of retries ({name}): before {retries_old:.3f} s, after {retries_new:.3f} s "
                  f"(ratio {retries_old / retries_new:.1f}; {rows_of(before, RETRIES):,} rows)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
