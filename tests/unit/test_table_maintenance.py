"""Table maintenance without Spark or tables: how a running job's passes stop, the least retention they vacuum with,
and the retention `herald maintain` accepts."""

from __future__ import annotations

import threading

import pytest

from herald.storage.maintenance import MIN_RUNNING_RETENTION_HOURS, PeriodicMaintenance, maintain_tables
from herald.storage.store import TableUpkeep
from herald.storage.tables import SCHEMAS


class SlowStore:
    """Records the tables it is asked to maintain; the first pass blocks until `release` is set."""

    def __init__(self) -> None:
        self.maintained: list[str] = []
        self.retentions: list[float] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def maintain(self, table: str, retention_hours: float) -> TableUpkeep:
        self.maintained.append(table)
        self.retentions.append(retention_hours)
        self.started.set()
        self.release.wait(10)
        return TableUpkeep(table, files_removed=0, files_added=0, files_deleted=0)


def test_maintain_tables_starts_no_table_once_stopping():
    store = SlowStore()
    store.release.set()
    asked = []

    def stopping() -> bool:
        asked.append(True)
        return len(asked) > 2

    results = maintain_tables(store, 24, stopping)
    assert store.maintained == list(SCHEMAS)[:2] and [r.table for r in results] == list(SCHEMAS)[:2]
    assert len(SCHEMAS) > 2


def test_stopping_a_pass_in_progress_lets_its_table_end_and_starts_no_other():
    store = SlowStore()
    maintenance = PeriodicMaintenance(store, interval_hours=0.01 / 3600)  # a pass every 10 ms
    maintenance.start()
    assert store.started.wait(10)
    assert maintenance.stop(timeout_s=0.1) is False, "the table in progress is still being maintained"
    store.release.set()
    assert maintenance.stop(timeout_s=10) is True
    assert store.maintained == [list(SCHEMAS)[0]], "no table after the stop"


def test_a_jobs_own_maintenance_never_vacuums_files_younger_than_an_hour():
    store = SlowStore()
    store.release.set()
    maintenance = PeriodicMaintenance(store, interval_hours=0.01 / 3600, retention_hours=0)
    maintenance.start()
    assert store.started.wait(10)
    maintenance.stop(timeout_s=10)
    assert store.retentions and set(store.retentions) == {MIN_RUNNING_RETENTION_HOURS} == {1.0}


