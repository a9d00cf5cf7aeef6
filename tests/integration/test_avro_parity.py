"""spark-avro's from_avro and fastavro deliver the same thing: the same AVRO topic in the real broker, read by two
jobs (herald.yaml avro.decoder `spark` and `fastavro`), each into its own storage, to the same real subscribers,
with a real schema-registry server: a schema file, and the Confluent wire format with two schema ids, each with
a corrupt record (and, for the registry, an id it does not know). The bodies and schema headers each endpoint
receives, the filters' decisions and the undelivered rows with their reasons must be the same."""

from __future__ import annotations

import json

import pytest

from herald import readout
from herald.avro.decode import AvroSource
from herald.avro.jvm import SPARK_AVRO_CLASS, decode
from herald.config import load_config
from herald.engine.runner import Runner
from tests.support.avro_topics import ORDER, ORDER_V2, avro_conf, order, produce_raw
from tests.support.herald_env import require_jars
from tests.support.registry import SchemaRegistryServer, avro_bytes, wire_bytes
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

SUBSCRIPTIONS = {
    "krakow": {"filters": [{"type": "avropath", "path": ".user.addresses[*].city", "matcher": "Krakow",
                            "matchingStrategy": "any"}]},
    "paid": {"filters": [{"type": "avropath", "path": ".status", "matcher": "PAID"},
                         {"type": "avropath", "path": ".user.name", "matcher": "null"}]},
    "everything": {},
    "as-avro": {"contentType": "AVRO"},
}
INVALID = "Message could not be decoded: invalid Avro binary"


def invalid(reason: str) -> str:
    """fastavro names its exception after `invalid Avro binary: `, from_avro cannot: the rest is not compared
    (`... bytes left after the record` is the same text from both, and is compared)."""
    return INVALID if reason.startswith(INVALID) and "bytes left" not in reason else reason


def orders(n: int) -> list[dict]:
    cities = [["Krakow"], ["Berlin", "Krakow"], ["Paris"], [], ["Zürich \"Z\"", "Kraków\n"]]
    return [order(i, cities[i % len(cities)], status="PAID" if i % 3 == 0 else "NEW",
                  name=None if i % 4 == 0 else f"name-{i}\t\\") for i in range(n)]


def decodes_with_from_avro(spark, source: AvroSource, value: bytes) -> bool:
    """The `spark` job's decoder really is from_avro for this topic (not fastavro after a refused plan)."""
    frame = decode(spark.createDataFrame([(value,)], "value binary"), source, "spark")
    return "from_avro" in frame._jdf.queryExecution().executedPlan().toString()


def deliver(spark, tmp_path, broker, topic: str, decoder: str, registry_url: str | None) -> dict:
    """Run one job with `decoder` over the whole topic; what each endpoint got and what was not delivered."""
    with ScriptedSubscriber() as sub:
        subscriptions = {name: {**fields, "endpoint": f"{sub.url}/{name}"} for name, fields in SUBSCRIPTIONS.items()}
        conf = avro_conf(tmp_path / decoder, broker, topic, subscriptions, schema_file=registry_url is None,
                         registry_url=registry_url, decoder=decoder)
        config = load_config(conf)
        assert Runner(config, spark=spark).run(once=True) == 0
    received = {name: sorted((r.body, r.headers.get("Schema-Id"), r.headers.get("Schema-Version"))
                             for r in sub.requests if r.path == f"/{name}") for name in SUBSCRIPTIONS}
    undelivered = {}
    for name in SUBSCRIPTIONS:
        rows = readout.undelivered(config, config.subscription(f"{topic}.{name}"), limit=100)
        undelivered[name] = sorted((row["partition"], row["offset"], row["status"], row["message"],
                                    invalid(row["reason"])) for row in rows)
    metrics = {name: {key: readout.metrics(config, config.subscription(f"{topic}.{name}"))[key]
                      for key in ("delivered", "discarded", "filtered")} for name in SUBSCRIPTIONS}
    return {"received": received, "undelivered": undelivered, "metrics": metrics}


def test_a_schema_file_topic_is_delivered_the_same_by_both_decoders(broker, spark, topic_name, tmp_path):
    require_jars(spark, SPARK_AVRO_CLASS)
    broker.create_topics({topic_name: 2})
    values = [(avro_bytes(ORDER, o), None) for o in orders(40)]
    values.insert(7, (b"\x07not avro", None))
    values.insert(20, (avro_bytes(ORDER, order(99, ["Krakow"])) + b"\x00\x01", None))  # bytes after the record
    produce_raw(broker.bootstrap_servers, topic_name, values)
    assert decodes_with_from_avro(spark, AvroSource(schema_json=json.dumps(ORDER)), values[0][0])

    jvm = deliver(spark, tmp_path, broker, topic_name, "spark", None)
    python = deliver(spark, tmp_path, broker, topic_name, "fastavro", None)

    assert jvm == python
    assert len(jvm["received"]["everything"]) == 40 and len(jvm["received"]["as-avro"]) == 40
    assert 0 < len(jvm["received"]["krakow"]) < 40 and 0 < len(jvm["received"]["paid"]) < 40
    reasons = sorted(row[4] for row in jvm["undelivered"]["everything"])
    assert reasons == [INVALID, "Message could not be decoded: invalid Avro binary: 2 bytes left after the record"]
    assert jvm["metrics"]["krakow"]["discarded"] == 2


def test_a_registry_topic_is_delivered_the_same_by_both_decoders(broker, spark, topic_name, tmp_path):
    require_jars(spark, SPARK_AVRO_CLASS)
    broker.create_topics({topic_name: 2})
    with SchemaRegistryServer() as registry:
        subject = f"{topic_name}-value"
        v1, v2 = registry.register(subject, ORDER), registry.register(subject, ORDER_V2)
        values = [(wire_bytes(v1, ORDER, o), None) for o in orders(20)]
        values += [(wire_bytes(v2, ORDER_V2, {**o, "priority": i}), None) for i, o in enumerate(orders(20))]
        values.insert(5, (b"\x00" + v1.to_bytes(4, "big") + b"\x02\x02", None))  # id 1, not an Order
        values.insert(30, (b"\x00" + v2.to_bytes(4, "big") + b"\xff", None))  # id 2, not an Order
        values.insert(12, (wire_bytes(77, ORDER, order(77, ["Krakow"])), None))  # an id the registry does not know
        values.insert(15, (avro_bytes(ORDER, order(15, ["Krakow"])), None))  # not the wire format
        produce_raw(broker.bootstrap_servers, topic_name, values)
        assert decodes_with_from_avro(spark, AvroSource(registry_url=registry.url, subject=subject), values[0][0])

        jvm = deliver(spark, tmp_path, broker, topic_name, "spark", registry.url)
        python = deliver(spark, tmp_path, broker, topic_name, "fastavro", registry.url)

    assert jvm == python
    assert len(jvm["received"]["everything"]) == 40
    assert {(schema_id, version) for _, schema_id, version in jvm["received"]["as-avro"]} == \
        {(str(v1), "1"), (str(v2), "2")}
    reasons = sorted(row[4] for row in jvm["undelivered"]["everything"])
    assert reasons[:2] == [INVALID, INVALID] and len(reasons) == 4
    assert any("schema id 77" in reason and "not found" in reason for reason in reasons)
    assert any("not in the schema registry's wire format (first byte " in reason for reason in reasons)
