"""Turning the Arrow rows Spark hands a task into the sender's input (no Spark needed)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from herald.delivery.input import Prefetcher, arrow_input
from herald.delivery.message import message_id

HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])


def arrow_batch(rows: list[dict], avro: bool = False) -> pa.RecordBatch:
    columns = {
        "partition": pa.array([r["partition"] for r in rows], pa.int32()),
        "offset": pa.array([r["offset"] for r in rows], pa.int64()),
        "timestamp": pa.array([dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc)] * len(rows),
                              pa.timestamp("us", tz="UTC")),
        "headers": pa.array([r.get("headers") for r in rows], pa.list_(HEADER)),
        "targets": pa.array([r.get("targets") for r in rows], pa.list_(pa.int32())),
        "value": pa.array([r.get("value") for r in rows], pa.binary()),
    }
    if avro:
        columns["avro"] = pa.array([r.get("avro") for r in rows], pa.binary())
        columns["error"] = pa.array([r.get("error") for r in rows], pa.string())
        columns["raw"] = pa.array([r.get("raw") for r in rows], pa.binary())
        columns["schema_id"] = pa.array([r.get("schema_id") for r in rows], pa.int32())
        columns["schema_version"] = pa.array([None] * len(rows), pa.int32())
    return pa.RecordBatch.from_pydict(columns)


def test_only_rows_that_go_somewhere_become_records_and_every_offset_is_kept():
    rows = [
        {"partition": 1, "offset": 7, "targets": [0, 2], "value": b'{"a":1}'},
        {"partition": 1, "offset": 8, "targets": [], "value": None},
        {"partition": 0, "offset": 3, "targets": None, "value": None},
        {"partition": 0, "offset": 4, "targets": [1], "value": b"x",
         "headers": [{"key": "trace", "value": b"t"}, {"key": "id", "value": b"publisher-id-9"}]},
    ]
    (batch,) = list(arrow_input([arrow_batch(rows)], "g.t", every_lane=(0, 1, 2)))
    assert [(r.partition, r.offset, tuple(t)) for r, t in batch.rows] == [(1, 7, (0, 2)), (0, 4, (1,))]
    first, second = (r for r, _ in batch.rows)
    assert first.message_id == message_id("g.t", 1, 7, None) and first.body == b'{"a":1}'
    assert second.message_id == "publisher-id-9"
    assert first.timestamp_ms == int(dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc).timestamp() * 1000)
    assert {p: list(o) for p, o in batch.offsets.items()} == {0: [3, 4], 1: [7, 8]}
    assert batch.nbytes == sum(r.size for r, _ in batch.rows)


def test_a_record_that_could_not_be_decoded_goes_to_every_lane():
    rows = [
        {"partition": 0, "offset": 1, "targets": [], "error": "bad magic", "raw": b"\x09"},
        {"partition": 0, "offset": 2, "targets": [1], "value": b'{"j":1}', "avro": b"\x02", "schema_id": 4},
    ]
    (batch,) = list(arrow_input([arrow_batch(rows, avro=True)], "g.t", every_lane=(0, 1)))
    (bad, bad_targets), (good, good_targets) = batch.rows
    assert bad.error == "bad magic" and bad.raw == b"\x09" and tuple(bad_targets) == (0, 1)
    assert good.avro == b"\x02" and good.schema_id == 4 and tuple(good_targets) == (1,)


def test_the_prefetcher_reads_ahead_and_reads_the_rest_when_closed_early():
    consumed = []

    def source():
        for n in range(50):
            consumed.append(n)
            yield n

    reader = Prefetcher(source(), depth=2)
    reader.wait(5)
    assert reader.take() == 0
    reader.close()
    assert consumed == list(range(50)), "the rest of the input is read (Spark's worker needs it), not kept"
    assert reader.done and reader.take() is None


def test_the_prefetcher_hands_over_an_error_of_the_input():
    def source():
        yield 1
        raise ValueError("broken input")

    reader = Prefetcher(source())
    taken = []
    try:
        while not reader.done:
            reader.wait(1)
            item = reader.take()
            if item is not None:
                taken.append(item)
    except ValueError as error:
        assert str(error) == "broken input"
    else:
        raise AssertionError("the error was not raised")
    assert taken == [1]
