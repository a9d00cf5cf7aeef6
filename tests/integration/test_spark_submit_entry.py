"""The spark-submit entry point (jobs/deliver.py) does what `herald run` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")
PYTHON_ENV = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}

SHOW_MASTER = """
import logging
logging.basicConfig(level=logging.WARNING)
from herald.session import get_or_create_session
spark = get_or_create_session(master="local[1]")
print("master:", spark.sparkContext.master, "cores:", spark.sparkContext.defaultParallelism)
print("speculation:", spark.sparkContext.getConf().get("spark.speculation"))
"""


def test_spark_submits_master_wins_over_herald_yaml(tmp_path):
    """spark-submit's --master is the one the job runs on; herald.yaml's (here local[1]) is ignored, and said so.
    (It was read before spark-submit's JVM was reached, found no master, and every cluster job ran on the driver.)
    Speculation stays off whatever spark-submit asks: a speculative delivery task sends its messages twice."""
    script = tmp_path / "show_master.py"
    script.write_text(SHOW_MASTER)
    result = subprocess.run([str(SPARK_SUBMIT), "--master", "local[3]", "--conf", "spark.speculation=true",
                             str(script)], capture_output=True,
                            text=True, env={**os.environ, **PYTHON_ENV}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout  # spark-submit merges its Python's stderr into its stdout
    assert "master: local[3] cores: 3" in said
    assert "spark.master local[1] in herald.yaml is ignored: spark-submit runs this job on local[3]" in said
    assert "speculation: false" in said and "spark.speculation=true from spark-submit is overridden" in said


@pytest.mark.broker
def test_spark_submit_entry_point(broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(8)])
    env = {**os.environ, **PYTHON_ENV}
    with ScriptedSubscriber() as sub:
        # no --jars: Herald's own Kafka source and delta-rs (test_dist.py runs docs/operations.md's jars with Spark's)
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"job": {"endpoint": sub.url}},
                          settings={"kafka": {"connector": "python"}, "storage": {"engine": "deltalake"}})
        result = subprocess.run([str(SPARK_SUBMIT), "--master", "local[2]", str(REPO / "jobs" / "deliver.py"),
                                 "--conf", str(conf), "--once"], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    assert sub.delivered_ids() == set(range(8))
