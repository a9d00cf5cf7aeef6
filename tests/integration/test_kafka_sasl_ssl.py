"""Herald through the real broker's SASL_SSL listener (TLS with a test CA; SCRAM-SHA-512 and PLAIN), configured
as docs/configuration.md tells users: herald.yaml's `kafka.properties`, in Java's names with Spark's Kafka source and in
librdkafka's with Herald's Python source. Every Kafka client Herald opens goes through it: `herald publish`, the
driver's offset lookups, the Kafka source, the dead-letter producer. The commands run in their own processes, so
what they print (Spark's JVM log included) is what a user sees: the password must not be in it."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer

from herald.kafka_properties import PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE
from herald.source.kafka_offsets import KafkaOffsetsError, partition_watermarks
from tests.support.herald_env import write_conf
from tests.support.kafka_broker import SASL_PASSWORD, SASL_USER
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
TABLE_ENGINE = "deltalake"  # the subject is Kafka's TLS and SASL, not the tables (tests/conftest.py)

WRONG_PASSWORD = "wrong-pw-3Hd8sLq1"


def java_properties(broker, password: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    """What Spark's Kafka source reads (Herald gives the confluent-kafka clients librdkafka's names for them)."""
    module = SCRAM_LOGIN_MODULE if mechanism.startswith("SCRAM") else PLAIN_LOGIN_MODULE
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.jaas.config": f'{module} required username="{SASL_USER}" password="{password}";',
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(broker.pki.ca)}


def librdkafka_properties(broker, password: str, mechanism: str = "PLAIN") -> dict[str, str]:
    """What confluent-kafka reads (Herald gives Spark's source Java's names for them)."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": mechanism, "sasl.username": SASL_USER,
            "sasl.password": password, "ssl.ca.location": str(broker.pki.ca)}


PROPERTIES = {"spark": java_properties, "python": librdkafka_properties}


def herald(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "herald", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def assert_no_secret(result: subprocess.CompletedProcess, *secrets: str) -> None:
    shown = result.stdout + result.stderr
    for secret in secrets:
        assert secret not in shown, f"{secret!r} shown by {result.args[3:5]}"
    assert "sasl.jaas.config =" not in shown.replace("sasl.jaas.config = [hidden]", "")


def sasl_conf(broker, tmp_path, topic: str, connector: str, password: str, subscriptions: dict):
    return write_conf(tmp_path, broker.sasl_bootstrap_servers, topic, subscriptions, settings={
        "kafka": {"connector": connector, "properties": PROPERTIES[connector](broker, password)}})


def dead_letters(broker, topic: str, count: int, timeout_s: float = 30) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"dlq-{topic}",
                         "auto.offset.reset": "earliest", "log_level": 0})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < count and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                values.append(record.value())
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("connector", ["spark", "python"])
def test_delivers_through_sasl_ssl(kafka_broker, topic_name, tmp_path, connector):
    """`herald publish` writes 30 messages over SASL_SSL, `herald run --once` delivers them all to `ok` and
    discards them from `rejects` (400) to its dead-letter topic: every client authenticated."""
    dlq = f"{topic_name}.dlq"
    kafka_broker.create_topics({topic_name: 2, dlq: 1})
    with ScriptedSubscriber(lambda request: Reply(400) if request.path == "/rejects" else Reply()) as sub:
        conf = sasl_conf(kafka_broker, tmp_path, topic_name, connector, SASL_PASSWORD, {
            "ok": {"endpoint": sub.url + "/ok"},
            "rejects": {"endpoint": sub.url + "/rejects", "onDiscard": {"topic": dlq}},
        })
        published = herald("publish", "--conf", str(conf), topic_name, *(f'{{"i": {i}}}' for i in range(30)),
                           timeout_s=120)
        assert published.returncode == 0, published.stderr[-3000:]
        assert_no_secret(published, SASL_PASSWORD)
        run = herald("run", "--conf", str(conf), "--once")
        assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
        assert_no_secret(run, SASL_PASSWORD)
    delivered = sorted(r.json()["i"] for r in sub.requests if r.path == "/ok")
    assert delivered == list(range(30))
    assert sorted(int(value.decode().split()[-1].rstrip("}")) for value in dead_letters(kafka_broker, dlq, 30)) \
        == list(range(30))


def test_a_wrong_password_stops_the_topic_clearly(kafka_broker, topic_name, tmp_path):
    """A wrong password (Java's names, Spark's source): the topic cannot start, its attempts each end at the
    broker's refusal rather than a 30 s timeout, and `herald run --once` exits 1 printing the topic and the
    broker's reason, showing neither password."""
    kafka_broker.create_topics({topic_name: 1})
    with ScriptedSubscriber() as sub:
        conf = sasl_conf(kafka_broker, tmp_path, topic_name, "spark", WRONG_PASSWORD, {"ok": {"endpoint": sub.url}})
        run = herald("run", "--conf", str(conf), "--once", timeout_s=300)
    assert run.returncode == 1, (run.stdout + run.stderr)[-5000:]
    assert re.search(rf"topic {re.escape(topic_name)} could not be finished: could not read Kafka metadata from "
                     rf"{kafka_broker.sasl_bootstrap_servers}: .*SASL authentication error: Authentication failed "
                     r".*invalid credentials with SASL mechanism SCRAM-SHA-512", run.stdout), run.stdout[-3000:]
    assert_no_secret(run, WRONG_PASSWORD, SASL_PASSWORD)
    assert not sub.requests


@pytest.mark.parametrize("wrong", ["password", "CA"])
def test_the_offset_client_stops_at_the_brokers_refusal(kafka_broker, wrong):
    """The driver's offset client gives the broker's reason within a second or two, not a 30 s timeout and a
    'broker transport failure'."""
    properties = librdkafka_properties(kafka_broker, WRONG_PASSWORD if wrong == "password" else SASL_PASSWORD)
    if wrong == "CA":
        properties["ssl.ca.location"] = str(kafka_broker.pki.other_ca)
    with pytest.raises(KafkaOffsetsError) as refused:
        partition_watermarks({"bootstrap.servers": kafka_broker.sasl_bootstrap_servers, "log_level": 0, **properties},
                             ["any"])
    reason = "SASL authentication error" if wrong == "password" else "SSL handshake failed: .*certificate verify failed"
    assert re.search(reason, str(refused.value)), refused.value
