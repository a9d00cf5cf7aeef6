"""The `herald` command: validate, refusing to run an invalid config, publish, read-outs, broker management."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

from herald.storage.tables import METRICS, OFFSETS, SCHEMAS, UNDELIVERED
from tests.conftest import free_port
from tests.support.herald_env import write_conf

REPO = Path(__file__).resolve().parents[2]


def herald(*args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "herald", *args], capture_output=True, text=True, timeout=timeout,
                          input=stdin)


def test_validate_the_example_conf():
    result = herald("validate", "--conf", str(REPO / "conf"))
    assert result.returncode == 0, result.stderr
    assert "valid: 1 topic(s), 4 subscription(s) (3 ACTIVE)" in result.stdout


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


def store_a_batch(root: Path) -> None:
    """One round of subscription a.b.s in the Delta tables under `root`/storage (as write_conf sets them),
    written as rows of the tables' schemas (the layout the read-outs read; docs/operations.md, "Tables")."""
    base = {"subscription": "a.b.s", "batch_id": 0, "writer": "stream:a.b"}
    rows = {
        UNDELIVERED: [{**base, "topic_name": "a.b", "partition": 0, "offset": 4, "message_id": "id-4",
                       "status": "DISCARDED", "reason": "Message sending failed with status code: 400",
                       "http_status": 400, "attempts": 1, "message": '{"x": 1}', "timestamp": at(2_500),
                       "published_at": at(500), "cluster": "test"}],
        METRICS: [{**base, "read": 5, "delivered": 3, "discarded": 1, "filtered": 1, "inflight": 1, "attempts": 6,
                   "timeouts": 0, "other_errors": 0, "codes_2xx": 3, "codes_3xx": 0, "codes_4xx": 1, "codes_5xx": 2,
                   "rate": 3.0, "flow_mode": "NORMAL", "flow_rate": 400.0, "started_at": at(1_000),
                   "finished_at": at(3_000)}],
        OFFSETS: [{**base, "topic": "a.b", "partition": 0, "offset": 5, "committed_at": at(3_000)}],
    }
    for table, table_rows in rows.items():
        append_rows(root, table, table_rows)


def at(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)


def append_rows(root: Path, table: str, rows: list[dict]) -> None:
    """Rows (missing columns null) appended to one of the Delta tables under `root`/storage."""
    from deltalake import write_deltalake

    schema = SCHEMAS[table]
    write_deltalake(str(root / "storage" / "tables" / table),
                    pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows],
                                         schema=schema), mode="append")


PROBE = ("import sys; from herald.cli import main; code = main(sys.argv[1:]); "
         "assert 'pyspark' not in sys.modules, 'read-outs must not load Spark'; raise SystemExit(code)")


def readout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)


def test_readouts_answer_from_the_tables_without_spark(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {"s": {"endpoint": "http://h/x"}})
    store_a_batch(tmp_path)
    last = readout("undelivered", "--conf", str(conf), "a.b.s", "--last", "--json")
    assert last.returncode == 0, last.stderr
    assert json.loads(last.stdout) == {
        "timestamp": 2500, "subscription": "s", "topicName": "a.b", "status": "DISCARDED",
        "reason": "Message sending failed with status code: 400", "message": '{"x": 1}', "partition": 0,
        "offset": 4, "cluster": "test", "messageId": "id-4", "httpStatus": 400, "attempts": 1}
    metrics = json.loads(readout("metrics", "--conf", str(conf), "a.b.s", "--json").stdout)
    assert (metrics["delivered"], metrics["discarded"], metrics["filtered"], metrics["codes5xx"]) == (3, 1, 1, 2)
    assert metrics["rate"] == 3.0  # 6 attempts over 2 s
    offsets = json.loads(readout("offsets", "--conf", str(conf), "a.b.s", "--json").stdout)
    assert [(o["partition"], o["offset"]) for o in offsets] == [(0, 5)]
    missing = readout("undelivered", "--conf", str(conf), "a.b.nope")
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


