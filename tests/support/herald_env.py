"""Building a conf directory for tests and producing messages to the embedded broker.

The suite's stack is pinned here, not left to `auto`: what users run, Spark's Kafka source and delta-spark (`make
install` fetches their jars). A test that wants the other parts says so: `settings={"kafka": {"connector":
"python"}}` (Herald's own source: the tests of its code, and the scenarios run on both) or `settings={"storage":
{"engine": "deltalake"}}` (delta-rs: its own tests, the CLI's reads). A test file whose subject is not the tables
(Kafka's broker, its TLS and SASL) may set `TABLE_ENGINE = "deltalake"` for its tests (`tests/conftest.py`): a
job's delta-spark commits cost seconds of the two cores where delta-rs takes milliseconds. HERALD_TEST_CONNECTOR
and HERALD_TEST_ENGINE change the default for a whole run (and then for every file).
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import yaml
from confluent_kafka import Producer

SUITE_CONNECTOR = os.environ.get("HERALD_TEST_CONNECTOR", "spark")  # Spark's Kafka source, or "python" (Herald's)
# delta-spark, or "deltalake" (delta-rs): the default too in a run that asked for no jars (HERALD_JARS=off)
SUITE_ENGINE = os.environ.get("HERALD_TEST_ENGINE",
                              "deltalake" if os.environ.get("HERALD_JARS", "").lower() == "off" else "spark")


def require_jars(spark, class_name: str) -> None:
    """For a test of Spark's Kafka source or delta-spark: skips only when the run asked for no jars (HERALD_JARS=off);
    otherwise their absence fails the test (`make install` fetches them)."""
    import pytest

    from herald.session import jvm_class_loads

    if os.environ.get("HERALD_JARS", "").lower() == "off":
        pytest.skip("HERALD_JARS=off: this run's session was built without Spark's Kafka source and delta-spark")
    assert jvm_class_loads(spark, class_name), f"{class_name} does not load: run `herald jars fetch` (make install)"


def write_conf(
    root: Path,
    bootstrap_servers: str,
    topic: str,
    subscriptions: dict[str, dict],
    settings: dict | None = None,
) -> Path:
    """A conf directory with one JSON topic and the given subscriptions (name -> YAML fields)."""
    return write_topics_conf(root, bootstrap_servers, {topic: subscriptions}, settings)


def write_topics_conf(root: Path, bootstrap_servers: str, topics: dict[str, dict[str, dict]],
                      settings: dict | None = None) -> Path:
    """A conf directory with JSON topics and their subscriptions (topic -> name -> YAML fields); a
    subscription's file is `<name>.yaml`, or `<topic>.<name>.yaml` when there are several topics. A section of
    `settings` set to None is left out of herald.yaml (the defaults as shipped, e.g. `{"rateControl": None}`)."""
    conf = root / "conf"
    (conf / "topics").mkdir(parents=True, exist_ok=True)
    (conf / "subscriptions").mkdir(exist_ok=True)
    herald = {
        "kafka": {"bootstrapServers": bootstrap_servers, "connector": SUITE_CONNECTOR, "cluster": "test"},
        # rounds written as they end (the default gathers them for a minute): tests read the tables while jobs run
        "storage": {"path": str(root / "storage"), "engine": SUITE_ENGINE, "commitIntervalMs": 0},
        "streaming": {"triggerInterval": "200 milliseconds", "maxOffsetsPerTrigger": 1000, "configPollMs": 500},
        "rateControl": {"adjustIntervalMs": 500, "slowRate": 20, "heartbeatIntervalMs": 2000},
    }
    for key, value in (settings or {}).items():
        if value is None:
            herald.pop(key, None)
        else:
            herald[key] = {**herald.get(key, {}), **value} if isinstance(value, dict) else value
    (conf / "herald.yaml").write_text(yaml.safe_dump(herald))
    for topic, subscriptions in topics.items():
        (conf / "topics" / f"{topic}.yaml").write_text(textwrap.dedent(f"name: {topic}\ncontentType: JSON\n"))
        for name, fields in subscriptions.items():
            write_subscription(conf, topic, name, fields, prefixed=len(topics) > 1)
    return conf


def write_subscription(conf: Path, topic: str, name: str, fields: dict, prefixed: bool = False) -> Path:
    """(Re)write one subscription file; startingOffsets defaults to earliest."""
    document = {"topicName": topic, "name": name, "startingOffsets": "earliest", **fields}
    path = conf / "subscriptions" / (f"{topic}.{name}.yaml" if prefixed else f"{name}.yaml")
    path.write_text(yaml.safe_dump(document))
    return path


def produce(bootstrap_servers: str, topic: str, documents: list[dict], key_field: str | None = None,
            headers: list[tuple[str, bytes]] | None = None) -> None:
    """Produce JSON documents (recent timestamps: the broker drops records older than its retention)."""
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    errors: list = []
    for document in documents:
        key = str(document[key_field]).encode() if key_field else None
        producer.produce(topic, value=json.dumps(document).encode(), key=key, headers=headers,
                         on_delivery=lambda error, _: errors.append(error) if error else None)
    producer.flush(30)
    assert not errors, errors


def wait_until(condition, timeout_s: float = 30.0, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return False
