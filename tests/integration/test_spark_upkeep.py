"""delta-spark tables keep small as delta-rs ones do: Herald's table properties on a new table and on one an
older Herald created, and `maintain` writes a checkpoint (delta-spark only does at its 100th commit). Few
commits: each costs seconds on 2 cores."""

from __future__ import annotations

import datetime as dt
import os

import pytest
from deltalake import DeltaTable

from herald.engine.round.result import position_rows
from herald.storage.delta_spark import DELTA_SPARK_CLASS, SparkDeltaStore
from herald.storage.local_files import log_files
from herald.storage.properties import table_properties
from herald.storage.store import Slice
from herald.storage.tables import OFFSETS, OFFSETS_SCHEMA
from tests.support.herald_env import require_jars

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)


def _round(store: SparkDeltaStore, batch_id: int) -> None:
    store.replace(OFFSETS, position_rows("g.t.s", "g.t", {0: batch_id, 1: batch_id}, "stream:q", batch_id, NOW),
                  Slice("stream:q", batch_id))


def test_a_new_delta_spark_table_has_herald_properties_takes_merged_rounds_and_maintain_keeps_it_small(spark,
                                                                                                      tmp_path):
    """Herald's properties on a new table; a minute of rounds of two writers merged into one commit (`Slices`)
    and replayed replaces its own slices and no other, with no `.crc` beside a commit; `maintain` compacts,
    deletes the files no version needs (and counts them) and writes a checkpoint (delta-spark only does at its
    100th commit). One maintenance pass: each costs minutes on 2 cores."""
    import pyarrow as pa

    from herald.storage.store import Slices

    require_jars(spark, DELTA_SPARK_CLASS)
    store = SparkDeltaStore(spark, str(tmp_path), retention_hours=48)
    _round(store, 0)
    path = store.path(OFFSETS)
    configuration = DeltaTable(path).metadata().configuration
    assert {key: configuration.get(key) for key in table_properties(OFFSETS, 48)} == table_properties(OFFSETS, 48)
    assert len(DeltaTable(path).file_uris()) == 1, "a round's rows are one file"

    def rows(writer: str, batch_id: int):
        return position_rows("g.t.s", "g.t", {0: batch_id}, writer, batch_id, NOW)

    parts = Slices(tuple(Slice("stream:q", b) for b in range(1, 40)) + (Slice("catchup:r", 7),))
    merged = pa.concat_tables([rows(p.writer, p.batch_id) for p in parts.parts])
    store.replace(OFFSETS, merged, parts)
    store.replace(OFFSETS, merged, parts)  # a replay of the same rounds: its first file is replaced
    found = sorted((r["writer"], r["batch_id"]) for r in store.read(OFFSETS).to_pylist())
    assert found == sorted([("stream:q", 0)] * 2 + [(p.writer, p.batch_id) for p in parts.parts])
    log_dir = os.path.join(path, "_delta_log")
    assert not [n for n in os.listdir(log_dir) if n.endswith(".crc") and not n.startswith(".")]
    assert len(DeltaTable(path).file_uris()) == 2
    on_disk = [n for n in os.listdir(path) if n.endswith(".parquet")]
    assert len(on_disk) >= 3, "the two live files and at least the replaced one"

    upkeep = store.maintain(OFFSETS, 0)
    assert (upkeep.files_removed, upkeep.files_added) == (2, 1)
    assert upkeep.files_deleted == len(on_disk), "all but the compacted file (VACUUM's one row is the path)"
    assert [n for n in os.listdir(path) if n.endswith(".parquet")] not in ([], on_disk)
    assert len(DeltaTable(path).file_uris()) == 1
    assert any(name.endswith(".checkpoint.parquet") for name in os.listdir(log_dir))
    assert upkeep.log_files_after is not None and upkeep.log_files_before is not None
    assert sorted((r["writer"], r["batch_id"]) for r in store.read(OFFSETS).to_pylist()) == found


