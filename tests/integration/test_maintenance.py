"""Table upkeep with delta-rs on real Delta tables: `herald maintain` compacts the small files every round
leaves, deletes what no version needs, and changes no row."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

from herald.cli import main
from herald.engine.round.result import position_rows
from herald.storage import DeltaRsStore
from herald.storage.maintenance import PeriodicMaintenance, maintain_tables
from herald.storage.properties import table_properties
from herald.storage.store import Slice
from herald.storage.tables import OFFSETS, OFFSETS_SCHEMA
from tests.support.herald_env import write_conf
from tests.support.history_rows import CLOCK_MS, HOUR_MS, ago, history, kept, standing

NOW = dt.datetime(2026, 11, 24, tzinfo=dt.timezone.utc)


def rounds(store: DeltaRsStore, count: int) -> None:
    for batch_id in range(count):
        store.replace(OFFSETS, position_rows("g.t.s", "g.t", {p: batch_id * 10 + p for p in range(4)}, "stream:q",
                                             batch_id, NOW), Slice("stream:q", batch_id))


def data_files(root: Path) -> int:
    return sum(1 for _ in (root / "tables" / OFFSETS).glob("*.parquet"))


def test_herald_maintain_compacts_and_vacuums_without_changing_a_row(tmp_path, capsys):
    conf = write_conf(tmp_path, "127.0.0.1:9", "g.t", {"s": {"endpoint": "http://127.0.0.1:9/"}})
    storage = tmp_path / "storage"
    store = DeltaRsStore(str(storage))
    rounds(store, 30)
    before = sorted(map(tuple, (r.values() for r in store.read(OFFSETS).to_pylist())))
    assert data_files(storage) >= 30

    assert main(["maintain", "--conf", str(conf), "--retention-hours", "0", "--json"]) == 0
    report = {row["table"]: row for row in json.loads(capsys.readouterr().out)}
    assert report[OFFSETS]["files_before"] >= 30 and report[OFFSETS]["files_after"] == 1
    assert report[OFFSETS]["files_deleted"] >= 30
    assert data_files(storage) == 1
    assert sorted(map(tuple, (r.values() for r in store.read(OFFSETS).to_pylist()))) == before

    rounds(store, 2)  # the table keeps working after it
    assert store.read(OFFSETS).num_rows == 30 * 4


def test_herald_maintain_under_an_hour_refuses_while_a_job_holds_the_storage_path(tmp_path, capsys):
    """A job's reads may still need the files a compaction replaces: under an hour's retention `maintain` waits
    for no job, it refuses; an hour or more runs beside the job."""
    from herald.storage.lease import StorageLease

    conf = write_conf(tmp_path, "127.0.0.1:9", "g.t", {"s": {"endpoint": "http://127.0.0.1:9/"}})
    storage = tmp_path / "storage"
    store = DeltaRsStore(str(storage))
    rounds(store, 5)
    lease = StorageLease(store, settle_s=0.0)
    lease.acquire()
    try:
        assert main(["maintain", "--conf", str(conf), "--retention-hours", "0.5"]) == 1
        printed = capsys.readouterr().out
        assert printed.startswith("not maintained:") and f"process {lease.pid}" in printed
        assert data_files(storage) == 5, "nothing compacted"
        assert main(["maintain", "--conf", str(conf), "--retention-hours", "1", "--json"]) == 0
        report = {row["table"]: row for row in json.loads(capsys.readouterr().out)}
        assert report[OFFSETS]["files_removed"] == 5 and report[OFFSETS]["files_deleted"] == 0
    finally:
        lease.release()
    assert main(["maintain", "--conf", str(conf), "--retention-hours", "0", "--json"]) == 0, "no job any more"
    assert data_files(storage) == 1


def test_herald_maintain_under_an_hour_holds_the_lease_so_no_job_starts_during_its_pass(tmp_path, capsys,
                                                                                         monkeypatch):
    """The check above is a read: a job starting after it would run beside the pass. So the pass holds the
    storage path's lease: a job trying to start during it is refused (naming the maintain process), and may
    start once it is over."""
    from herald.storage import maintenance
    from herald.storage.lease import LeaseHeld, StorageLease

    conf = write_conf(tmp_path, "127.0.0.1:9", "g.t", {"s": {"endpoint": "http://127.0.0.1:9/"}})
    storage = tmp_path / "storage"
    rounds(DeltaRsStore(str(storage)), 5)
    real_pass = maintenance.maintain_tables
    refused: list[str] = []

    def pass_with_a_job_starting(store, hours, stopping=lambda: False, **passed):
        job = StorageLease(DeltaRsStore(str(storage)), settle_s=0.0)
        try:
            job.acquire()
        except LeaseHeld as error:
            refused.append(str(error))
        else:
            job.release()
        return real_pass(store, hours, stopping, **passed)

    monkeypatch.setattr(maintenance, "maintain_tables", pass_with_a_job_starting)
    assert main(["maintain", "--conf", str(conf), "--retention-hours", "0", "--json"]) == 0
    assert len(refused) == 1 and f"process {os.getpid()}" in refused[0], refused
    assert data_files(storage) == 1, "the pass ran to its end"
    job = StorageLease(DeltaRsStore(str(storage)), settle_s=0.0)
    job.acquire()  # the pass gave the lease back
    job.release()
    capsys.readouterr()


def test_a_retention_keeps_recent_unreferenced_files(tmp_path):
    store = DeltaRsStore(str(tmp_path))
    rounds(store, 5)
    (upkeep,) = [u for u in maintain_tables(store, retention_hours=24) if u.table == OFFSETS]
    assert upkeep.files_removed >= 5 and upkeep.files_added == 1
    assert upkeep.files_deleted == 0, "the compacted files are younger than the retention: kept for time travel"


def test_a_running_job_maintains_on_its_interval_and_keeps_files_younger_than_an_hour(tmp_path):
    """Compacted every 0.5 s; asked for a retention of 0, it still keeps the files compaction replaced: they are
    younger than the hour a job's own maintenance always keeps (the job's reads may still need them)."""
    from deltalake import DeltaTable

    store = DeltaRsStore(str(tmp_path))
    rounds(store, 6)
    table = str(tmp_path / "tables" / OFFSETS)
    maintenance = PeriodicMaintenance(store, interval_hours=0.5 / 3600, retention_hours=0)  # every 0.5 s
    maintenance.start()
    try:
        deadline = dt.datetime.now() + dt.timedelta(seconds=20)
        while len(DeltaTable(table).file_uris()) > 1 and dt.datetime.now() < deadline:
            maintenance._stop.wait(0.2)
    finally:
        maintenance.stop()
    assert len(DeltaTable(table).file_uris()) == 1, "compacted into one file"
    assert data_files(tmp_path) == 7, "the six it replaced are kept: younger than an hour"
    assert store.read(OFFSETS).num_rows == 6 * 4


def _log(root: Path) -> list[str]:
    return sorted(os.listdir(root / "tables" / OFFSETS / "_delta_log"))


def test_a_new_table_has_herald_properties_and_an_old_one_gets_them(tmp_path):
    from deltalake import DeltaTable

    rounds(DeltaRsStore(str(tmp_path / "new"), retention_hours=48), 1)
    assert DeltaTable(str(tmp_path / "new" / "tables" / OFFSETS)).metadata().configuration == \
        table_properties(OFFSETS, 48)
    old = tmp_path / "old" / "tables" / OFFSETS
    DeltaTable.create(str(old), OFFSETS_SCHEMA)  # as an older Herald created it
    rounds(DeltaRsStore(str(tmp_path / "old")), 1)
    configuration = DeltaTable(str(old)).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == "interval 168 hours"
    assert configuration["delta.checkpointInterval"] == "500"
    assert configuration["delta.dataSkippingStatsColumns"] == "subscription,writer,batch_id"


def test_maintain_writes_a_checkpoint_and_deletes_the_expired_log(tmp_path):
    store = DeltaRsStore(str(tmp_path), retention_hours=1)
    rounds(store, 6)
    hours_ago = time.time() - 3 * 3600
    for name in _log(tmp_path):  # commits older than the 1-hour log retention
        os.utime(tmp_path / "tables" / OFFSETS / "_delta_log" / name, (hours_ago, hours_ago))
    (upkeep,) = [u for u in maintain_tables(store, retention_hours=1) if u.table == OFFSETS]
    assert upkeep.log_files_before == 7 and upkeep.log_files_after == 3
    assert _log(tmp_path) == ["00000000000000000007.checkpoint.parquet", "00000000000000000007.json",
                              "_last_checkpoint"]
    assert store.read(OFFSETS).num_rows == 6 * 4


# -- history retention: old rows go, the rows that say where things stand never do ----------------------------------

def test_maintenance_deletes_history_past_the_retention_and_never_a_row_that_says_where_things_stand(tmp_path):
    """A day's retention for both: superseded rows older than a day go; the newest offsets row of each partition
    stays whatever its age (two rows of one instant both stay: neither is older), the newest retries row of a
    message stays while it is PARKED or HELD, a message whose retries ended a day ago goes whole; metrics and
    tracking rows older than a day go (a metrics row with no time stays); undelivered and advisories rows are
    never touched."""
    from herald.storage.history import HistoryRetention
    from herald.storage.tables import METRICS, RETRIES, TRACKING

    store = DeltaRsStore(str(tmp_path))
    history(store)
    before = standing(store)
    results = maintain_tables(store, 168, history=HistoryRetention(offsets_hours=24, history_hours=24),
                              now_ms=CLOCK_MS)
    assert kept(store) == {
        OFFSETS: [("g.t.a", 0, 30.0), ("g.t.a", 1, 1.0), ("g.t.a", 1, 2.0), ("g.t.b", 0, 100.0), ("g.t.b", 1, 30.0),
                  ("g.t.b", 1, 30.0), ("g.t.b", 2, 0.2), ("g.t.b", 2, 0.5)],
        RETRIES: [(1, 40.0, "PARKED"), (2, 45.0, "HELD"), (4, 1.0, "DISCARDED"), (5, 2.0, "PARKED")],
        METRICS: [1, 2],
        TRACKING: ["m1"],
    }
    assert standing(store) == before, "a restart finds the same positions, HELD states and parked messages"
    deleted = {upkeep.table: upkeep.rows_deleted for upkeep in results}
    assert deleted == {OFFSETS: 3, RETRIES: 8, METRICS: 1, TRACKING: 1, "undelivered": None, "advisories": None,
                       "leases": None, "retransmissions": None, "endpoints": None}
    assert store.read("undelivered").num_rows == 1 and store.read("advisories").num_rows == 1

    again = maintain_tables(store, 168, history=HistoryRetention(offsets_hours=24, history_hours=24),
                            now_ms=CLOCK_MS)
    assert {upkeep.table: upkeep.rows_deleted for upkeep in again if upkeep.rows_deleted} == {}, "nothing left to do"


def test_each_retention_applies_to_its_own_tables_and_none_keeps_everything(tmp_path):
    from herald.storage.history import HistoryRetention
    from herald.storage.tables import METRICS, RETRIES, TRACKING

    store = DeltaRsStore(str(tmp_path))
    history(store)
    everything = kept(store)
    maintain_tables(store, 168, history=HistoryRetention(offsets_hours=None, history_hours=None), now_ms=CLOCK_MS)
    assert kept(store) == everything
    maintain_tables(store, 168, history=HistoryRetention(offsets_hours=1, history_hours=None), now_ms=CLOCK_MS)
    left = kept(store)
    assert left[OFFSETS] == [("g.t.a", 0, 30.0), ("g.t.a", 1, 1.0), ("g.t.b", 0, 100.0), ("g.t.b", 1, 30.0),
                             ("g.t.b", 1, 30.0), ("g.t.b", 2, 0.2), ("g.t.b", 2, 0.5)]
    assert {table: left[table] for table in (RETRIES, METRICS, TRACKING)} == \
        {table: everything[table] for table in (RETRIES, METRICS, TRACKING)}


def test_a_clock_ahead_of_the_tables_does_not_age_their_rows(tmp_path):
    """`herald maintain` on a host whose clock is ten days ahead: "older than a day" counts from the table's newest
    row, not from that clock, so nothing younger than a day before it goes (lease.forget_ended does the same)."""
    from herald.storage.history import HistoryRetention

    store = DeltaRsStore(str(tmp_path))
    history(store)
    maintain_tables(store, 168, history=HistoryRetention(offsets_hours=24, history_hours=24),
                    now_ms=CLOCK_MS + 240 * HOUR_MS)
    assert ("g.t.a", 1, 2.0) in kept(store)[OFFSETS], "2 h before the newest row: younger than a day"


def test_a_shared_reads_newest_micro_batch_keeps_its_offsets_rows_however_old(tmp_path):
    """A micro-batch written whole and not committed by Spark before a crash is replayed at the restart; the
    replay asks the offsets table whether that batch was recorded (`TopicPipeline._recorded_before`) and, finding
    no row, records it again as an empty round, whose slices replace the batch's undelivered rows. So the newest
    micro-batch of the topic's newest shared read keeps its offsets rows past the retention, even when later
    catch-up rounds superseded them and the job stayed down longer than offsetsRetentionHours. Only those: an
    older read's (its checkpoint is gone) and older batches go, and so do later superseded rows."""
    from herald.storage.history import HistoryRetention

    store = DeltaRsStore(str(tmp_path))
    old_read, read = "stream:q0:g.t", "stream:q1:g.t"
    store.append(OFFSETS, position_rows("g.t.a", "g.t", {0: 3, 1: 3}, old_read, 40, ago(50)))  # before a regroup
    store.append(OFFSETS, position_rows("g.t.a", "g.t", {0: 5, 1: 5}, read, 5, ago(31)))  # an older batch
    store.append(OFFSETS, position_rows("g.t.a", "g.t", {0: 8, 1: 9}, read, 6, ago(30)))
    store.append(OFFSETS, position_rows("g.t.a", "g.t", {0: 15, 1: 15}, "catchup:c", 1, ago(29)))  # superseded
    store.append(OFFSETS, position_rows("g.t.a", "g.t", {0: 20, 1: 20}, "catchup:c", 2, ago(2)))

    maintain_tables(store, 168, history=HistoryRetention(offsets_hours=6, history_hours=None), now_ms=CLOCK_MS)
    left = store.read(OFFSETS).to_pylist()
    assert sorted((r["writer"], r["batch_id"], r["partition"]) for r in left) == [
        ("catchup:c", 2, 0), ("catchup:c", 2, 1), (read, 6, 0), (read, 6, 1)], \
        "the positions, and the newest read's newest micro-batch"
