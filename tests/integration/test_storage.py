"""Delta tables through delta-rs: idempotent per (subscription, batch), concurrent writers, filtered reads."""

from __future__ import annotations

import threading

import pyarrow as pa

from herald.storage import BatchTxn, DeltaRsStore
from herald.storage.tables import OFFSETS, offsets_rows


def rows(subscription: str, batch_id: int) -> pa.Table:
    return offsets_rows({("t", 0): batch_id * 10, ("t", 1): batch_id * 10 + 1}, subscription, batch_id)


def test_a_replayed_batch_is_written_once(tmp_path):
    store = DeltaRsStore(str(tmp_path))
    assert store.append(OFFSETS, rows("a.b.s", 0), BatchTxn("herald:a.b.s:q1", 0)) is True
    assert store.append(OFFSETS, rows("a.b.s", 0), BatchTxn("herald:a.b.s:q1", 0)) is False
    assert store.append(OFFSETS, rows("a.b.s", 1), BatchTxn("herald:a.b.s:q1", 1)) is True
    assert store.read(OFFSETS, "a.b.s").num_rows == 4
    # a new checkpoint (new query id) starts its batch ids again, and is not mistaken for a replay
    assert store.append(OFFSETS, rows("a.b.s", 0), BatchTxn("herald:a.b.s:q2", 0)) is True


def test_concurrent_subscriptions_write_the_same_tables(tmp_path):
    store = DeltaRsStore(str(tmp_path))
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for batch in range(4):
                store.append(OFFSETS, rows(f"a.b.s{n}", batch), BatchTxn(f"herald:a.b.s{n}:q", batch))
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