class StubMaintenance:
    """A pass that never ends while the job stops: records each `stop` call's timeout into `calls`."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def stop(self, timeout_s: float | None = None) -> bool:
        self.calls.append(("maintenance.stop", timeout_s))
        return False


class StubLease:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def release(self) -> None:
        self.calls.append(("lease.release", None))


def test_a_job_stopping_asks_maintenance_first_and_gives_the_lease_back_after_its_last_wait(tmp_path):
    from herald.config import load_config
    from herald.engine.runner import Runner
    from tests.support.herald_env import write_conf

    runner = Runner(load_config(write_conf(tmp_path, "127.0.0.1:9", "g.t", {"s": {"endpoint": "http://x/"}})))
    calls: list = []
    runner.maintenance, runner.lease = StubMaintenance(calls), StubLease(calls)
    runner.shutdown(grace_s=0.0)
    assert calls == [("maintenance.stop", 0.0), ("maintenance.stop", 5.0), ("lease.release", None)], \
        "no pass starts once stopping; the table in progress gets at least 5 s; then the lease goes back"


def test_a_second_ctrl_c_during_the_last_wait_still_gives_the_lease_back(tmp_path):
    from herald.config import load_config
    from herald.engine.runner import Runner
    from tests.support.herald_env import write_conf

    class Interrupted(StubMaintenance):
        def stop(self, timeout_s: float | None = None) -> bool:
            super().stop(timeout_s)
            if timeout_s:
                raise KeyboardInterrupt
            return False

    runner = Runner(load_config(write_conf(tmp_path, "127.0.0.1:9", "g.t", {"s": {"endpoint": "http://x/"}})))
    calls: list = []
    runner.maintenance, runner.lease = Interrupted(calls), StubLease(calls)
    with pytest.raises(KeyboardInterrupt):
        runner.shutdown(grace_s=0.0)
    assert calls[-1] == ("lease.release", None)


@pytest.mark.parametrize("given", ["-1", "nan", "an hour"])
def test_herald_maintain_refuses_a_retention_that_is_no_number_of_hours(given, capsys):
    from herald.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["maintain", "--conf", "conf", "--retention-hours", given])
    assert "--retention-hours" in capsys.readouterr().err


def test_herald_maintain_takes_zero_hours_for_tables_no_job_runs_on():
    from herald.cli.parser import build_parser

    assert build_parser().parse_args(["maintain", "--conf", "conf", "--retention-hours", "0"]).retention_hours == 0.0


class Quoting:
    def quote(self, column: str) -> str:
        return f'"{column}"'


def test_history_predicates_name_every_key_and_stay_within_their_bounds():
    """delta-rs parses a predicate recursively (a few thousand OR terms crashed the process): many keys make more
    predicates, each naming its keys exactly, with at most MAX_TERMS terms and MAX_VALUES values."""
    from herald.storage.history import MAX_TERMS, MAX_VALUES, predicates

    groups = {(f"g.t.s{n}", "g.t", 1_800_000_000_000_000 + n): [n % 12] for n in range(450)}
    groups[("g.t.o'brien", "g.t", 1_800_000_000_000_000)] = list(range(2500))
    found = predicates(Quoting(), ("subscription", "topic", "partition"), "committed_at", groups)
    assert len(found) == 3
    assert all(p.count(" OR ") + 1 <= MAX_TERMS and p.count(",") + p.count(" IN (") <= MAX_VALUES for p in found)
    text = " OR ".join(found)
    assert text.count("\"subscription\" = 'g.t.s") == 450 and "'g.t.o''brien'" in text
    assert "\"committed_at\" < '2027-01-15T08:00:00.000449Z'" in text, "bounds to the microsecond, in UTC"


def test_a_jobs_own_maintenance_keeps_an_hour_of_history_at_least():
    from herald.storage.history import HistoryRetention

    maintenance = PeriodicMaintenance(SlowStore(), interval_hours=1, history=HistoryRetention(0.1, None))
    assert maintenance.history == HistoryRetention(offsets_hours=MIN_RUNNING_RETENTION_HOURS, history_hours=None)


def test_a_pass_under_an_hour_holds_the_lease_and_stops_before_it_runs_out(tmp_path):
    """`herald maintain --retention-hours 0.5`: the pass takes the storage path's lease, starts no table's pass
    once less than MAINTAIN_TABLE_S of it is left (on the injected monotonic clock, seconds), and gives it back."""
    from herald.storage import DeltaRsStore
    from herald.storage.lease import StorageLease
    from herald.storage.maintenance import MAINTAIN_LEASE_S, MAINTAIN_TABLE_S, maintain_storage

    store = DeltaRsStore(str(tmp_path / "storage"))
    readings = iter([0.0, 1.0, MAINTAIN_LEASE_S - MAINTAIN_TABLE_S + 1.0])  # start, first table, second table

    done = maintain_storage(store, 0.5, monotonic=lambda: next(readings))
    assert done.stopped and [result.table for result in done.results] == [next(iter(SCHEMAS))]
    lease = StorageLease(store)
    lease.acquire()  # given back: a job may take it at once
    lease.release()


def test_a_pass_under_an_hour_is_refused_while_a_job_holds_the_lease(tmp_path):
    from herald.storage import DeltaRsStore
    from herald.storage.lease import LeaseHeld, StorageLease
    from herald.storage.maintenance import maintain_storage

    store = DeltaRsStore(str(tmp_path / "storage"))
    job = StorageLease(store)
    job.acquire()
    try:
        with pytest.raises(LeaseHeld):
            maintain_storage(store, 0.5)
        assert maintain_storage(store, MIN_RUNNING_RETENTION_HOURS).results, "an hour or more needs no lease"
    finally:
        job.release()
