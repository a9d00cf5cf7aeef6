"""Every `herald` command that reads or changes state, with --json, on the tables of one real run (broker,
Spark, HTTP subscriber, Delta): the JSON parses, has the documented fields, and the exit codes are
0 (done), 1 (nothing found, or Kafka could not be asked) and 2 (invalid input or configuration)."""

from __future__ import annotations

import json
import shutil

import pytest

from herald.cli import main
from herald.config import load_config
from herald.delivery.message import message_id
from herald.engine.runner import Runner
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def herald(capsys, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one command."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def ran(tmp_path_factory, broker, spark):
    root = tmp_path_factory.mktemp("cli-json")
    topic = "clijson.t"
    broker.create_topics({topic: 2})
    produce(broker.bootstrap_servers, topic, [{"i": i, **({"replies": [[400]]} if i in (2, 5) else {})}
                                             for i in range(8)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(root, broker.bootstrap_servers, topic, {
            "a": {"endpoint": sub.url + "/a", "trackingMode": "trackingAll"},
            "quiet": {"endpoint": sub.url + "/quiet", "filters": [{"type": "jsonpath", "path": "$.i",
                                                                    "matcher": "100"}]},
        })
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    return conf, topic


def test_validate_json_and_its_exit_codes(ran, capsys, tmp_path):
    conf, _ = ran
    code, out, _ = herald(capsys, "validate", "--conf", str(conf), "--json")
    result = json.loads(out)
    assert code == 0 and result["valid"] and (result["topics"], result["subscriptions"], result["active"]) == (1, 2, 2)
    broken = tmp_path / "conf"
    shutil.copytree(conf, broken)
    path = broken / "subscriptions" / "a.yaml"
    path.write_text(path.read_text().replace("trackingMode: trackingAll", "trackingMode: sometimes"))
    code, out, _ = herald(capsys, "validate", "--conf", str(broken), "--json")
    result = json.loads(out)
    assert code == 2 and not result["valid"]
    (problem,) = result["problems"]
    assert problem["file"].endswith("a.yaml") and problem["key"] == "trackingMode"
    code, _, err = herald(capsys, "validate", "--conf", str(broken))
    assert code == 2 and "a.yaml: trackingMode" in err


def test_readouts_json_and_exit_codes(ran, capsys):
    conf, topic = ran
    a, quiet = f"{topic}.a", f"{topic}.quiet"

    code, out, _ = herald(capsys, "undelivered", "--conf", str(conf), a, "--limit", "5", "--json")
    rows = json.loads(out)
    assert code == 0 and sorted(json.loads(r["message"])["i"] for r in rows) == [2, 5]
    assert {"timestamp", "subscription", "topicName", "status", "reason", "message", "partition", "offset",
            "cluster", "messageId", "httpStatus", "attempts"} <= set(rows[0])
    code, out, _ = herald(capsys, "undelivered", "--conf", str(conf), a, "--last", "--json")
    assert code == 0 and json.loads(out)["messageId"] == rows[0]["messageId"]
    code, out, _ = herald(capsys, "undelivered", "--conf", str(conf), quiet, "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = herald(capsys, "undelivered", "--conf", str(conf), quiet, "--last", "--json")
    assert code == 1, "--last with nothing to show"

    code, out, _ = herald(capsys, "metrics", "--conf", str(conf), a, "--json")
    figures = json.loads(out)
    assert code == 0 and (figures["delivered"], figures["discarded"], figures["codes4xx"]) == (6, 2, 2)
    assert figures["lagError"] is None and sum(item["lag"] for item in figures["lag"]) == 0
    code, out, _ = herald(capsys, "metrics", "--conf", str(conf), quiet, "--json", "--no-lag")
    figures = json.loads(out)
    assert code == 0 and figures["filtered"] == 8 and figures["delivered"] == 0 and "lag" not in figures

    code, out, _ = herald(capsys, "offsets", "--conf", str(conf), a, "--json")
    positions = json.loads(out)
    assert code == 0 and sum(row["offset"] for row in positions) == 8
    assert {row["partition"] for row in positions} == {0, 1}

    two = next(r for r in rows if json.loads(r["message"])["i"] == 2)
    code, out, _ = herald(capsys, "trace", "--conf", str(conf), a, two["messageId"], "--json")
    assert code == 0 and [s["status"] for s in json.loads(out)] == ["INFLIGHT", "FAILED", "DISCARDED"]
    code, out, _ = herald(capsys, "trace", "--conf", str(conf), quiet, message_id(topic, 0, 0, None), "--json")
    assert code == 1 and json.loads(out) == []

    for command in (["undelivered"], ["metrics", "--json"], ["offsets", "--json"], ["trace", "x", "--json"]):
        name, *rest = command
        code, out, err = herald(capsys, name, "--conf", str(conf), f"{topic}.nobody", *rest)
        assert code == 2 and out == "" and f"{topic}.nobody" in err, command


def test_retransmit_and_maintain_json_and_exit_codes(ran, capsys):
    conf, topic = ran
    quiet = f"{topic}.quiet"
    code, out, _ = herald(capsys, "retransmit", "--conf", str(conf), quiet, "--date", "-1h", "--dry-run", "--json")
    move = json.loads(out)
    assert code == 0 and move["dryRun"] and move["topic"] == topic and move["subscription"] == quiet
    assert [p["to"] for p in move["partitions"]] == [0, 0] and [p["from"] for p in move["partitions"]] != [0, 0]
    code, _, err = herald(capsys, "retransmit", "--conf", str(conf), quiet, "--date", "yesterday", "--json")
    assert code == 2 and "yesterday" in err
    code, _, err = herald(capsys, "retransmit", "--conf", str(conf), quiet, "--date", "+1d", "--json")
    assert code == 2

    code, out, _ = herald(capsys, "maintain", "--conf", str(conf), "--json")
    results = json.loads(out)
    assert code == 0 and {"undelivered", "offsets", "metrics", "tracking"} <= {r["table"] for r in results}
