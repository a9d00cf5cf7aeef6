"""AVRO topics for end-to-end tests: the Order schema (two versions), orders as dicts, raw records published as
given, and a conf directory whose topic is AVRO (a schema file, or a registry)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from confluent_kafka import Producer

from tests.support.herald_env import write_conf

ORDER = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [
            {"name": "name", "type": ["null", "string"]},
            {"name": "addresses", "type": {"type": "array", "items": {
                "type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]}}},
        ]}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    ],
}
ORDER_V2 = {**ORDER, "fields": ORDER["fields"] + [{"name": "priority", "type": "int", "default": 0}]}


def order(i: int, cities: list[str], status: str = "NEW", name: str | None = "ann") -> dict:
    return {"id": i, "user": {"name": name, "addresses": [{"city": c} for c in cities]}, "status": status}


def produce_raw(bootstrap_servers: str, topic: str, values: list[tuple[bytes, list]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for value, headers in values:
        producer.produce(topic, value=value, headers=headers)
    producer.flush(30)


def avro_conf(tmp_path: Path, broker, topic: str, subscriptions: dict, schema_file: bool = True,
              registry_url: str | None = None, decoder: str = "auto") -> Path:
    """`decoder`: herald.yaml's avro.decoder (`spark`: spark-avro's from_avro, `fastavro`, `auto`)."""
    settings = {"schemaRegistry": {"url": registry_url}} if registry_url else {}
    settings["avro"] = {"decoder": decoder}
    conf = write_conf(tmp_path, broker.bootstrap_servers, topic, subscriptions, settings=settings)
    topic_file = {"name": topic, "contentType": "AVRO"}
    if schema_file:
        (conf / "schemas").mkdir()
        (conf / "schemas" / f"{topic}.avsc").write_text(json.dumps(ORDER))
        topic_file["schemaFile"] = f"schemas/{topic}.avsc"
    (conf / "topics" / f"{topic}.yaml").write_text(yaml.safe_dump(topic_file))
    return conf
