"""Rows of every table at known ages, as history retention tests need them (herald.storage.history): each key's
rows some hours before `CLOCK_MS`, the clock a maintenance pass is given."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from herald.engine.round.result import position_rows
from herald.engine.round.state import stored_held, stored_offsets
from herald.storage.store import TableStore
from herald.storage.tables import (
    ADVISORIES,
    ADVISORIES_SCHEMA,
    METRICS,
    METRICS_SCHEMA,
    OFFSETS,
    RETRIES,
    RETRIES_SCHEMA,
    TRACKING,
    TRACKING_SCHEMA,
    UNDELIVERED,
    UNDELIVERED_SCHEMA,
    at_ms,
)

HOUR_MS = 3_600_000
CLOCK_MS = int(dt.datetime(2026, 11, 24, 12, tzinfo=dt.timezone.utc).timestamp() * 1000)  # the pass's "now"


def ago(hours: float) -> dt.datetime:
    return at_ms(CLOCK_MS - int(hours * HOUR_MS))


def history(store: TableStore) -> None:
    """Rows of every kind, each key's rows at the given hours before CLOCK_MS, appended as rounds append them."""
    offsets = [("g.t.a", 0, [50, 40, 30]), ("g.t.a", 1, [50, 2, 1]), ("g.t.b", 0, [100]), ("g.t.b", 1, [30, 30]),
               ("g.t.b", 2, [0.5, 0.2])]
    batch = 0
    for subscription, partition, hours in offsets:
        for n, hours_ago in enumerate(hours):
            batch += 1
            store.append(OFFSETS, position_rows(subscription, "g.t", {partition: 10 * (n + 1)}, "stream:q", batch,
                                                ago(hours_ago)))
    retries = {1: [(50, "PARKED"), (40, "PARKED")], 2: [(60, "HELD"), (45, "HELD")],
               3: [(50, "PARKED"), (40, "DELIVERED")], 4: [(50, "PARKED"), (1, "DISCARDED")], 5: [(2, "PARKED")],
               6: [(30, "RELEASED")], 7: [(40, "HELD"), (40, "RELEASED")]}
    rows = [{"subscription": "g.t.a", "topic_name": "g.t", "partition": 0, "offset": offset, "state": state,
             "body": b"{}" if state == "PARKED" else None, "attempts": n + 1, "recorded_at": ago(hours_ago),
             "batch_id": n, "writer": "retry:r"}
            for offset, states in retries.items() for n, (hours_ago, state) in enumerate(states)]
    store.append(RETRIES, pa.Table.from_pylist(rows, schema=RETRIES_SCHEMA))
    store.append(METRICS, pa.Table.from_pylist([
        {"subscription": "g.t.a", "batch_id": n, "writer": "stream:q", "delivered": 1, "started_at": at,
         "finished_at": at} for n, at in enumerate([ago(30), ago(1), None])], schema=METRICS_SCHEMA))
    store.append(TRACKING, pa.Table.from_pylist([
        {"message_id": f"m{n}", "timestamp": ago(hours_ago), "subscription": "g.t.a", "batch_id": n,
         "writer": "stream:q"} for n, hours_ago in enumerate([30, 1])], schema=TRACKING_SCHEMA))
    store.append(UNDELIVERED, pa.Table.from_pylist([
        {"subscription": "g.t.a", "offset": 1, "status": "DISCARDED", "timestamp": ago(1000), "batch_id": 1,
         "writer": "stream:q"}], schema=UNDELIVERED_SCHEMA))
    store.append(ADVISORIES, pa.Table.from_pylist([
        {"type": "pinned", "subscription": "g.t.a", "pin_id": "p", "timestamp": ago(1000), "batch_id": 1,
         "writer": "priority:x"}], schema=ADVISORIES_SCHEMA))


def kept(store: TableStore) -> dict:
    def hours(at) -> float:
        return round((CLOCK_MS - int(at.timestamp() * 1000)) / HOUR_MS, 1)

    return {
        OFFSETS: sorted((r["subscription"], r["partition"], hours(r["committed_at"]))
                        for r in store.read(OFFSETS).to_pylist()),
        RETRIES: sorted((r["offset"], hours(r["recorded_at"]), r["state"]) for r in store.read(RETRIES).to_pylist()),
        METRICS: sorted(r["batch_id"] for r in store.read(METRICS).to_pylist()),
        TRACKING: sorted(r["message_id"] for r in store.read(TRACKING).to_pylist()),
    }


def standing(store: TableStore) -> tuple:
    """Where things stand, as a restart reads it: positions, HELD states, PARKED messages."""
    parked = store.latest(RETRIES, ("subscription", "partition", "offset"), "recorded_at DESC, batch_id DESC")
    return (stored_offsets(store), stored_held(store),
            sorted((r["offset"], r["attempts"]) for r in parked.to_pylist() if r["state"] == "PARKED"))
