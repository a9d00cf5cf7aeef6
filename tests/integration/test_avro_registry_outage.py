"""A schema registry that cannot answer for a while loses nothing: the real broker, real Spark, a real registry
server on 127.0.0.1 that answers 503 to its first requests, a real subscriber. The rounds that met the outage
fail (their subscriptions stay behind, nothing recorded) and are read again later; every message is delivered,
none is discarded, and the log says why in one WARN line naming the registry and the schema id."""

from __future__ import annotations

import logging

import pytest

from herald import readout
from herald.avro.jvm import SPARK_AVRO_CLASS
from herald.avro.registry import ATTEMPTS
from herald.config import load_config
from herald.engine.runner import Runner
from tests.support.avro_topics import ORDER, avro_conf, order, produce_raw
from tests.support.herald_env import require_jars
from tests.support.registry import SchemaRegistryServer, wire_bytes
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


# fastavro: the first round's task gives up after ATTEMPTS tries, so does the first catch-up round's.
# spark: the driver's listing of the subject gives up, then the fastavro UDF for the ids it could not learn.
@pytest.mark.parametrize("decoder", ["fastavro", "spark"])
def test_a_registry_outage_fails_rounds_and_every_message_is_delivered_later(broker, spark, topic_name, tmp_path,
                                                                             caplog, decoder):
    if decoder == "spark":
        require_jars(spark, SPARK_AVRO_CLASS)
    broker.create_topics({topic_name: 1})  # one task a round: its tries meet the outage in order
    caplog.set_level(logging.INFO, logger="herald")
    with SchemaRegistryServer() as registry, ScriptedSubscriber() as sub:
        subject = f"{topic_name}-value"
        schema_id = registry.register(subject, ORDER)
        produce_raw(broker.bootstrap_servers, topic_name,
                    [(wire_bytes(schema_id, ORDER, order(i, ["Krakow"])), None) for i in range(10)])
        registry.fail_next(2 * ATTEMPTS, 503)
        conf = avro_conf(tmp_path, broker, topic_name, {"all": {"endpoint": sub.url + "/all"}}, schema_file=False,
                         registry_url=registry.url, decoder=decoder)
        config = load_config(conf)
        assert Runner(config, spark=spark).run(once=True) == 0
        assert sum(registry.failed.values()) == 2 * ATTEMPTS, "the outage was met"

    assert sorted({r.json()["id"] for r in sub.requests}) == list(range(10))
    subscription = config.subscription(f"{topic_name}.all")
    assert readout.undelivered(config, subscription, limit=10) == []
    metrics = readout.metrics(config, subscription)
    assert metrics["discarded"] == 0 and metrics["delivered"] >= 10

    failures = [r for r in caplog.records if "RegistryUnavailableError" in r.getMessage()]
    assert failures, "the failed round says why"
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in failures), "one line, no stack trace"
    assert any(registry.url in r.getMessage() and f"schema id {schema_id}" in r.getMessage() for r in failures)
    assert any("micro-batch 0 failed" in r.getMessage() for r in failures), "the first round met the outage"


def test_once_gives_a_topic_up_while_its_registry_stays_down_and_moves_no_position(broker, spark, topic_name,
                                                                                    tmp_path, capsys):
    broker.create_topics({topic_name: 1})
    with SchemaRegistryServer() as registry, ScriptedSubscriber() as sub:
        subject = f"{topic_name}-value"
        schema_id = registry.register(subject, ORDER)
        produce_raw(broker.bootstrap_servers, topic_name,
                    [(wire_bytes(schema_id, ORDER, order(i, ["Krakow"])), None) for i in range(5)])
        registry.fail_next(10_000, 503)
        conf = avro_conf(tmp_path, broker, topic_name, {"all": {"endpoint": sub.url + "/all"}}, schema_file=False,
                         registry_url=registry.url, decoder="fastavro")
        config = load_config(conf)
        runner = Runner(config, spark=spark)
        assert runner.run(once=True) == 1, "given up after its rounds kept failing, not waiting forever"

    assert sub.requests == []
    printed = capsys.readouterr().out
    assert f"topic {topic_name} could not be finished" in printed and "RegistryUnavailableError" in printed
    subscription = config.subscription(f"{topic_name}.all")
    assert readout.undelivered(config, subscription, limit=10) == []
    assert all(row["offset"] == 0 for row in readout.offsets(config, subscription)), "no position passed them"
