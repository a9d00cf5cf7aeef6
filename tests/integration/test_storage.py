"""Delta tables through delta-rs: a (writer, batch) slice is replaced whole, so a replay never doubles rows;
concurrent writers; filtered reads."""

from __future__ import annotations

import datetime as dt
import threading

from herald.engine.rounds import position_rows
from herald.storage import DeltaRsStore
from herald.storage.store import Slice
from herald.storage.tables import OFFSETS

NOW = dt.datetime(2026, 11, 24, tzinfo=dt.timezone.utc)


def rows(subscription: str, writer: str, batch_id: int):
    return position_rows(subscription, "t", {0: batch_id * 10, 1: batch_id * 10 + 1}, writer, batch_id, NOW)


def test_a_replayed_batch_replaces_its_slice_instead_of_adding_rows(tmp_path):
    store = DeltaRsStore(str(tmp_path))
    store.replace(OFFSETS, rows("a.b.s", "topic:t", 0), Slice("topic:t", 0))
    store.replace(OFFSETS, rows("a.b.s", "topic:t", 0), Slice("topic:t", 0))
    store.replace(OFFSETS, rows("a.b.s", "topic:t", 1), Slice("topic:t", 1))
    assert store.read(OFFSETS, "a.b.s").num_rows == 4
    # another writer's batch 0 is its own slice
    store.replace(OFFSETS, rows("a.b.s", "catchup:t", 0), Slice("catchup:t", 0))
    assert store.read(OFFSETS, "a.b.s").num_rows == 6


def test_a_replay_with_fewer_rows_leaves_only_the_new_ones(tmp_path):
    store = DeltaRsStore(str(tmp_path))
    store.replace(OFFSETS, rows("a.b.s", "w", 3), Slice("w", 3))
    store.replace(OFFSETS, rows("a.b.s", "w", 3).slice(0, 1), Slice("w", 3))
    assert store.read(OFFSETS, "a.b.s").num_rows == 1


def test_concurrent_writers_write_the_same_tables(tmp_path):
    store = DeltaRsStore(str(tmp_path))
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for batch in range(4):
                store.replace(OFFSETS, rows(f"a.b.s{n}", f"w{n}", batch), Slice(f"w{n}", batch))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.read(OFFSETS).num_rows == 6 * 4 * 2
    assert store.read(OFFSETS, "a.b.s3").column("batch_id").to_pylist().count(2) == 2


def test_reading_a_table_that_does_not_exist_gives_no_rows(tmp_path):
    assert DeltaRsStore(str(tmp_path)).read(OFFSETS, "x.y.z").num_rows == 0


def test_several_rounds_replaced_in_one_commit_replace_each_of_their_slices_and_no_other(tmp_path):
    import pyarrow as pa
    from deltalake import DeltaTable

    from herald.storage.store import Slices

    store = DeltaRsStore(str(tmp_path))
    store.replace(OFFSETS, rows("a.b.s", "topic:t", 0), Slice("topic:t", 0))
    store.replace(OFFSETS, rows("a.b.s", "topic:t", 1), Slice("topic:t", 1))
    version = DeltaTable(store.path(OFFSETS)).version()
    both = Slices((Slice("topic:t", 1), Slice("catchup:t", 7)))
    store.replace(OFFSETS, pa.concat_tables([rows("a.b.s", "topic:t", 1), rows("a.b.s", "catchup:t", 7)]), both)
    store.replace(OFFSETS, pa.concat_tables([rows("a.b.s", "topic:t", 1), rows("a.b.s", "catchup:t", 7)]), both)
    assert DeltaTable(store.path(OFFSETS)).version() == version + 2, "one commit each"
    found = sorted((r["writer"], r["batch_id"]) for r in store.read(OFFSETS, "a.b.s").to_pylist())
    assert found == sorted([("topic:t", 0)] * 2 + [("topic:t", 1)] * 2 + [("catchup:t", 7)] * 2)


def test_a_minute_of_rounds_replaced_in_one_commit_leaves_the_rounds_between_them_alone(tmp_path):
    """60 rounds of one writer merged (an IN list past delta-rs' 20-value pruning limit, bounded by a range), with
    a gap: the round in the gap, written before by another commit, keeps its rows."""
    import pyarrow as pa

    from herald.storage.store import Slices

    store = DeltaRsStore(str(tmp_path))
    store.replace(OFFSETS, rows("a.b.s", "stream:q", 30), Slice("stream:q", 30))
    merged = Slices(tuple(Slice("stream:q", b) for b in range(1, 62) if b != 30) + (Slice("catchup:t", 2),))
    table = pa.concat_tables([rows("a.b.s", p.writer, p.batch_id) for p in merged.parts])
    store.replace(OFFSETS, table, merged)
    store.replace(OFFSETS, table, merged)  # replayed: replaces its own slices
    found = sorted((r["writer"], r["batch_id"]) for r in store.read(OFFSETS, "a.b.s").to_pylist())
    assert found == sorted([(p.writer, p.batch_id) for p in merged.parts] * 2 + [("stream:q", 30)] * 2)
