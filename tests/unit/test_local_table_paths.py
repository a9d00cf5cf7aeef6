"""Which storage paths maintenance counts files of on the local disk: a plain path and the `file:` URIs Hadoop and
users write; never a remote one (listing it would cost requests)."""

from __future__ import annotations

import pytest

from herald.storage.local_files import local_path, log_files


@pytest.mark.parametrize(("path", "local"), [
    ("/data/herald", "/data/herald"),
    ("relative/herald", "relative/herald"),
    ("file:///data/herald", "/data/herald"),
    ("file:/data/herald", "/data/herald"),  # as Hadoop qualifies file:///data/herald
    ("file://localhost/data/my%20herald", "/data/my herald"),
    ("file://other-host/data/herald", None),
    ("s3a://bucket/herald", None),
    ("abfss://c@account.dfs.core.windows.net/herald", None),
    ("dbfs:/herald", None),
])
def test_a_local_path_is_told_from_a_remote_one(path, local):
    assert local_path(path) == local


def test_the_log_files_of_a_table_are_counted_under_each_way_of_writing_its_path(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    for name in ("00000000000000000000.json", "00000000000000000001.json", ".00000000000000000001.json.crc"):
        (log / name).write_text("{}")
    table = tmp_path / "t"
    assert {log_files(str(table)), log_files(f"file://{table}"), log_files(f"file:{table}")} == {2}
    assert log_files("s3a://bucket/t") is None
