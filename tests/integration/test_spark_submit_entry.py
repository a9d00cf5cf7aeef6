"""The spark-submit entry point (jobs/deliver.py) does what `herald run` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

REPO = Path(__file__).resolve().parents[2]


def test_spark_submit_entry_point(broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(8)])
    spark_submit = Path(sys.executable).with_name("spark-submit")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with ScriptedSubscriber() as sub:
        # no --jars: Herald's own Kafka source and delta-rs (test_dist.py runs the README's jars with Spark's)
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"job": {"endpoint": sub.url}},
                          settings={"kafka": {"connector": "python"}, "storage": {"engine": "deltalake"}})
        result = subprocess.run([str(spark_submit), "--master", "local[2]", str(REPO / "jobs" / "deliver.py"),
                                 "--conf", str(conf), "--once"], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    assert sub.delivered_ids() == set(range(8))
