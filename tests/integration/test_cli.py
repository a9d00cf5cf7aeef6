"""The `herald` command: validate, refusing to run an invalid config, publish, read-outs, broker management."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from herald.delivery.report import BatchSummary, Discarded, TaskCounters
from herald.storage import BatchTxn, DeltaRsStore
from herald.storage.tables import METRICS, OFFSETS, UNDELIVERED, BatchContext, metrics_row, offsets_rows, \
    undelivered_rows
from tests.conftest import free_port
from tests.support.herald_env import write_conf

REPO = Path(__file__).resolve().parents[2]


def herald(*args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "herald", *args], capture_output=True, text=True, timeout=timeout,
                          input=stdin)


def test_validate_the_example_conf():
    result = herald("validate", "--conf", str(REPO / "conf"))
    assert result.returncode == 0, result.stderr
    assert "valid: 1 topic(s), 2 subscription(s) (1 ACTIVE)" in result.stdout


def test_invalid_config_is_listed_and_run_refuses_to_start(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {"bad": {
        "endpoint": "http://u:topsecret@h/x", "colour": "red",
        "subscriptionPolicy": {"rate": 0},
        "filters": [{"type": "jsonpath", "path": "$.a", "matcher": "(oops"}]}})
    for command in ("validate", "run"):
        result = herald(command, "--conf", str(conf))
        assert result.returncode == 2
        assert "conf/subscriptions/bad.yaml: colour: unknown key" in result.stderr
        assert "conf/subscriptions/bad.yaml: subscriptionPolicy.rate: must be >= 1 (got 0)" in result.stderr
        assert "conf/subscriptions/bad.yaml: filters[0]" in result.stderr
        assert "topsecret" not in result.stderr + result.stdout


@pytest.mark.broker
def test_publish_sends_json_rejects_the_rest_and_reports_failures(broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {})
    result = herald("publish", "--conf", str(conf), topic_name, '{"a": 1}', "not json", stdin=None)
    assert result.returncode == 1 and "message 2 rejected: not JSON" in result.stderr
    lines = tmp_path / "events.jsonl"
    lines.write_text('{"a": 2}\n{"a": 3}\n')
    assert herald("publish", "--conf", str(conf), topic_name, "--file", str(lines)).returncode == 0

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "t", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    received = [m for m in consumer.consume(10, timeout=10) if m.error() is None]
    consumer.close()
    assert [json.loads(m.value()) for m in received] == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert all(dict(m.headers())["id"] for m in received), "each message carries an id header"

    dead = write_conf(tmp_path / "dead", f"127.0.0.1:{free_port()}", topic_name, {})
    result = herald("publish", "--conf", str(dead), topic_name, '{"a": 1}', "--retries", "1", "--timeout", "1")
    assert result.returncode == 1 and "message 1 NOT published after 1 retries" in result.stderr


def test_readouts_answer_from_the_tables_without_spark(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {"s": {"endpoint": "http://h/x"}})
    store = DeltaRsStore(str(tmp_path / "storage"))
    context = BatchContext("a.b.s", "a.b", "test", 0)
    summary = BatchSummary(
        counters=TaskCounters(read=5, delivered=3, discarded=1, filtered=1, attempts=6, codes_2xx=3, codes_4xx=1,
                              codes_5xx=2, started_ms=1_000, finished_ms=3_000),
        positions={("a.b", 0): 5},
        discarded=[Discarded("a.b", 0, 4, "id-4", "Message sending failed with status code: 400", 400, 1,
                             b'{"x": 1}', 500, 2_500)],
    )
    txn = BatchTxn("herald:a.b.s:q", 0)
    store.append(UNDELIVERED, undelivered_rows(summary, context), txn)
    store.append(METRICS, metrics_row(summary, context, "NORMAL", 400.0), txn)
    store.append(OFFSETS, offsets_rows(summary.positions, "a.b.s", 0), txn)

    probe = ("import sys; from herald.cli import main; code = main(sys.argv[1:]); "
             "assert 'pyspark' not in sys.modules, 'read-outs must not load Spark'; raise SystemExit(code)")
    run = lambda *args: subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True)  # noqa: E731
    last = run("undelivered", "--conf", str(conf), "a.b.s", "--last", "--json")
    assert last.returncode == 0, last.stderr
    assert json.loads(last.stdout) == {
        "timestamp": 2500, "subscription": "s", "topicName": "a.b", "status": "DISCARDED",
        "reason": "Message sending failed with status code: 400", "message": '{"x": 1}', "partition": 0,
        "offset": 4, "cluster": "test", "messageId": "id-4", "httpStatus": 400, "attempts": 1}
    metrics = json.loads(run("metrics", "--conf", str(conf), "a.b.s", "--json").stdout)
    assert (metrics["delivered"], metrics["discarded"], metrics["filtered"], metrics["codes5xx"]) == (3, 1, 1, 2)
    assert metrics["rate"] == 3.0  # 6 attempts over 2 s
    offsets = json.loads(run("offsets", "--conf", str(conf), "a.b.s", "--json").stdout)
    assert [(o["partition"], o["offset"]) for o in offsets] == [(0, 5)]
    missing = run("undelivered", "--conf", str(conf), "a.b.nope")
    assert missing.returncode == 2 and "no subscription 'a.b.nope'" in missing.stderr


@pytest.mark.broker
def test_broker_up_status_down(tmp_path):
    conf = write_conf(tmp_path, f"127.0.0.1:{free_port()}", "x.orders", {})
    data = str(tmp_path / "broker")
    up = herald("broker", "up", "--conf", str(conf), "--data-dir", data, "--partitions", "2")
    assert up.returncode == 0, up.stderr
    try:
        assert "kafka" in herald("broker", "status", "--conf", str(conf), "--data-dir", data).stdout
        from confluent_kafka.admin import AdminClient

        servers = textwrap.dedent(up.stdout).split(" on ")[1].split(" ")[0]
        topics = AdminClient({"bootstrap.servers": servers}).list_topics(timeout=5).topics
        assert len(topics["x.orders"].partitions) == 2
    finally:
        assert herald("broker", "down", "--conf", str(conf), "--data-dir", data).returncode == 0


def test_suspend_and_activate_edit_only_the_state_line(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {"s": {"endpoint": "http://h/x"}})
    path = conf / "subscriptions" / "s.yaml"
    path.write_text("# owned by team A\n" + path.read_text())
    assert herald("suspend", "--conf", str(conf), "a.b.s").returncode == 0
    assert "state: SUSPENDED" in path.read_text() and path.read_text().startswith("# owned by team A\n")
    assert "0 ACTIVE" in herald("validate", "--conf", str(conf)).stdout
    assert herald("activate", "--conf", str(conf), "a.b.s").returncode == 0
    assert path.read_text().count("state:") == 1 and "state: ACTIVE" in path.read_text()


@pytest.mark.broker
def test_publish_encodes_avro_for_avro_topics(broker, topic_name, tmp_path):
    import yaml

    from tests.support.registry import SchemaRegistryServer

    schema = {"type": "record", "name": "Ping", "fields": [{"name": "n", "type": "int"},
                                                           {"name": "note", "type": ["null", "string"]}]}
    broker.create_topics({topic_name: 1})
    with SchemaRegistryServer() as registry:
        schema_id = registry.register(f"{topic_name}-value", schema)
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {},
                          settings={"schemaRegistry": {"url": registry.url}})
        (conf / "topics" / f"{topic_name}.yaml").write_text(yaml.safe_dump({"name": topic_name,
                                                                             "contentType": "AVRO"}))
        result = herald("publish", "--conf", str(conf), topic_name, '{"n": 1, "note": "hi"}', '{"n": "one"}')
    assert result.returncode == 1 and "message 2 rejected: does not fit the topic's Avro schema" in result.stderr
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "t", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    [message] = [m for m in consumer.consume(10, timeout=10) if m.error() is None]
    consumer.close()
    import io

    import fastavro

    value = message.value()
    assert value[0] == 0 and int.from_bytes(value[1:5], "big") == schema_id
    assert fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(schema)) == {"n": 1, "note": "hi"}
