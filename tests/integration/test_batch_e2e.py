"""BATCH delivery end to end: real broker, Spark, HTTP subscribers and Delta tables. Size, volume and time
thresholds (trickling input across micro-batches included), order, a retried batch keeping its id with
Retry-After, a discarded batch with every message undelivered, and kill -9 with the batch id unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from herald import readout
from herald.config import load_config
from herald.delivery.batcher import batch_id
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import METRICS, UNDELIVERED
from tests.support.herald_env import produce, wait_until, write_conf, write_topics_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import Received, Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def items(request: Received) -> list:
    return request.json()


def test_batches_close_on_size_and_on_volume_in_order_and_a_once_run_sends_the_rest(broker, spark, topic_name,
                                                                                     tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i, "pad": "x" * 30} for i in range(25)])  # 49-50 bytes
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "bysize": {"endpoint": sub.url + "/size", "deliveryType": "BATCH",
                       "subscriptionPolicy": {"batchSize": 10}},
            "byvolume": {"endpoint": sub.url + "/volume", "deliveryType": "BATCH",
                         "subscriptionPolicy": {"batchVolume": 2 + 4 * 50 + 3}},  # 4 messages fit, not 5
        })
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    by_size = sorted((r for r in sub.requests if r.path == "/size"), key=lambda r: r.at)
    assert [[m["i"] for m in items(r)] for r in by_size] == [list(range(10)), list(range(10, 20)),
                                                             list(range(20, 25))]
    assert all(r.headers["Content-Type"] == "application/json" and r.headers["Hermes-Retry-Count"] == "0"
               and "Hermes-Message-Id" not in r.headers for r in by_size)
    subscription = f"{topic_name}.bysize"
    assert [r.headers["Hermes-Batch-Id"] for r in by_size] == [
        batch_id(subscription, 0, 0, 9), batch_id(subscription, 0, 10, 19), batch_id(subscription, 0, 20, 24)]
    by_volume = sorted((r for r in sub.requests if r.path == "/volume"), key=lambda r: r.at)
    assert [len(items(r)) for r in by_volume] == [4, 4, 4, 4, 4, 4, 1]
    assert [m["i"] for r in by_volume for m in items(r)] == list(range(25)), "in order"
    assert all(len(r.body) <= 205 for r in by_volume)
    rows = DeltaRsStore(str(tmp_path / "storage")).read(METRICS, subscription).to_pylist()
    assert (sum(r["delivered"] for r in rows), sum(r["batches_delivered"] for r in rows),
            sum(r["attempts"] for r in rows)) == (25, 3, 3)


def test_trickling_input_arrives_in_batches_of_batch_time_across_micro_batches(broker, spark, topic_name,
                                                                              tmp_path):
    broker.create_topics({topic_name: 1})
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"trickle": {
            "endpoint": sub.url, "deliveryType": "BATCH", "startingOffsets": "latest",
            "subscriptionPolicy": {"batchTime": 3000}}})
        with RunningHerald(conf, spark):
            for i in range(30):  # 5 a second for 6 s
                produce(broker.bootstrap_servers, topic_name, [{"i": i}])
                time.sleep(0.2)
            assert wait_until(lambda: sum(len(items(r)) for r in sub.requests) >= 30, timeout_s=120), \
                [len(items(r)) for r in sub.requests]
    requests = sorted(sub.requests, key=lambda r: r.at)
    assert [m["i"] for r in requests for m in items(r)] == list(range(30)), "each once, in order"
    assert len(requests) <= 5, f"batches of about 15, not one request per micro-batch: {len(requests)} requests"
    gaps = [later.at - earlier.at for earlier, later in zip(requests, requests[1:])]
    assert all(gap >= 2.5 for gap in gaps), f"a batch waits batchTime from its first read: {gaps}"


def test_a_failing_batch_keeps_its_id_honours_retry_after_and_is_discarded_with_every_message(broker, spark,
                                                                                             topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(8)])

    def respond(request: Received) -> Reply:
        if items(request)[0]["i"] != 0:
            return Reply(200)
        return Reply(503, {"Retry-After": "1"}) if request.attempt == 0 else Reply(500)

    with ScriptedSubscriber(respond) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"b": {
            "endpoint": sub.url, "deliveryType": "BATCH",
            "subscriptionPolicy": {"batchSize": 4, "messageBackoff": 200, "messageTtl": 3}}},
            settings={"streaming": {"parkAfterMs": 10_000}})
        assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    failing = sorted((r for r in sub.requests if items(r)[0]["i"] == 0), key=lambda r: r.at)
    subscription = f"{topic_name}.b"
    expected_id = batch_id(subscription, 0, 0, 3)
    assert len(failing) >= 3 and {r.headers["Hermes-Batch-Id"] for r in failing} == {expected_id}
    assert [r.headers["Hermes-Retry-Count"] for r in failing] == [str(n) for n in range(len(failing))]
    assert failing[1].at - failing[0].at >= 1.0 - 0.05, "Retry-After: 1 was honoured"
    assert [m["i"] for r in sub.requests if items(r)[0]["i"] == 4 for m in items(r)] == [4, 5, 6, 7]
    config = load_config(conf)
    rows = sorted(DeltaRsStore(config.storage_path).read(UNDELIVERED, subscription).to_pylist(),
                  key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == [0, 1, 2, 3], "every message of the discarded batch"
    assert {(r["delivery_batch_id"], r["http_status"], r["reason"], r["ended_by"]) for r in rows} == {
        (expected_id, 500, "Message sending failed with status code:500", "messageTtl")}
    figures = readout.metrics(config, config.subscription(subscription))
    assert (figures["delivered"], figures["discarded"], figures["batchesDelivered"], figures["batchesDiscarded"]) \
        == (4, 4, 1, 1)


def test_kill_9_and_restart_resends_the_batch_with_the_same_id(broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5)])
    healthy = {"on": False}
    with ScriptedSubscriber(lambda request: Reply(200 if healthy["on"] else 500)) as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: {"k": {
            "endpoint": sub.url, "deliveryType": "BATCH",
            "subscriptionPolicy": {"batchSize": 5, "messageBackoff": 200, "messageTtl": 600}}}})
        job = subprocess.Popen([sys.executable, "-m", "herald", "run", "--conf", str(conf)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert wait_until(lambda: len(sub.requests) >= 3, timeout_s=180), job.stderr.read1().decode()
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and Python workers, at once
            job.wait()
        before = {r.headers["Hermes-Batch-Id"] for r in sub.requests}
        tried = len(sub.requests)
        healthy["on"] = True
        restart = subprocess.run([sys.executable, "-m", "herald", "run", "--conf", str(conf), "--once"],
                                 capture_output=True, text=True, timeout=300)
        assert restart.returncode == 0, restart.stderr[-3000:]
    after = sub.requests[tried:]
    assert before == {batch_id(f"{topic_name}.k", 0, 0, 4)}
    assert after and {r.headers["Hermes-Batch-Id"] for r in after} == before, "the same id after the crash"
    assert [m["i"] for m in items(after[-1])] == [0, 1, 2, 3, 4]
