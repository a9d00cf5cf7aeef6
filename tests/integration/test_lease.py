"""One job per storage path: the lease in the `leases` Delta table (real tables with delta-rs; the last test runs
a second `herald run` beside a running one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from herald.storage import DeltaRsStore
from herald.storage.lease import WRITE_ATTEMPTS, LeaseHeld, StorageLease
from herald.storage.tables import LEASES
from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.lease_race import race
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber


def _lease(store, **overrides) -> StorageLease:
    return StorageLease(store, **overrides)


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


def test_a_lease_ends_when_it_expires_or_its_process_on_this_host_is_gone(tmp_path):
    store = DeltaRsStore(str(tmp_path / "storage"))
    now = [1_000_000_000_000]
    gone = _lease(store, ttl_s=30, clock_ms=lambda: now[0], alive=lambda pid: True)
    gone.acquire()
    with pytest.raises(LeaseHeld):
        _lease(store, clock_ms=lambda: now[0], alive=lambda pid: True).acquire()
    _lease(store, clock_ms=lambda: now[0], alive=lambda pid: False).acquire()  # kill -9 on this host: stale

    store2 = DeltaRsStore(str(tmp_path / "storage2"))
    elsewhere = _lease(store2, ttl_s=30, clock_ms=lambda: now[0])
    elsewhere.acquire()
    now[0] += 31_000  # not renewed for longer than its time to live
    _lease(store2, clock_ms=lambda: now[0], alive=lambda pid: True).acquire()


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

        def read(self, table, subscription_id=None):
            return store.read(table, subscription_id)

        def replace(self, table, rows, part):
            store.replace(table, rows, part)

        def append(self, table, rows):
            store.append(table, rows)
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

    def replace(self, table, rows, part):
        self._commit(rows)
        self.store.replace(table, rows, part)

    def append(self, table, rows):
        self._commit(rows)
        self.store.append(table, rows)

    def _commit(self, rows) -> None:
        self.clock.now_s += 2.0 if self.rows else 20.0
        self.rows.append(rows.to_pylist()[0])

    def read(self, table, subscription_id=None):
        return self.store.read(table, subscription_id)


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

        def read(self, table, subscription_id=None):
            return store.read(table, subscription_id)

        def replace(self, table, rows, part):
            calls.append(rows.to_pylist()[0]["released"])
            raise OSError("storage is down")

        def append(self, table, rows):
            self.replace(table, rows, None)

    lease = _lease(Refusing())
    with pytest.raises(OSError):
        lease.acquire()
    lease.release()
    assert calls == [True] * WRITE_ATTEMPTS, "release wrote after a failed first write"
    assert "giving the lease back failed" not in caplog.text


@pytest.mark.parametrize("engine", ["deltalake", "spark"])
def test_maintenance_forgets_the_rows_of_leases_that_ended_a_day_ago(engine, tmp_path, request):
    """A short job leaves three rows; a day after its lease ended (given back, or expired) they go, one commit for
    all such holders, and the rows of a lease that ended an hour ago or is live stay."""
    import time

    from herald.storage.lease import forget_ended
    from herald.storage.maintenance import maintain_tables

    if engine == "spark":
        from herald.storage.store import DELTA_SPARK_CLASS, SparkDeltaStore
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
    recent.acquire()
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
