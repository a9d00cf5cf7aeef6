"""Cluster use: the wheel `make dist` builds runs the job under spark-submit with `--py-files`, loaded from the
wheel itself (not from the checkout), against the embedded broker; and docs/operations.md's cluster line (Spark's Kafka
source and delta-spark given to spark-submit, `auto` in herald.yaml) delivers with them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_module_of_the_package(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(path.relative_to(REPO / "src")) for path in (REPO / "src" / "herald").rglob("*.py")}
    assert modules <= names, f"missing from the wheel: {sorted(modules - names)[:5]}"


def test_spark_submit_with_the_wheel_as_py_files(wheel, broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(6)])
    spark_submit = Path(sys.executable).with_name("spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with ScriptedSubscriber() as sub:
        # no --jars: Herald's own Kafka source and delta-rs (test_dist.py runs docs/operations.md's jars with Spark's)
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"wheel": {"endpoint": sub.url}},
                          settings={"kafka": {"connector": "python"}, "storage": {"engine": "deltalake"}})
        result = subprocess.run([str(spark_submit), "--master", "local[2]", "--py-files", str(wheel),
                                 str(REPO / "jobs" / "deliver.py"), "--conf", str(conf), "--once"],
                                capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    assert sub.delivered_ids() == set(range(6))
    # spark-submit hands the Python driver's stderr on through its stdout or stderr; the JVM writes beside it
    loaded = re.search(r"herald \S+ from (\S+)", result.stdout + result.stderr)
    assert loaded is not None, result.stderr[:3000]
    assert wheel.name in loaded.group(1), f"the job did not load Herald from the wheel: {loaded.group(1)}"


# delta-spark's first commits in a cold JVM take a minute each on a loaded 2-core machine, and the lease waits twice
# its first commit before it reads the others' (herald.storage.lease): 8-10 minutes were measured at load 15
@pytest.mark.timeout(1500)
def test_spark_submit_with_the_readmes_jars_delivers_with_sparks_kafka_source_and_delta_spark(broker, topic_name,
                                                                                             tmp_path):
    """operations.md's `spark-submit --packages ...` line, with the same jars from `herald jars fetch`'s cache through
    `--jars` (`--packages` would resolve them from Maven at test time), and herald.yaml leaving both choices to
    `auto`: the log says Spark's Kafka source and delta-spark were picked, and delta-spark wrote the tables."""
    from herald.jars import cached_jars

    if os.environ.get("HERALD_JARS", "").lower() == "off":
        pytest.skip("HERALD_JARS=off: this run asked for no jars")
    jars = cached_jars()
    assert jars, "Spark's Kafka source and delta-spark are not cached: run `herald jars fetch` (make install)"
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(4)])
    spark_submit = Path(sys.executable).with_name("spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"cluster": {"endpoint": sub.url}},
                          settings={"kafka": {"connector": "auto"}, "storage": {"engine": "auto"}})
        result = subprocess.run([str(spark_submit), "--master", "local[2]", "--jars", ",".join(jars),
                                 str(REPO / "jobs" / "deliver.py"), "--conf", str(conf), "--once"],
                                capture_output=True, text=True, env=env, timeout=1400, cwd=tmp_path)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert sub.delivered_ids() == set(range(4))
    herald_lines = [line for line in (result.stdout + result.stderr).splitlines() if " herald." in line]
    assert any("kafka source: Spark's built-in kafka connector" in line for line in herald_lines[:3]), herald_lines
    assert any("tables: delta-spark at" in line for line in herald_lines[:3]), herald_lines
    commits = [json.loads(line)["commitInfo"] for log in sorted((tmp_path / "storage" / "tables" / "offsets" /
                                                                  "_delta_log").glob("*.json"))
               for line in log.read_text().splitlines() if '"commitInfo"' in line]
    assert commits, "no offsets were written"
    assert all(commit.get("engineInfo", "").startswith("Apache-Spark/") and "Delta-Lake/" in commit["engineInfo"]
               for commit in commits), [commit.get("engineInfo") or commit.get("clientVersion") for commit in commits]

