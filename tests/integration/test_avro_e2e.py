"""AVRO topics end to end: real Avro bytes (fastavro) in the embedded broker, real Spark, real subscribers,
a schema file or a Confluent-compatible registry; JSON and AVRO deliveries; undecodable records."""

from __future__ import annotations

import io

import fastavro
import pytest

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from tests.support.avro_topics import ORDER, ORDER_V2, avro_conf, order, produce_raw
from tests.support.registry import SchemaRegistryServer, avro_bytes, wire_bytes
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

def by_path(sub: ScriptedSubscriber, path: str) -> list:
    return [r for r in sorted(sub.requests, key=lambda r: r.at) if r.path == path]


def test_schema_file_topic_delivers_json_and_avro_and_keeps_undecodable_records(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    orders = [order(1, ["Krakow"]), order(2, ["Berlin", "Krakow"]), order(3, ["Paris"], status="PAID"),
              order(4, ["Krakow"], name=None)]
    values = [(avro_bytes(ORDER, o), [("trace", b"vte-1")]) for o in orders]
    values.insert(2, (b"\x07not avro", [("trace", b"vte-2")]))
    produce_raw(broker.bootstrap_servers, topic_name, values)

    with ScriptedSubscriber() as sub:
        conf = avro_conf(tmp_path, broker, topic_name, {
            "as-json": {"endpoint": sub.url + "/json", "filters": [
                {"type": "header", "header": "trace", "matcher": "vte.*"},
                {"type": "avropath", "path": ".user.addresses[*].city", "matcher": "Krakow",
                 "matchingStrategy": "any"}]},
            "as-avro": {"endpoint": sub.url + "/avro", "contentType": "AVRO"},
            # Hermes: a null or missing field at the end of the path compares as the string "null"
            "nameless": {"endpoint": sub.url + "/nameless", "filters": [
                {"type": "avropath", "path": ".user.name", "matcher": "null"},
                {"type": "avropath", "path": ".user.nickname", "matcher": "null"}]},
        })
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0

    as_json = by_path(sub, "/json")
    assert sorted(r.json()["id"] for r in as_json) == [1, 2, 4]
    assert [r.json()["id"] for r in by_path(sub, "/nameless")] == [4]
    first = next(r for r in as_json if r.json()["id"] == 1)
    assert first.json() == {"id": 1, "user": {"name": "ann", "addresses": [{"city": "Krakow"}]}, "status": "NEW"}
    assert first.headers["Content-Type"] == "application/json" and "Schema-Id" not in first.headers

    as_avro = by_path(sub, "/avro")
    assert sorted(fastavro.schemaless_reader(io.BytesIO(r.body), fastavro.parse_schema(ORDER))["id"]
                  for r in as_avro) == [1, 2, 3, 4]
    assert all(r.headers["Content-Type"] == "avro/binary" for r in as_avro)

    config = load_config(conf)
    for name in ("as-json", "as-avro"):
        [row] = readout.undelivered(config, config.subscription(f"{topic_name}.{name}"), limit=10)
        assert row["reason"].startswith("Message could not be decoded: invalid Avro binary")
        assert row["attempts"] == 0
    metrics = readout.metrics(config, config.subscription(f"{topic_name}.as-json"))
    assert (metrics["delivered"], metrics["discarded"], metrics["filtered"]) == (3, 1, 1)


def test_registry_topic_decodes_old_and_new_schemas_and_sends_schema_headers(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    with SchemaRegistryServer() as registry, ScriptedSubscriber() as sub:
        subject = f"{topic_name}-value"
        v1 = registry.register(subject, ORDER)
        v2 = registry.register(subject, ORDER_V2)
        values = [(wire_bytes(v1, ORDER, order(i, ["Krakow"])), None) for i in range(10)]
        values += [(wire_bytes(v2, ORDER_V2, {**order(i, ["Berlin"]), "priority": 5}), None) for i in range(10, 20)]
        values.append((wire_bytes(77, ORDER, order(99, ["X"])), None))  # an id the registry does not know
        produce_raw(broker.bootstrap_servers, topic_name, values)
        conf = avro_conf(tmp_path, broker, topic_name, {
            "as-json": {"endpoint": sub.url + "/json"},
            "as-avro": {"endpoint": sub.url + "/avro", "contentType": "AVRO"},
        }, schema_file=False, registry_url=registry.url)
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
        calls = dict(registry.calls)

    as_json = {r.json()["id"]: r.json() for r in by_path(sub, "/json")}
    assert sorted(as_json) == list(range(20))
    assert "priority" not in as_json[0] and as_json[15]["priority"] == 5
    as_avro = by_path(sub, "/avro")
    versions = {(r.headers["Schema-Id"], r.headers["Schema-Version"]) for r in as_avro}
    assert versions == {(str(v1), "1"), (str(v2), "2")}
    decoded = [fastavro.schemaless_reader(io.BytesIO(r.body),
                                          fastavro.parse_schema(ORDER if r.headers["Schema-Id"] == str(v1)
                                                                else ORDER_V2))
               for r in as_avro]
    assert sorted(d["id"] for d in decoded) == list(range(20)), "plain Avro binary, without the wire-format prefix"
    # one call per schema id per executor process (local[2] runs at most a few workers), never per record
    assert 1 <= calls.get(f"GET /schemas/ids/{v1}", 0) <= 4 and calls.get(f"GET /schemas/ids/{v2}", 0) <= 4

    config = load_config(conf)
    [row] = readout.undelivered(config, config.subscription(f"{topic_name}.as-json"), limit=10)
    assert "schema id 77" in row["reason"] and "not found" in row["reason"]