def test_readouts_answer_with_a_warning_while_another_file_is_invalid(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {
        "s": {"endpoint": "http://h/x"},
        "bad": {"endpoint": "http://u:topsecret@h/x", "subscriptionPolicy": {"rate": 0}}})
    (conf / "topics" / "c.d.yaml").write_text("name: c.d\ncolour: red\n")
    (conf / "subscriptions" / "orphan.yaml").write_text("topicName: c.d\nname: orphan\nendpoint: http://h/\n")
    store_a_batch(tmp_path)
    warnings = ["warning: conf/subscriptions/bad.yaml: subscriptionPolicy.rate: must be >= 1 (got 0)",
                "warning: conf/topics/c.d.yaml: colour: unknown key",
                "warning: conf/subscriptions/orphan.yaml: topicName: topic c.d is left out: its file "
                "conf/topics/c.d.yaml is invalid"]
    for command in (["undelivered", "--last", "--json"], ["metrics", "--json"], ["offsets", "--json"]):
        result = readout(command[0], "--conf", str(conf), "a.b.s", *command[1:])
        assert result.returncode == 0, result.stderr
        assert all(warning in result.stderr.splitlines() for warning in warnings), result.stderr
        assert json.loads(result.stdout), f"{command[0]} answers for the valid subscription"
        assert "topsecret" not in result.stderr + result.stdout
    assert json.loads(readout("offsets", "--conf", str(conf), "a.b.s", "--json").stdout)[0]["offset"] == 5

    own = readout("metrics", "--conf", str(conf), "a.b.bad")
    assert own.returncode == 2 and own.stdout == ""
    assert "a.b.bad: left out of the configuration, conf/subscriptions/bad.yaml is invalid:" in own.stderr
    assert "  conf/subscriptions/bad.yaml: subscriptionPolicy.rate: must be >= 1 (got 0)" in own.stderr.splitlines()
    assert "topsecret" not in own.stderr
    orphan = readout("offsets", "--conf", str(conf), "a.b.orphan")
    assert orphan.returncode == 2 and "no subscription 'a.b.orphan'" in orphan.stderr
    orphan = readout("offsets", "--conf", str(conf), "c.d.orphan")
    assert orphan.returncode == 2 and "topic c.d is left out: its file conf/topics/c.d.yaml is invalid" in \
        orphan.stderr

    for strict in ("validate", "run"):  # these still refuse the whole directory
        result = herald(strict, "--conf", str(conf))
        assert result.returncode == 2 and "conf/subscriptions/bad.yaml: subscriptionPolicy.rate" in result.stderr


def test_readouts_take_the_newest_row_of_several_writers(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {"s": {"endpoint": "http://h/x"}})
    store_a_batch(tmp_path)  # the stream's round 0: offset 5, committed and finished at 3 s
    retry = {"subscription": "a.b.s", "writer": "retry:a.b.s", "batch_id": 7}
    append_rows(tmp_path, OFFSETS, [{**retry, "topic": "a.b", "partition": 0, "offset": 4, "committed_at": at(2_000)},
                                    {"subscription": "a.b.s", "writer": "stream:a.b", "batch_id": 1, "topic": "a.b",
                                     "partition": 0, "offset": 9, "committed_at": at(4_000)}])
    append_rows(tmp_path, METRICS, [{**retry, "attempts": 2, "parked": 2, "rate": 1.0, "flow_mode": "SLOW",
                                     "started_at": at(1_000), "finished_at": at(2_000)}])
    offsets = json.loads(readout("offsets", "--conf", str(conf), "a.b.s", "--json").stdout)
    assert [(o["partition"], o["offset"], o["batchId"]) for o in offsets] == [(0, 9, 1)]
    metrics = json.loads(readout("metrics", "--conf", str(conf), "a.b.s", "--json").stdout)
    assert (metrics["batches"], metrics["attempts"], metrics["parked"]) == (2, 8, 2)
    assert (metrics["rate"], metrics["flowMode"], metrics["lastBatchAt"]) == (3.0, "NORMAL", 3000)


def test_readouts_refuse_an_invalid_herald_yaml(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {"s": {"endpoint": "http://h/x"}},
                      settings={"streaming": {"batchDeadlineMs": 5}})
    result = readout("metrics", "--conf", str(conf), "a.b.s")
    assert result.returncode == 2
    assert "conf/herald.yaml: streaming.batchDeadlineMs: must be >= 1000 (got 5)" in result.stderr


def test_suspend_and_activate_work_while_another_file_is_invalid(tmp_path):
    conf = write_conf(tmp_path, "127.0.0.1:1", "a.b", {"s": {"endpoint": "http://h/x"},
                                                        "bad": {"endpoint": "http://h/x", "colour": "red"}},
                      settings={"streaming": {"configPollMs": 500}})
    suspended = herald("suspend", "--conf", str(conf), "a.b.s")
    assert suspended.returncode == 0, suspended.stderr
    assert "warning: conf/subscriptions/bad.yaml: colour: unknown key" in suspended.stderr
    assert "a running `herald run` applies this within streaming.configPollMs (500 ms), no restart needed" in \
        suspended.stdout
    assert "state: SUSPENDED" in (conf / "subscriptions" / "s.yaml").read_text()
    assert herald("activate", "--conf", str(conf), "a.b.s").returncode == 0
    refused = herald("suspend", "--conf", str(conf), "a.b.bad")
    assert refused.returncode == 2 and "conf/subscriptions/bad.yaml: colour: unknown key" in refused.stderr
    assert "state:" not in (conf / "subscriptions" / "bad.yaml").read_text()


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
