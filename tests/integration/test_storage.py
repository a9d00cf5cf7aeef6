"""Delta tables through delta-rs: a (writer, batch) slice is replaced whole, so a replay never doubles rows;
concurrent writers; filtered reads."""

from __future__ import annotations

import datetime as dt
import threading

from herald.engine.round.result import position_rows
from herald.storage import DeltaRsStore
from herald.storage.store import Slice
from herald.storage.tables import OFFSETS
from tests.support.rounds import TOPIC, job, micro_batch, report

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


# -- a position row only when the position moves (real pipeline code, real Delta tables, no Spark) ------------------

PARTITIONS = 12


def _offsets_rows(pipeline) -> list[dict]:
    assert pipeline.context.writer.flush(30)
    return pipeline.context.store.read(OFFSETS).to_pylist()


def _stored_equal_to_live(pipeline) -> None:
    from herald.engine.round.state import StateBook, stored_positions

    stored = stored_positions(pipeline.context.store)
    for state in pipeline.states.values():
        assert stored[(state.id, TOPIC)] == state.positions, state.id
        again = StateBook(pipeline.context.store, pipeline.context.writer).state_for(
            state.subscription, TOPIC, {p: (100, 100) for p in range(PARTITIONS)})
        assert again.positions == state.positions, "a restart goes on from the same positions"


def test_catch_up_rounds_that_move_no_position_write_no_offsets_row(tmp_path):
    """A subscriber that holds everything back: 40 catch-up rounds of both subscriptions read 100..110 of partition
    0 and attempt nothing. Their positions stay where they are, and so do the tables: no offsets row is added
    (each round used to add one per subscription and partition it covered)."""
    from herald.engine.round import steps
    from herald.engine.round.result import CATCHUP, RoundResult

    pipeline = job(tmp_path)
    context, states = pipeline.context, list(pipeline.states.values())
    before = len(_offsets_rows(pipeline))
    assert before == 2 * PARTITIONS, "where each subscription started"
    ranges = {0: (100, 110)}
    for batch_id in range(1, 41):
        with pipeline.lock:
            for state in states:
                state.busy = True
            members = steps.participants(context, enumerate(states), pipeline.retries.parked_count)
        results = steps.delivered(context, TOPIC, members, ranges, [report(ranges, range(2), stuck=True)])
        with pipeline.lock:
            stamp = pipeline.apply(members, results)
        steps.record(context, RoundResult(CATCHUP, f"catchup:{context.run_id}:{TOPIC}", batch_id, TOPIC, "test",
                                          results, pipeline.topic_id), 0.0, stamp, park=pipeline.retries.park)
    assert len(_offsets_rows(pipeline)) == before, "no round moved a position"
    assert all(state.positions == {p: 100 for p in range(PARTITIONS)} for state in states)
    _stored_equal_to_live(pipeline)
    assert len(context.store.read("metrics").to_pylist()) == 2 * 40, "the rounds themselves are recorded"


def test_a_micro_batch_writes_the_positions_it_moved_and_no_other(tmp_path):
    """Sparse traffic: every micro-batch of the 12-partition topic has records in one partition only. Each round
    writes one offsets row per subscription (the partition that moved), not twelve; the newest rows are the
    positions, and a restart reads exactly them."""
    pipeline = job(tmp_path)
    before = len(_offsets_rows(pipeline))
    frontier = {p: 100 for p in range(PARTITIONS)}
    for batch_id in range(20):
        busy = batch_id % 3  # a different partition now and then
        ranges = {p: (end, end + (10 if p == busy else 0)) for p, end in frontier.items()}
        micro_batch(pipeline, batch_id, ranges, range(2))
        frontier = {p: end for p, (_, end) in ranges.items()}
    rows = _offsets_rows(pipeline)
    assert len(rows) - before == 2 * 20, "one row per subscription and round: the partition it moved"
    assert {row["partition"] for row in rows if row["batch_id"] >= 0} == {0, 1, 2}
    assert all(state.positions == frontier for state in pipeline.states.values())
    _stored_equal_to_live(pipeline)


def test_a_replayed_micro_batch_that_moved_no_position_is_delivered_again_and_one_that_did_is_skipped(tmp_path):
    """The replay check (`TopicPipeline._recorded_before`) looks for the batch's offsets rows. A batch that moved no
    position has none now: its replay is delivered again, which is what the next round would have done (its
    subscriptions are still at its start); a batch that moved one is skipped as before."""
    pipeline = job(tmp_path)
    writer = f"stream:{TOPIC}"
    ranges = {p: (100, 110 if p == 0 else 100) for p in range(PARTITIONS)}
    batch = pipeline.begin_batch(7, ranges, writer, tasks=1, may_replay=False)
    pipeline.finish_batch(batch, lambda: [report(ranges, range(2), stuck=True)])
    _offsets_rows(pipeline)

    again = job(tmp_path)  # a new process on the same tables
    replay = again.begin_batch(7, ranges, writer, tasks=1)
    assert replay is not None and len(replay.participants) == 2, "delivered again to both subscriptions"
    again.finish_batch(replay, lambda: [report(ranges, range(2))])  # this time it delivers
    _offsets_rows(again)
    assert job(tmp_path).begin_batch(7, ranges, writer, tasks=1) is None, "its positions are written: skipped"


def test_a_topic_id_learnt_is_written_once_though_no_position_moves(tmp_path):
    """The offsets rows name the Kafka topic id their positions are in (engine/round/resets.py reads it at a restart).
    An id the job learns (rows written before it was known name none) is written with the next round's
    positions, moved or not; then rounds that move nothing write nothing again."""
    from herald.engine.round.state import stored_offsets

    pipeline = job(tmp_path)
    pipeline.check_log({p: (100, 100) for p in range(PARTITIONS)}, "id-1")
    frontier = {p: 100 for p in range(PARTITIONS)}
    for batch_id in range(3):
        ranges = {p: (end, end + (10 if p == 0 and batch_id == 0 else 0)) for p, end in frontier.items()}
        micro_batch(pipeline, batch_id, ranges, range(2))
        frontier = {p: end for p, (_, end) in ranges.items()}
    rows = _offsets_rows(pipeline)
    assert len(rows) == 2 * PARTITIONS * 2, "the start rows, then every position once, naming the id"
    positions, ids = stored_offsets(pipeline.context.store)
    assert ids == {(state.id, TOPIC): "id-1" for state in pipeline.states.values()}
    assert all(positions[(state.id, TOPIC)] == state.positions for state in pipeline.states.values())
