"""Cluster use: the wheel `make dist` builds runs the job under spark-submit with `--py-files`, loaded from the
wheel itself (not from the checkout), against the embedded broker."""

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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("herald-*.whl")
    return built


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
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"wheel": {"endpoint": sub.url}})
        result = subprocess.run([str(spark_submit), "--master", "local[2]", "--py-files", str(wheel),
                                 str(REPO / "jobs" / "deliver.py"), "--conf", str(conf), "--once"],
                                capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    assert sub.delivered_ids() == set(range(6))
    # spark-submit hands the Python driver's stderr on through its stdout or stderr; the JVM writes beside it
    loaded = re.search(r"herald \S+ from (\S+)", result.stdout + result.stderr)
    assert loaded is not None, result.stderr[:3000]
    assert wheel.name in loaded.group(1), f"the job did not load Herald from the wheel: {loaded.group(1)}"


def test_the_databricks_job_definition_runs_the_entry_point_with_the_wheel():
    job = json.loads((REPO / "jobs" / "databricks-job.json").read_text())
    (task,) = job["tasks"]
    assert task["spark_python_task"]["python_file"] == "jobs/deliver.py"
    assert task["spark_python_task"]["source"] == "GIT"
    assert task["spark_python_task"]["parameters"][:2] == ["--conf", "conf"]
    assert any(library.get("whl", "").endswith(".whl") for library in task["libraries"])
    assert job["git_source"]["git_url"].startswith("https://")