def test_delta_spark_deletes_the_same_history_as_delta_rs_and_keeps_where_things_stand(spark, tmp_path):
    """The history retention of a job on delta-spark (its own SQL: backtick identifiers, `DELETE`), over the rows
    test_maintenance.py checks with delta-rs: the same rows are left, read back by either engine."""
    from herald.engine.round.state import stored_parked
    from herald.storage import DeltaRsStore
    from herald.storage.history import HistoryRetention, prune
    from herald.storage.tables import METRICS, RETRIES, TRACKING
    from tests.support.history_rows import CLOCK_MS, history, kept, standing

    require_jars(spark, DELTA_SPARK_CLASS)
    written = DeltaRsStore(str(tmp_path))
    history(written)
    before = standing(written)
    store = SparkDeltaStore(spark, str(tmp_path))
    retention = HistoryRetention(offsets_hours=24, history_hours=24)
    deleted = {table: prune(store, table, retention, CLOCK_MS) for table in (OFFSETS, RETRIES, METRICS, TRACKING)}
    assert deleted == {OFFSETS: 3, RETRIES: 8, METRICS: 1, TRACKING: 1}
    assert kept(written)[RETRIES] == [(1, 40.0, "PARKED"), (2, 45.0, "HELD"), (4, 1.0, "DISCARDED"),
                                      (5, 2.0, "PARKED")]
    assert standing(written) == before == standing(store)

    def parked(where) -> list:
        return sorted((r["offset"], r["attempts"], r["body"]) for r in stored_parked(where).to_pylist())

    assert parked(store) == parked(written) == [(1, 2, b"{}"), (5, 1, b"{}")], "a start's read of the parked"


def test_a_table_an_older_herald_created_gets_the_properties_from_delta_spark(spark, tmp_path):
    require_jars(spark, DELTA_SPARK_CLASS)
    path = tmp_path / "tables" / OFFSETS
    DeltaTable.create(str(path), OFFSETS_SCHEMA)
    _round(SparkDeltaStore(spark, str(tmp_path)), 0)
    configuration = DeltaTable(str(path)).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == "interval 168 hours"
    assert configuration["delta.deletedFileRetentionDuration"] == "interval 168 hours"
    assert configuration["delta.checkpointInterval"] == "500"



@pytest.mark.parametrize("written", ["file://{root}", "file:{root}"])
def test_a_storage_path_written_as_a_file_uri_gets_its_delta_spark_tables(spark, tmp_path, written):
    """`storage.path: file:///data/herald` (a URI, as on a cluster): delta-spark's CREATE TABLE refused it, the
    location being written otherwise than Hadoop qualifies it (DELTA_AMBIGUOUS_PATHS_IN_CREATE_TABLE), so the job
    could not take its lease. The table is created, written and read back, and maintenance's count of its log
    files finds them."""
    require_jars(spark, DELTA_SPARK_CLASS)
    store = SparkDeltaStore(spark, written.format(root=tmp_path / "remote"))
    _round(store, 1)
    assert sorted(row["offset"] for row in store.read(OFFSETS).to_pylist()) == [1, 1]
    assert log_files(store.path(OFFSETS)) >= 2, "the URI's local _delta_log was counted"
    assert DeltaTable(str(tmp_path / "remote" / "tables" / OFFSETS)).version() >= 1


def test_the_checksum_setting_a_session_made_before_the_store_is_kept(spark, tmp_path):
    """A notebook that wants delta-spark's `.crc` files sets it in its session: the store leaves it alone, and
    turns it off only where nothing set it (no table is written here: the setting alone is looked at)."""
    from herald.storage.delta_spark import CHECKSUM_SETTING

    before = spark.conf.get(CHECKSUM_SETTING, None)
    try:
        spark.conf.unset(CHECKSUM_SETTING)
        SparkDeltaStore(spark, str(tmp_path / "a"))
        assert spark.conf.get(CHECKSUM_SETTING) == "false"
        spark.conf.set(CHECKSUM_SETTING, "true")
        SparkDeltaStore(spark, str(tmp_path / "b"))
        assert spark.conf.get(CHECKSUM_SETTING) == "true", "the session's own setting was overridden"
    finally:
        spark.conf.set(CHECKSUM_SETTING, before if before is not None else "false")


def test_two_jobs_taking_the_lease_of_one_delta_spark_storage_at_once_end_with_one_holder(spark, tmp_path):
    """Two jobs' lease rows race for the next commit of the leases table: Delta refuses the later one
    (ConcurrentAppendException, reproduced with two slice writers of one table). The lease writes its row again,
    so one job holds the lease and the other is told who does, instead of both failing to start."""
    from herald.storage.lease import StorageLease
    from tests.support.lease_race import race

    require_jars(spark, DELTA_SPARK_CLASS)
    store = SparkDeltaStore(spark, str(tmp_path / "storage"))
    outcomes = race([StorageLease(store) for _ in range(2)])
    assert sorted(outcomes) == ["holds", "refused"], outcomes
