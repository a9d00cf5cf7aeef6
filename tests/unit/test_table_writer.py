"""The table writer's queue: bounded (delivery waits while storage is down), in order, and never a position
written past a round it gave up. The store here fails on demand, as storage that is down would; the Delta
back-ends themselves are tested in tests/integration/test_storage.py."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pyarrow as pa

from herald.engine.round.result import position_rows
from herald.engine.upkeep.exporter import PrometheusExporter
from herald.storage.store import Slice, Slices, TableStore
from herald.storage.tables import RETRIES_SCHEMA, UNDELIVERED_SCHEMA
from herald.storage.writer import FAILING_PENDING_ROUNDS, TableWriter
from tests.support.clock import FakeClock
from tests.support.herald_env import wait_until
from tests.support.prometheus import samples


class FlakyStore(TableStore):
    """Records each (table, slice) written; raises while `down` is set."""

    def __init__(self) -> None:
        super().__init__("/nowhere")
        self.down = threading.Event()
        self.written: list[tuple[str, Slice]] = []  # replaced: (table, slice)
        self.appended: list[tuple[str, list[int]]] = []  # appended: (table, the rows' batch ids)
        self.tries = 0

    def replace(self, table: str, rows: pa.Table, part: Slice) -> None:
        self.tries += 1
        if self.down.is_set():
            raise OSError("storage unreachable")
        self.written.append((table, part))

    def append(self, table: str, rows: pa.Table) -> None:
        """Recorded as (table, "append", rows' batch ids)."""
        self.tries += 1
        if self.down.is_set():
            raise OSError("storage unreachable")
        self.appended.append((table, sorted(set(rows.column("batch_id").to_pylist()))))

    def maintain(self, table, retention_hours):  # pragma: no cover - not used
        raise NotImplementedError


def _round(n: int) -> tuple[Slice, list]:
    positions = position_rows("g.t.s", "t", {0: n}, "stream:q", n, dt.datetime.now(dt.timezone.utc))
    return Slice("stream:q", n), [("retries", RETRIES_SCHEMA.empty_table()), ("offsets", positions)]


def _discarding_round(n: int) -> tuple[Slice, list]:
    """Round `n` with an undelivered row (a message discarded), its positions last."""
    part, tables = _round(n)
    discarded = pa.Table.from_pylist([{"subscription": "g.t.s", "topic_name": "t", "partition": 0, "offset": n,
                                       "status": "DISCARDED", "reason": "Message TTL expired", "batch_id": n,
                                       "writer": part.writer}], schema=UNDELIVERED_SCHEMA)
    return part, [("undelivered", discarded), *tables]


def _flat(written: list[tuple[str, Slice | Slices]]) -> list[tuple[str, int]]:
    """(table, round) per round written: rounds queued while another was written may have been merged into
    one commit per table (`Slices`), as the writer's threads happened to run."""
    return [(table, part.batch_id) for table, piece in written for part in getattr(piece, "parts", (piece,))]


def _first_round_written(writer: TableWriter, store: FlakyStore) -> None:
    """Round 0 handed over and written (its two tables): the writer's interval starts from that write."""
    assert writer.submit(*_round(0))
    deadline = time.monotonic() + 10
    while len(store.written) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(store.written) == 2


def test_rounds_are_written_in_order_positions_last():
    store = FlakyStore()
    writer = TableWriter(store)
    for n in range(5):
        assert writer.submit(*_round(n))
    assert writer.close()
    # rounds still queued while one is written may be merged into one commit per table (Slices): flatten them
    written = _flat(store.written)
    for table in ("retries", "offsets"):
        assert [batch for name, batch in written if name == table] == list(range(5)), f"{table} out of order"
    for n in range(5):
        assert written.index(("offsets", n)) > written.index(("retries", n)), f"round {n}: position written first"


def test_new_rounds_are_appended_without_their_empty_tables_and_a_possible_replay_is_replaced():
    store = FlakyStore()
    writer = TableWriter(store)
    assert writer.submit(*_round(0))  # not known new (a query's first micro-batch): replaced, empty retries too
    assert writer.flush(30)
    for n in (1, 2):
        assert writer.submit(*_round(n), new=True)
    assert writer.close()
    assert store.written == [("retries", Slice("stream:q", 0)), ("offsets", Slice("stream:q", 0))]
    appended_batches = [batch for table, batches in store.appended for batch in batches]
    assert sorted(appended_batches) == [1, 2] and {table for table, _ in store.appended} == {"offsets"}, \
        "the empty retries tables of new rounds are no commit"


def test_a_new_round_whose_append_failed_is_written_again_as_a_replace():
    """The append may have landed before it failed: written again, it would be there twice."""
    store = FlakyStore()
    store.down.set()
    writer = TableWriter(store)
    assert writer.submit(*_round(5), new=True)
    assert wait_until(lambda: store.tries >= 1, 10)
    store.down.clear()
    assert writer.close(timeout_s=30)
    assert store.appended == [] and store.written == [("offsets", Slice("stream:q", 5))]


def test_a_new_round_written_together_with_one_that_may_replay_is_replaced_with_it():
    store = FlakyStore()
    store.down.set()  # the rounds queue up behind the first, then go together
    writer = TableWriter(store)
    assert writer.submit(*_round(0), new=True)
    assert wait_until(lambda: store.tries >= 1, 10)
    assert writer.submit(*_round(1))
    assert writer.submit(*_round(2), new=True)
    store.down.clear()
    assert writer.close(timeout_s=30)
    assert store.appended == []
    assert ("offsets", Slices((Slice("stream:q", 1), Slice("stream:q", 2)))) in store.written
    assert _flat(store.written).count(("offsets", 2)) == 1


def test_delivery_waits_while_storage_is_down_and_goes_on_when_it_is_back():
    store = FlakyStore()
    store.down.set()
    writer = TableWriter(store, max_pending=2)
    assert writer.submit(*_round(0)) and writer.submit(*_round(1))
    third = threading.Thread(target=writer.submit, args=_round(2))
    third.start()
    time.sleep(0.5)
    assert third.is_alive(), "the third round waits: two are queued and storage is down"
    assert writer.pending == 2
    store.down.clear()
    third.join(timeout=30)
    assert not third.is_alive()
    assert writer.close()
    assert [batch for table, batch in _flat(store.written) if table == "offsets"] == [0, 1, 2]
    assert writer.waited_s >= 0.4


def test_a_round_given_up_at_close_stops_every_later_round_so_no_position_passes_it():
    store = FlakyStore()
    store.down.set()
    writer = TableWriter(store, max_pending=8)
    for n in range(3):
        assert writer.submit(*_round(n))
    assert writer.close(timeout_s=0.3) is False
    store.down.clear()
    assert store.written == [], "round 0 failed; rounds 1 and 2 (with their positions) are not written after it"
    assert writer.abandoned == 3 and writer.pending == 0
    assert writer.submit(*_round(3)) is False, "a closed writer takes nothing"


def test_a_writer_thread_that_dies_gives_its_rounds_up_instead_of_leaving_flush_or_close_waiting():
    """A defect ends the writer's thread (here a BaseException from the store, which the retry loop does not take):
    the rounds it held are given up and counted, the job is told to stop (`on_failed`), a flush returns, close
    says not everything was written, and a later round is refused, as after any round given up."""

    class Defect(BaseException):
        pass

    class DyingStore(FlakyStore):
        def replace(self, table, rows, part):
            raise Defect("a bug in the writer")

    reasons: list[str] = []
    writer = TableWriter(DyingStore(), max_pending=8, on_failed=reasons.append)
    assert writer.submit(*_round(0))
    assert writer.flush(timeout_s=30), "a flush waited for a writer that is gone"
    assert reasons == ["the table writer failed"], "the job was not told to stop: it would deliver, recording nothing"
    assert writer.abandoned == 1 and writer.pending == 0
    assert writer.submit(*_round(1)) is False, "a round after a given-up one is not taken"
    assert writer.close(timeout_s=1.0) is False
    assert writer.abandoned == 2


def test_the_writer_queue_is_in_the_prometheus_scrape():
    store = FlakyStore()
    store.down.set()
    writer = TableWriter(store, max_pending=4)
    writer.submit(*_round(0))
    exporter = PrometheusExporter(0, lambda: {}, lambda topics: {}, parked=lambda sid: 0, host="127.0.0.1",
                                  writer=writer)
    exporter.start()
    try:
        found = samples(exporter)
    finally:
        exporter.stop()
        store.down.clear()
        writer.close()
    assert found[("herald_table_writer_pending_rounds", ())] == 1
    assert ("herald_table_writer_wait_seconds_total", ()) in found


def test_rounds_waiting_for_the_writer_are_written_together_one_commit_per_table_positions_last():
    from herald.storage.store import Slices

    store = FlakyStore()
    store.down.set()
    writer = TableWriter(store, max_pending=8)
    for n in range(5):
        assert writer.submit(*_round(n))
    time.sleep(0.3)  # the writer is trying the first of them; the others wait
    store.down.clear()
    assert writer.close()

    def rounds(part) -> list[int]:
        return [p.batch_id for p in part.parts] if isinstance(part, Slices) else [part.batch_id]

    assert len(store.written) <= 4, "five rounds, at most two commits per table"
    assert sorted(n for table, part in store.written if table == "offsets" for n in rounds(part)) == list(range(5))
    for index, (table, part) in enumerate(store.written):
        if table == "offsets":
            earlier = {n for name, other in store.written[:index] if name == "retries" for n in rounds(other)}
            assert set(rounds(part)) <= earlier, "a round's positions only after its retries rows"


def test_with_a_commit_interval_rounds_gather_into_one_commit_per_table():
    store = FlakyStore()
    writer = TableWriter(store, min_interval_s=0.6)
    _first_round_written(writer, store)  # the first write starts at once
    deadline = time.monotonic() + 5
    started = time.monotonic()
    for n in range(1, 4):
        assert writer.submit(*_round(n))
        time.sleep(0.05)
    while len(store.written) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    waited = time.monotonic() - started
    assert len(store.written) == 4, "rounds 1-3: one commit per table"
    assert [part.batch_id for part in store.written[2][1].parts] == [1, 2, 3]
    assert waited >= 0.4, "they waited for the interval"
    assert writer.close()


def test_a_flush_or_a_half_full_queue_ends_the_gathering_at_once():
    store = FlakyStore()
    writer = TableWriter(store, max_pending=4, min_interval_s=60)
    writer.submit(*_round(0))
    assert writer.flush(5), "a flush does not wait for the interval"
    writer.submit(*_round(1))
    writer.submit(*_round(2))  # half of max_pending: written without waiting for the interval
    deadline = time.monotonic() + 5
    while len(_flat(store.written)) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _flat(store.written)[-2:] == [("offsets", 1), ("offsets", 2)]
    writer.submit(*_round(3))
    assert writer.close(5), "a close writes what gathers"
    assert _flat(store.written)[-1] == ("offsets", 3)


def test_a_slice_handed_over_and_gathering_is_held_until_it_is_written():
    """A query restarted within the commit interval asks `holds` before reading the offsets table: the round it
    replays is still gathering, so it must count as recorded (its replay would replace the round's rows)."""
    store = FlakyStore()
    writer = TableWriter(store, min_interval_s=30.0)
    assert writer.submit(*_round(0))  # written at once: the gathering starts
    deadline = time.monotonic() + 5
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    part, tables = _round(1)
    assert writer.submit(part, tables)
    time.sleep(0.2)
    assert ("offsets", part) not in store.written and writer.holds(part)  # gathering: not in the table yet
    assert writer.flush(5.0)
    assert not writer.holds(part) and ("offsets", 1) in _flat(store.written)
    assert writer.close()


def test_a_hurried_round_ends_the_gathering():
    """Where a new `latest` subscription starts is written without waiting for the commit interval."""
    store = FlakyStore()
    writer = TableWriter(store, min_interval_s=30.0)
    assert writer.submit(*_round(0))
    deadline = time.monotonic() + 5
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.submit(*_round(1))
    time.sleep(0.2)
    assert writer.pending == 1  # gathering
    assert writer.submit(*_round(2), hurry=True)
    deadline = time.monotonic() + 5
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.pending == 0 and [b for t, b in _flat(store.written) if t == "offsets"] == [0, 1, 2]
    assert writer.close()


def test_a_round_with_a_discard_is_written_within_the_urgent_bound_not_after_the_commit_interval():
    """An operator asks why a message did not arrive: its undelivered row is in the table within seconds, whatever
    the routine rows do. A discard handed over (urgent) 1 s after a routine write began gathers what follows it for
    the urgent bound (5 s by default), then goes with them, in order, positions last; not after the minute."""
    clock = FakeClock()
    store = FlakyStore()
    writer = TableWriter(store, min_interval_s=60.0, clock=clock)
    _first_round_written(writer, store)  # the routine write begins at clock 1000: the next one is due at 1060
    clock.now += 1.0
    assert writer.submit(*_discarding_round(1), urgent=True)
    clock.now += 3.0
    assert writer.submit(*_discarding_round(2), urgent=True)  # the gathering still ends 5 s after the first
    time.sleep(0.3)
    assert writer.pending == 2, "the discards gather with what follows them for the urgent bound"
    clock.now += 2.0  # 5 s after the first discard was handed over (1001 + 5)
    assert writer.submit(*_round(3))
    assert wait_until(lambda: writer.pending == 0, 10), \
        f"5 s after a discard was handed over, {writer.pending} round(s) still wait for the 60 s commit interval"
    written = _flat(store.written)
    assert [b for table, b in written if table == "undelivered"] == [1, 2]
    assert [b for table, b in written if table == "offsets"] == [0, 1, 2, 3]
    assert written.index(("offsets", 2)) > written.index(("undelivered", 2)), "a position before its discard"
    assert writer.close()


def test_a_minute_of_rounds_gathers_into_one_commit_per_table_named_by_one_term_per_writer():
    """At the default interval a round a second is 60 rounds a commit: beyond the old 16-round queue."""
    store = FlakyStore()
    writer = TableWriter(store, min_interval_s=30.0)
    _first_round_written(writer, store)
    for n in range(1, 61):
        assert writer.submit(*_round(n))
    time.sleep(0.3)
    assert len(store.written) == 2 and writer.pending == 60, "they gather: the interval has not passed"
    assert writer.flush(10)
    assert [table for table, _ in store.written[2:]] == ["retries", "offsets"]
    merged = store.written[3][1]
    assert [part.batch_id for part in merged.parts] == list(range(1, 61))
    assert merged.predicate == ("(writer = 'stream:q' AND batch_id BETWEEN 1 AND 60 "
                                f"AND batch_id IN ({', '.join(map(str, range(1, 61)))}))")
    assert writer.close()


def test_slices_of_several_writers_name_each_writers_batches_once():
    both = Slices((Slice("stream:q", 4), Slice("catchup:r't", 7), Slice("stream:q", 3), Slice("stream:q", 4)))
    assert both.predicate == ("(writer = 'stream:q' AND batch_id BETWEEN 3 AND 4 AND batch_id IN (3, 4)) OR "
                              "(writer = 'catchup:r''t' AND batch_id = 7)")


def test_while_a_write_fails_delivery_waits_after_a_few_rounds_whatever_the_queue_holds():
    store = FlakyStore()
    store.down.set()
    writer = TableWriter(store)  # 2048 rounds' room: a gathering's, not storage being down
    for n in range(FAILING_PENDING_ROUNDS):
        assert writer.submit(*_round(n))
    deadline = time.monotonic() + 5
    while store.tries < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    blocked = threading.Thread(target=writer.submit, args=_round(FAILING_PENDING_ROUNDS))
    blocked.start()
    time.sleep(0.5)
    assert blocked.is_alive(), "storage is down: the next round waits"
    store.down.clear()
    blocked.join(timeout=30)
    assert not blocked.is_alive()
    assert writer.close()
    assert [b for table, b in _flat(store.written) if table == "offsets"] == list(range(FAILING_PENDING_ROUNDS + 1))


def test_rows_past_half_the_byte_bound_end_the_gathering_and_past_the_bound_make_submit_wait():
    store = FlakyStore()
    size = sum(rows.nbytes for _, rows in _round(0)[1])
    writer = TableWriter(store, min_interval_s=60.0, max_pending_bytes=4 * size)
    _first_round_written(writer, store)
    deadline = time.monotonic() + 5
    assert writer.submit(*_round(1))
    time.sleep(0.2)
    assert writer.pending == 1, "a quarter of the bound gathers"
    assert writer.submit(*_round(2))  # half the bound: written without waiting the minute
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [b for table, b in _flat(store.written) if table == "offsets"] == [0, 1, 2]
    assert writer.close()


def test_a_hurried_round_queued_behind_a_round_handed_twice_does_not_wait_the_interval():
    """A round handed over twice is written apart from the first copy; the gathering it would start again must not
    hold the hurried round queued behind it (its hurry was taken by the first drain)."""
    store = FlakyStore()
    writer = TableWriter(store, min_interval_s=60.0)
    _first_round_written(writer, store)
    assert writer.submit(*_round(1)) and writer.submit(*_round(1))
    assert writer.submit(*_round(2), hurry=True)
    deadline = time.monotonic() + 10
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.pending == 0, "everything written within seconds, not after the minute"
    assert [b for table, b in _flat(store.written) if table == "offsets"] == [0, 1, 1, 2]
    assert writer.close()


def test_rounds_that_do_not_write_together_are_split_in_halves_not_written_one_by_one():
    """One round whose rows do not concatenate with the others' (a column missing): the merged write is split in
    halves until that round is alone, so the others still go in a few commits (one by one, eight rounds made
    sixteen commits)."""
    store = FlakyStore()
    store.down.set()
    writer = TableWriter(store, max_pending=16)
    for n in range(8):
        part, tables = _round(n)
        if n == 5:
            tables = [(table, rows.drop_columns(["offset"]) if table == "offsets" else rows) for table, rows in tables]
        assert writer.submit(part, tables)
    time.sleep(0.3)  # the writer is trying the first of them; the others wait
    store.down.clear()
    assert writer.close()
    assert sorted(n for table, n in _flat(store.written) if table == "offsets") == list(range(8))
    assert len(store.written) <= 10, store.written


def test_a_round_handed_over_after_the_writer_closed_makes_the_run_exit_1(tmp_path, capsys):
    """A part that outlived its stop deadline hands a round to the closed writer: the writer refuses it (its
    messages are delivered again by the next run) and the run must not exit 0 as though every round were written."""
    from types import SimpleNamespace

    from herald.config import load_config
    from herald.engine.runner import Runner
    from tests.support.herald_env import write_conf

    store = FlakyStore()
    writer = TableWriter(store)
    runner = Runner(load_config(write_conf(tmp_path, "127.0.0.1:9", "g.t", {"s": {"endpoint": "http://x/"}})))
    runner.context = SimpleNamespace(writer=writer)
    assert writer.close(1.0), "nothing was handed over yet: close wrote everything"
    assert runner._exit_code(failures=0) == 0
    assert not writer.submit(*_round(7)), "a closed writer takes no round"
    assert store.written == []
    assert runner._exit_code(failures=0) == 1
    assert "the tables are behind" in capsys.readouterr().out


def test_a_micro_batch_still_delivering_when_the_writer_closes_makes_the_run_exit_1(tmp_path):
    """The read's micro-batch outlived the stop's grace period: it still delivers, and the round it hands over
    later is refused by the closed writer, maybe after the exit code was decided. Stopping says so at once."""
    import threading
    from types import SimpleNamespace

    from herald.config import load_config
    from herald.engine.runner import Runner
    from tests.support.herald_env import write_conf

    class StillDelivering:
        lock = threading.RLock()
        pipelines: dict = {}
        stopping = threading.Event()

        def __init__(self, delivering: bool) -> None:
            self.still = delivering

        def stop_read(self, grace_s: float) -> None:
            pass

        def delivering(self) -> bool:
            return self.still

    stopped = SimpleNamespace(stop=lambda: None, close=lambda: None)
    for delivering, code in ((False, 0), (True, 1)):
        runner = Runner(load_config(write_conf(tmp_path, "127.0.0.1:9", "g.t", {"s": {"endpoint": "http://x/"}})))
        runner.context = SimpleNamespace(writer=TableWriter(FlakyStore()), priority=stopped, discovery=stopped)
        runner.topics, runner.retries = StillDelivering(delivering), stopped
        runner.shutdown(grace_s=0.0)
        assert runner._exit_code(failures=0) == code
