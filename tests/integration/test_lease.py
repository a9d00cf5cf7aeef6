"""One job per storage path: the lease in the `leases` Delta table (real tables with delta-rs; the last test runs
a second `herald run` beside a running one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from herald.storage import DeltaRsStore
from herald.storage.lease import TTL_S, WRITE_ATTEMPTS, LeaseHeld, StorageLease
from herald.storage.tables import LEASES
from tests.support.clock import FakeClock
from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.lease_race import race
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber


def _lease(store, **overrides) -> StorageLease:
    return StorageLease(store, **overrides)


class _LeaseTime(FakeClock):
    """`time` as the lease module sees it: monotonic seconds that move only on `sleep` (the lease's waits and the
    test's), and `on_sleep` called after each (what the other jobs do meanwhile)."""

    def __init__(self) -> None:
        super().__init__(wall_start_ms=1_900_000_000_000)
        self.on_sleep = lambda: None

    @staticmethod
    def time() -> float:
        import time
        return time.time()

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.on_sleep()


def _outcome(lease: StorageLease) -> str:
    try:
        lease.acquire()
    except LeaseHeld:
        return "refused"
    return "holds"



def test_a_second_job_is_refused_at_once_and_told_who_holds_the_lease(tmp_path):
    store = DeltaRsStore(str(tmp_path / "storage"))
    first, second = _lease(store), _lease(store)
    first.acquire()
    with pytest.raises(LeaseHeld) as refused:
        second.acquire()
    message = str(refused.value)
    assert f"process {first.pid} on {first.host}" in message and first.holder.rsplit(":", 1)[-1] in message
    first.release()
    second.acquire()  # given back: the next job starts at once
    second.release()


def test_a_lease_ends_when_it_expires_or_its_process_on_this_host_is_gone(tmp_path, monkeypatch):
    """Expired on the clock of the job taking it, a row not renewed is watched for its time to live first (that
    clock may be ahead): then the lease is taken. A holder on this host whose process is gone is stale at once."""
    from herald.storage import lease as lease_module
    clock = _LeaseTime()
    monkeypatch.setattr(lease_module, "time", clock)
    store = DeltaRsStore(str(tmp_path / "storage"))
    gone = _lease(store, ttl_s=30, clock_ms=clock.wall_ms, alive=lambda pid: True)
    gone.acquire()
    with pytest.raises(LeaseHeld):
        _lease(store, clock_ms=clock.wall_ms, alive=lambda pid: True).acquire()
    _lease(store, clock_ms=clock.wall_ms, alive=lambda pid: False).acquire()  # kill -9 on this host: stale

    store2 = DeltaRsStore(str(tmp_path / "storage2"))
    elsewhere = _lease(store2, ttl_s=30, clock_ms=clock.wall_ms)
    elsewhere.acquire()
    clock.sleep(31)  # not renewed for longer than its time to live
    started_s = clock.now
    _lease(store2, clock_ms=clock.wall_ms, alive=lambda pid: True).acquire()
    assert clock.now - started_s >= 30


def test_two_jobs_starting_together_end_with_exactly_one_holder(tmp_path):
    store = DeltaRsStore(str(tmp_path / "storage"))
    outcomes = race([_lease(store, settle_s=0.0) for _ in range(2)])
    assert sorted(outcomes) == ["holds", "refused"], outcomes


def test_a_job_that_finds_another_holder_at_renewal_stops(tmp_path):
    """Two jobs raced past each other (a commit slower than the settle time): the next renewal tells the later
    one, which stops."""
    store = DeltaRsStore(str(tmp_path / "storage"))
    lost: list[str] = []
    early = _lease(store)
    early.acquire()
    late = _lease(store, on_lost=lost.append)
    late._acquired_ms = late.clock_ms()  # as if its check had run before the early one's row was written
    late._write(late._acquired_ms + 30_000)
    late.renew()
    assert lost and "another job took the lease" in lost[0]
    early.renew()  # the early one keeps it


def _holder_rows(store, lease: StorageLease) -> list[bool]:
    """`released` of each of the holder's rows in the table, sorted."""
    return sorted(row["released"] for row in store.read(LEASES).to_pylist() if row["holder"] == lease.holder)


def test_a_holder_appends_its_rows_and_its_newest_row_is_where_it_stands(tmp_path):
    """Taking the lease and giving it back append rows (a tenth of a replace on delta-spark); a renewal replaces
    the holder's rows with one. The holder's newest row decides, even when the clock did not move between two of
    its writes (each row is stamped later than the one before)."""
    store = DeltaRsStore(str(tmp_path / "storage"))
    frozen_ms = 1_900_000_000_000
    lease = _lease(store, clock_ms=lambda: frozen_ms)
    lease.acquire()
    assert _holder_rows(store, lease) == [False, True]  # the live row beside the released warm-up row
    assert [h.holder for h in lease.live_holders()] == [lease.holder], "the newer live row decides"
    lease.renew()
    assert _holder_rows(store, lease) == [False]
    lease.release()
    assert _holder_rows(store, lease) == [False, True]
    assert lease.live_holders() == [], "the release, newer than the renewal, decides"
    nxt = _lease(store, clock_ms=lambda: frozen_ms)
    nxt.acquire()  # the path is free at once
    assert [h.holder for h in nxt.live_holders()] == [nxt.holder]
    nxt.release()


def test_a_row_whose_append_landed_but_raised_is_not_written_twice(tmp_path):
    """An append can commit and still raise (a failure after the log entry landed): the retry replaces the
    holder's rows instead of adding the row again."""
    store = DeltaRsStore(str(tmp_path / "storage"))

    class LandsThenRaises:
        root = store.root
        raised = 0

        def read_with_log(self, table, after_version, at_most):
            return store.read_with_log(table, after_version, at_most)

        def replace(self, table, rows, part, note=None):
            store.replace(table, rows, part, note)

        def append(self, table, rows, note=None):
            store.append(table, rows, note)
            if not self.raised:
                self.raised += 1
                raise OSError("connection reset after the commit")

    lease = _lease(LandsThenRaises())
    lease.acquire()
    assert _holder_rows(store, lease) == [False, True], "the released row is there twice"
    assert [h.holder for h in lease.live_holders()] == [lease.holder]
    lease.release()


@pytest.mark.spark
@pytest.mark.broker
def test_a_second_herald_run_on_the_same_storage_exits_at_once_naming_the_first(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": sub.url}})
        produce(broker.bootstrap_servers, topic_name, [{"i": 0}])
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: len(sub.requests) == 1, 60)
            second = subprocess.run([sys.executable, "-m", "herald", "run", "--conf", str(conf)], capture_output=True,
                                    text=True, timeout=300)
            holder = running.runner.lease
        assert running.exit_code == 0
    assert second.returncode == 1
    assert f"process {holder.pid} on {holder.host}" in second.stdout
    assert "Traceback" not in second.stdout + second.stderr
    assert len(sub.requests) == 1, "the second job delivered nothing"


class _FakeTime:
    """`time` as the lease module sees it: commits advance `monotonic` by what they cost, `sleep` is recorded."""

    def __init__(self) -> None:
        self.now_s, self.slept = 0.0, []

    def monotonic(self) -> float:
        return self.now_s

    @staticmethod
    def time() -> float:  # the wall clock the rows are stamped with
        import time
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds


class _FirstCommitSlow:
    """A store whose first commit costs 20 s (a new JVM's first delta-spark commit) and later ones 2 s."""

    def __init__(self, store, clock: _FakeTime) -> None:
        self.store, self.clock, self.rows = store, clock, []
        self.root = store.root

    def replace(self, table, rows, part, note=None):
        self._commit(rows)
        self.store.replace(table, rows, part, note)

    def append(self, table, rows, note=None):
        self._commit(rows)
        self.store.append(table, rows, note)

    def _commit(self, rows) -> None:
        self.clock.now_s += 2.0 if self.rows else 20.0
        self.rows.append(rows.to_pylist()[0])

    def read_with_log(self, table, after_version, at_most):
        return self.store.read_with_log(table, after_version, at_most)


def test_the_wait_after_taking_the_lease_is_measured_on_a_warm_commit(tmp_path, monkeypatch):
    """The job's first commit is a released row (no one counts it): the live row is written warm, and the wait
    before reading the others is two of that commit's time (4 s), not two of a cold one's (40 s)."""
    from herald.storage import lease as lease_module
    clock = _FakeTime()
    monkeypatch.setattr(lease_module, "time", clock)
    store = _FirstCommitSlow(DeltaRsStore(str(tmp_path / "storage")), clock)
    lease = _lease(store)
    lease.acquire()
    assert [row["released"] for row in store.rows] == [True, False]
    assert clock.slept == [4.0]
    assert [h.holder for h in lease._live()] == [lease.holder]
    lease._write(lease.clock_ms(), released=True)


def test_a_job_whose_first_write_failed_gives_back_nothing(tmp_path, caplog):
    """The warm-up write (a released row) failed: no live row was ever written, so `release` writes nothing and
    warns of nothing (the job's shutdown calls it whatever happened)."""
    store = DeltaRsStore(str(tmp_path / "storage"))
    calls: list[bool] = []

    class Refusing:
        root = store.root

        def read_with_log(self, table, after_version, at_most):
            return store.read_with_log(table, after_version, at_most)

        def replace(self, table, rows, part, note=None):
            calls.append(rows.to_pylist()[0]["released"])
            raise OSError("storage is down")

        def append(self, table, rows, note=None):
            self.replace(table, rows, None)

    lease = _lease(Refusing())
    with pytest.raises(OSError):
        lease.acquire()
    lease.release()
    assert calls == [True] * WRITE_ATTEMPTS, "release wrote after a failed first write"
    assert "giving the lease back failed" not in caplog.text


@pytest.mark.parametrize("engine", ["deltalake", "spark"])
def test_maintenance_forgets_the_rows_of_leases_that_ended_a_day_ago(engine, tmp_path, request, monkeypatch):
    """A short job leaves three rows; a day after its lease ended (given back, or expired and taken over) they go,
    one commit for all such holders, and the rows of a lease that ended an hour ago or is live stay."""
    import time

    from herald.storage import lease as lease_module
    from herald.storage.lease import forget_ended
    from herald.storage.maintenance import maintain_tables

    monkeypatch.setattr(lease_module, "time", _LeaseTime())  # the watch of the expired row takes no real time

    if engine == "spark":
        from herald.storage.delta_spark import DELTA_SPARK_CLASS, SparkDeltaStore
        from tests.support.herald_env import require_jars

        spark = request.getfixturevalue("spark")
        require_jars(spark, DELTA_SPARK_CLASS)
        store = SparkDeltaStore(spark, str(tmp_path / "storage"))
    else:
        store = DeltaRsStore(str(tmp_path / "storage"))
    now_ms = int(time.time() * 1000)
    day_ago, hour_ago = now_ms - 2 * 86_400_000, now_ms - 3_600_000
    given_back = _lease(store, clock_ms=lambda: day_ago)
    given_back.acquire()
    given_back.release()
    expired = _lease(store, clock_ms=lambda: day_ago + 1000)  # never given back: its row expired 90 s later
    expired.acquire()
    recent = _lease(store, clock_ms=lambda: hour_ago)
    recent.acquire()  # takes it over once it watched its row for its time to live
    recent.release()
    live = _lease(store)
    live.acquire()
    holders = lambda: {row["holder"] for row in store.read(LEASES).to_pylist()}  # noqa: E731
    assert holders() == {given_back.holder, expired.holder, recent.holder, live.holder}
    if engine == "spark":
        assert forget_ended(store, now_ms) == 2
    else:  # what `herald maintain` and a job's periodic maintenance run
        maintain_tables(store)
    assert holders() == {recent.holder, live.holder}
    assert _holder_rows(store, recent) == [False, True, True]
    assert [h.holder for h in live.live_holders()] == [live.holder]
    assert forget_ended(store, now_ms) == 0
    assert forget_ended(store, now_ms + 3 * 86_400_000) == 0, "a clock days ahead counts from the newest row"
    assert holders() == {recent.holder, live.holder}
    live.release()


# -- clocks apart: each host's wall clock may be minutes or days off the others' -------------------------------------

def test_a_job_whose_clock_is_far_ahead_takes_no_lease_from_a_live_holder(tmp_path, monkeypatch):
    """By its clock (200 s ahead, more than the 90 s to live) the holder's rows expired long ago; the holder renews
    all the while. Judged on that clock, both would hold the lease at once, for good: each one judges the other's
    rows by its own clock."""
    from herald.storage import lease as lease_module
    clock = _LeaseTime()
    monkeypatch.setattr(lease_module, "time", clock)
    store = DeltaRsStore(str(tmp_path / "storage"))
    lost: dict[str, list[str]] = {"holder": [], "ahead": []}
    holder = _lease(store, clock_ms=clock.wall_ms, on_lost=lost["holder"].append)
    ahead = _lease(store, clock_ms=lambda: clock.wall_ms() + 200_000, on_lost=lost["ahead"].append)
    holder.acquire()
    clock.on_sleep = lambda: None if lost["holder"] else holder.renew()  # the holder is alive: it renews
    outcome = _outcome(ahead)
    for _ in range(4):  # both go on renewing, as their renewal threads would
        clock.sleep(TTL_S / 3)
        if outcome == "holds" and not lost["ahead"]:
            ahead.renew()
    holding = [name for name, lease in (("holder", holder), ("ahead", ahead))
               if not lost[name] and (lease is holder or outcome == "holds")]
    assert (outcome, holding) == ("refused", ["holder"]), (outcome, holding, lost)


@pytest.mark.parametrize("skew_s", [-86_400, 200, 86_400])
def test_a_silent_holder_is_taken_over_after_its_ttl_on_the_takers_monotonic_clock(skew_s, tmp_path, monkeypatch):
    """The holder stopped renewing (its process died on another host). The taker's clock, a day behind or 200 s or
    a day ahead, neither keeps that lease alive (a day behind, its rows look fresh for a day) nor ends it early
    (ahead, they look expired at once): the taker takes it once it saw its row unchanged for the lease's time to
    live, on its own monotonic clock."""
    from herald.storage import lease as lease_module
    clock = _LeaseTime()
    monkeypatch.setattr(lease_module, "time", clock)
    store = DeltaRsStore(str(tmp_path / "storage"))
    silent = _lease(store, clock_ms=clock.wall_ms, alive=lambda pid: True)  # its process is not known to be gone
    silent.acquire()
    taker = _lease(store, clock_ms=lambda: clock.wall_ms() + skew_s * 1000, alive=lambda pid: True)
    started_s = clock.now
    taker.acquire()
    assert clock.now - started_s >= TTL_S, "taken before the taker saw the row unchanged for its time to live"
    assert [h.holder for h in taker.live_holders()] == [taker.holder]
    taker.release()


def test_a_holder_that_finds_a_later_taking_made_without_it_stops(tmp_path):
    """A job took the lease judging the holder ended (here: its process looked gone to the taker; in life: its row
    did not change for the time to live) while the holder lived on. The taking was committed after the holder's
    newest row: the holder stops at its next renewal, and the taker keeps the lease."""
    store = DeltaRsStore(str(tmp_path / "storage"))
    lost: dict[str, list[str]] = {"holder": [], "taker": []}
    holder = _lease(store, on_lost=lost["holder"].append, alive=lambda pid: True)
    holder.acquire()
    taker = _lease(store, on_lost=lost["taker"].append, alive=lambda pid: False)
    taker.acquire()
    holder.renew()
    taker.renew()
    assert lost["taker"] == [] and len(lost["holder"]) == 1, lost
    assert "another job took the lease" in lost["holder"][0]


def test_a_holder_that_stalled_for_longer_than_its_ttl_finds_the_taking_and_stops(tmp_path, monkeypatch):
    """The holder's process stalled (a long pause) for longer than the time to live: a job starting meanwhile
    watched its row unchanged that long and took the lease. When the holder comes back, its renewal finds that
    taking, committed after its newest row by a job that had seen that row: it stops, and the taker keeps it."""
    from herald.storage import lease as lease_module
    clock = _LeaseTime()
    monkeypatch.setattr(lease_module, "time", clock)
    store = DeltaRsStore(str(tmp_path / "storage"))
    lost: dict[str, list[str]] = {"stalled": [], "taker": []}
    stalled = _lease(store, clock_ms=clock.wall_ms, on_lost=lost["stalled"].append, alive=lambda pid: True)
    stalled.acquire()
    clock.sleep(TTL_S + 1)
    taker = _lease(store, clock_ms=clock.wall_ms, on_lost=lost["taker"].append, alive=lambda pid: True)
    taker.acquire()
    stalled.renew()
    taker.renew()
    assert lost["taker"] == [] and len(lost["stalled"]) == 1, lost
    assert "another job took the lease" in lost["stalled"][0]


def test_of_two_jobs_that_raced_the_first_committed_keeps_the_lease_whatever_their_clocks(tmp_path):
    """Two jobs started together and neither saw the other's row before writing its own; the later one's clock is
    an hour behind, so by `acquired_at` it took the lease first. The order of their commits decides: the one
    committed first keeps it, the later one stops at its renewal."""
    import time
    store = DeltaRsStore(str(tmp_path / "storage"))
    lost: dict[str, list[str]] = {"early": [], "late": []}
    early = _lease(store, on_lost=lost["early"].append)
    early.acquire()
    late = _lease(store, clock_ms=lambda: int(time.time() * 1000) - 3_600_000, on_lost=lost["late"].append)
    late._acquired_ms = late.clock_ms()  # as if its check had run before the early one's row was written
    late._write(late._acquired_ms + 90_000)
    early.renew()
    late.renew()
    assert lost["early"] == [] and len(lost["late"]) == 1, lost
    assert "another job took the lease" in lost["late"][0]


def test_maintenance_keeps_the_rows_of_a_live_holder_whose_clock_is_days_behind(tmp_path):
    """A job ended a minute ago on a host with a right clock; the job holding the lease now runs on a host three
    days behind. Its rows must not look ended a day ago to maintenance: deleted, the path would look free."""
    import time

    from herald.storage.lease import forget_ended

    store = DeltaRsStore(str(tmp_path / "storage"))
    now_ms = int(time.time() * 1000)
    before = _lease(store, clock_ms=lambda: now_ms - 60_000)
    before.acquire()
    before.release()
    behind = _lease(store, clock_ms=lambda: now_ms - 3 * 86_400_000)
    behind.acquire()
    assert forget_ended(store, now_ms) == 0
    assert {row["holder"] for row in store.read(LEASES).to_pylist()} == {before.holder, behind.holder}
    behind.release()
