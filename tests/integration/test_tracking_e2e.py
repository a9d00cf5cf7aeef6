"""Message tracking end to end (Hermes' guide, "Message tracking"): trackingAll and discardedOnly write a
message's steps to the Delta `tracking` table, and `herald trace` prints them. Real broker, Spark, HTTP, Delta."""

from __future__ import annotations

import json

import pytest

from herald.cli import main
from herald.config import load_config
from herald.delivery.message import message_id
from herald.delivery.report import STEP_ORDER
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import TRACKING
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def test_tracking_all_and_discarded_only_record_each_step_and_trace_prints_it(broker, spark, topic_name, tmp_path,
                                                                              capsys):
    broker.create_topics({topic_name: 1})
    documents = [{"i": i, "keep": i != 1} for i in range(6)]
    documents[2]["replies"] = [[500], [503], [200]]  # two failed attempts, then delivered
    documents[3]["replies"] = [[400]]  # discarded
    produce(broker.bootstrap_servers, topic_name, documents)
    # requestTimeout well above the default 1 s: on a loaded machine an answer of the subscriber (in this process)
    # can take longer, and a timed-out attempt is one more FAILED step than the scripted replies make.
    policy = {"messageTtl": 60, "messageBackoff": 50, "requestTimeout": 30000}
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "all": {"endpoint": sub.url + "/all", "trackingMode": "trackingAll", "subscriptionPolicy": policy,
                    "filters": [{"type": "jsonpath", "path": "$.keep", "matcher": "true"}]},
            "discards": {"endpoint": sub.url + "/discards", "trackingMode": "discardedOnly",
                         "subscriptionPolicy": policy},
            "off": {"endpoint": sub.url + "/off", "subscriptionPolicy": policy},
        })
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0

    ids = [message_id(topic_name, 0, offset, None) for offset in range(6)]
    rows = DeltaRsStore(str(tmp_path / "storage")).read(TRACKING).to_pylist()
    mine = {}
    for row in rows:
        mine.setdefault(row["subscription"], []).append(row)
    everything = mine[f"{topic_name}.all"]
    statuses = {}
    for row in sorted(everything, key=lambda r: (r["timestamp"], STEP_ORDER[r["status"]])):
        statuses.setdefault(row["offset"], []).append(row["status"])
    assert statuses[0] == ["INFLIGHT", "SUCCESS"]
    assert statuses[1] == ["FILTERED"]
    assert sorted(statuses[2]) == sorted(["INFLIGHT", "FAILED", "FAILED", "SUCCESS"])
    assert statuses[2][0] == "INFLIGHT" and statuses[2][-1] == "SUCCESS"
    assert sorted(statuses[3]) == ["DISCARDED", "FAILED", "INFLIGHT"]
    assert len(everything) == sum(len(v) for v in statuses.values()) == 2 + 1 + 4 + 3 + 2 + 2, \
        "each step once: no row written twice"
    assert {(r["offset"], r["status"]) for r in mine[f"{topic_name}.discards"]} == {(3, "DISCARDED")}
    assert f"{topic_name}.off" not in mine
    assert {r["message_id"] for r in everything} == set(ids)

    capsys.readouterr()
    assert main(["trace", "--conf", str(conf), f"{topic_name}.all", ids[2], "--json"]) == 0
    history = json.loads(capsys.readouterr().out)
    assert [step["status"] for step in history] == ["INFLIGHT", "FAILED", "FAILED", "SUCCESS"]
    assert [step["httpStatus"] for step in history] == [None, 500, 503, None]
    assert history[1]["reason"] == "Message sending failed with status code:500"
    assert set(history[0]) == {"messageId", "timestamp", "subscription", "topicName", "status", "reason",
                               "httpStatus", "partition", "offset", "cluster"}
    assert {(s["messageId"], s["subscription"], s["topicName"], s["partition"], s["offset"], s["cluster"])
            for s in history} == {(ids[2], "all", topic_name, 0, 2, "test")}
    assert [s["timestamp"] for s in history] == sorted(s["timestamp"] for s in history)

    assert main(["trace", "--conf", str(conf), f"{topic_name}.all", ids[3]]) == 0
    text = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in text] == ["INFLIGHT", "FAILED", "DISCARDED"]
    assert "400" in text[-1] and "status code:400" in text[-1]

    assert main(["trace", "--conf", str(conf), f"{topic_name}.off", ids[0], "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == []
    assert main(["trace", "--conf", str(conf), f"{topic_name}.all", "no-such-id"]) == 1
    assert "no tracked history" in capsys.readouterr().err
