"""The cluster back-ends: Spark's built-in kafka source and delta-spark. Their jars come only from Maven, which
this machine cannot reach, so the end-to-end tests skip (saying so) where they are absent; asking for them
explicitly without the jars is a clear error, tested here for real."""

from __future__ import annotations

import pytest

from herald.config import load_config
from herald.engine.runner import Runner
from herald.session import jvm_class_loads
from herald.source.stream import SPARK_KAFKA_CLASS, choose_connector
import datetime as dt

from herald.engine.rounds import position_rows
from herald.storage.store import DELTA_SPARK_CLASS, Slice, SparkDeltaStore, open_store
from herald.storage.tables import OFFSETS
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = pytest.mark.spark


def test_auto_falls_back_to_the_local_parts_and_explicit_choices_without_jars_fail_clearly(spark, tmp_path):
    if jvm_class_loads(spark, SPARK_KAFKA_CLASS) or jvm_class_loads(spark, DELTA_SPARK_CLASS):
        pytest.skip("the cluster jars are on the classpath: the fallback is not exercised here")
    assert choose_connector(spark, "auto") == "python"
    with pytest.raises(RuntimeError, match="spark-sql-kafka is not on Spark's classpath"):
        choose_connector(spark, "spark")
    assert type(open_store("auto", str(tmp_path), spark)).__name__ == "DeltaRsStore"
    with pytest.raises(RuntimeError, match="Delta Lake jars are not on Spark's classpath"):
        open_store("spark", str(tmp_path), spark)


@pytest.mark.broker
def test_builtin_kafka_connector_end_to_end(spark, broker, topic_name, tmp_path):
    if not jvm_class_loads(spark, SPARK_KAFKA_CLASS):
        pytest.skip("spark-sql-kafka jars absent (they come only from Maven, unreachable here)")
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(6)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": sub.url}},
                          settings={"kafka": {"connector": "spark"}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sub.delivered_ids() == set(range(6))


def test_delta_spark_store_is_idempotent_per_batch(spark, tmp_path):
    if not jvm_class_loads(spark, DELTA_SPARK_CLASS):
        pytest.skip("delta-spark jars absent (they come only from Maven, unreachable here)")
    store = SparkDeltaStore(spark, str(tmp_path))
    rows = position_rows("a.b.s", "t", {0: 5}, "topic:t", 0, dt.datetime.now(dt.timezone.utc))
    store.replace(OFFSETS, rows, Slice("topic:t", 0))
    store.replace(OFFSETS, rows, Slice("topic:t", 0))
    assert store.read(OFFSETS, "a.b.s").num_rows == 1
