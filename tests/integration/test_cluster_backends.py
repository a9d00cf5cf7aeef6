"""The cluster back-ends: Spark's built-in Kafka source and delta-spark. `make install` fetches their jars
(`herald jars fetch`) and the suite's session loads them, so these tests run them for real; `auto` picks them
there, and where they are absent (a session built with HERALD_JARS=off, in a process of its own here) `auto` falls
back to Herald's Python source and delta-rs while asking for them explicitly is a clear error."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest

from herald.config import load_config
from herald.engine.round.result import position_rows
from herald.engine.runner import Runner
from herald.source.stream import SPARK_KAFKA_CLASS, choose_connector
from herald.storage.delta_spark import DELTA_SPARK_CLASS, SparkDeltaStore
from herald.storage.store import Slice, open_store
from herald.storage.tables import OFFSETS
from tests.support.herald_env import produce, require_jars, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = pytest.mark.spark


_WITHOUT_JARS = """
import json, sys
from herald.session import get_or_create_session
from herald.source.stream import choose_connector
from herald.storage.store import open_store

spark = get_or_create_session("local[1]", app_name="herald-no-jars")
found = {"auto connector": choose_connector(spark, "auto"),
         "auto store": type(open_store("auto", sys.argv[1], spark)).__name__}
for name, ask in (("spark connector", lambda: choose_connector(spark, "spark")),
                  ("spark store", lambda: open_store("spark", sys.argv[1], spark))):
    try:
        ask()
        found[name] = "no error"
    except RuntimeError as error:
        found[name] = str(error)
print(json.dumps(found))
spark.stop()
"""


def test_auto_falls_back_to_the_local_parts_and_explicit_choices_without_jars_fail_clearly(tmp_path):
    env = {**os.environ, "HERALD_JARS": "off", "PYSPARK_PYTHON": sys.executable}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    result = subprocess.run([sys.executable, "-c", _WITHOUT_JARS, str(tmp_path)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert (found["auto connector"], found["auto store"]) == ("python", "DeltaRsStore")
    assert "spark-sql-kafka is not on Spark's classpath" in found["spark connector"]
    assert "Delta Lake jars are not on Spark's classpath" in found["spark store"]


def test_auto_picks_the_fetched_jars(spark, tmp_path):
    require_jars(spark, SPARK_KAFKA_CLASS)
    require_jars(spark, DELTA_SPARK_CLASS)
    assert choose_connector(spark, "auto") == "spark"
    assert isinstance(open_store("auto", str(tmp_path), spark), SparkDeltaStore)


@pytest.mark.broker
def test_builtin_kafka_connector_end_to_end(spark, broker, topic_name, tmp_path):
    require_jars(spark, SPARK_KAFKA_CLASS)
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(6)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": sub.url}},
                          settings={"kafka": {"connector": "spark"}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sub.delivered_ids() == set(range(6))


def test_delta_spark_store_is_idempotent_per_batch(spark, tmp_path):
    require_jars(spark, DELTA_SPARK_CLASS)
    store = SparkDeltaStore(spark, str(tmp_path))
    rows = position_rows("a.b.s", "t", {0: 5}, "topic:t", 0, dt.datetime.now(dt.timezone.utc))
    store.replace(OFFSETS, rows, Slice("topic:t", 0))
    store.replace(OFFSETS, rows, Slice("topic:t", 0))
    assert store.read(OFFSETS, "a.b.s").num_rows == 1
