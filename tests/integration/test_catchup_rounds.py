"""Catch-up waits for what can change a round's outcome instead of re-running it (issue: nothing lost, nothing
stuck). Real broker, Spark, HTTP subscribers and Delta tables; rounds are counted from the metrics table."""

from __future__ import annotations

import json
import threading
import time

import pytest
from confluent_kafka import Producer

from herald.engine.context import EngineContext
from herald.storage import DeltaRsStore
from herald.storage.tables import METRICS
from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _catchup_rounds(tmp_path, subscription_id: str) -> int:
    rows = DeltaRsStore(str(tmp_path / "storage")).read(METRICS, subscription_id).to_pylist()
    return sum(1 for row in rows if row["kind"] == "catchup")


def test_an_ordered_subscription_held_at_a_retry_waits_for_it_instead_of_rerunning_rounds(
        broker, spark, topic_name, tmp_path):
    """inflightSize 1 over two partitions: a message of partition 0 answered 503 with Retry-After 12 s takes the
    only slot, so partition 1 cannot move either. Catch-up runs a round, finds nothing to do, and waits for the
    retry's due time (one round a second before, each ending after parkAfterMs with nothing done)."""
    broker.create_topics({topic_name: 2})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(topic_name, json.dumps({"i": 0, "replies": [[503, {"Retry-After": "12"}], [200]]}).encode(),
                     partition=0)
    for i in range(1, 4):
        producer.produce(topic_name, json.dumps({"i": i}).encode(), partition=1)
    assert producer.flush(10) == 0
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {
            "endpoint": sub.url, "subscriptionPolicy": {"inflightSize": 1}}})
        with RunningHerald(conf, spark):
            assert wait_until(lambda: sorted(r.json()["i"] for r in sub.requests) == [0, 0, 1, 2, 3], 90)
    first, second = [r for r in sub.requests if r.json()["i"] == 0]
    assert second.at - first.at >= 11.9, "Retry-After honoured"
    sent = [r.json()["i"] for r in sub.requests]
    held = sent.index(0)  # partition 1's messages may go before it (no order across partitions), never during it
    assert sent[held:held + 2] == [0, 0], f"nothing passed the held message while it waited: {sent}"
    rounds = _catchup_rounds(tmp_path, f"{topic_name}.s")
    assert rounds <= 3


def test_an_ordered_subscription_catches_up_on_every_partition_on_a_job_with_more_cores(
        broker, spark, topic_name, tmp_path, monkeypatch):
    """inflightSize 1 over two partitions that keep receiving messages, on a job whose Spark parallelism is 4 (a
    cluster's cores; the session here has 2). The shared read's round has 2 tasks and the second gets no share
    of the subscription's one slot, so the subscription falls behind on that partition and catches up. Catch-up
    rounds may use half the cores, 2 tasks, and split the partitions the same way every time: while partition 0
    kept receiving, partition 1 never moved. A round outside the shared read now has at most as many tasks as
    its members' smallest inflight."""
    monkeypatch.setattr(EngineContext, "parallelism", property(lambda self: 4))
    broker.create_topics({topic_name: 2})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    stop = threading.Event()
    published: dict[int, float] = {}  # message -> when it was published (monotonic s)

    def keep_producing() -> None:
        i = 0
        while not stop.is_set():
            producer.produce(topic_name, json.dumps({"i": i}).encode(), partition=i % 2)
            producer.flush(5)
            published[i] = time.monotonic()
            i += 1
            stop.wait(0.25)

    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {
            "endpoint": sub.url, "subscriptionPolicy": {"inflightSize": 1}}})
        traffic = threading.Thread(target=keep_producing, daemon=True)
        try:
            with RunningHerald(conf, spark):
                traffic.start()
                time.sleep(20)  # catch-up rounds come and go while both partitions keep receiving
                checked_at = time.monotonic()
                second = {i for i, at in list(published.items()) if i % 2 and at < checked_at - 5}
                delivered = lambda: {r.json()["i"] for r in sub.requests}  # noqa: E731
                assert wait_until(lambda: second <= delivered(), 30), \
                    f"partition 1 while both receive: {len(second - delivered())} of {len(second)} not delivered"
        finally:
            stop.set()
            traffic.join(10)
    assert sub.peak_concurrency == 1


def test_an_open_batch_that_few_messages_match_waits_for_its_batch_time_or_new_records(
        broker, spark, topic_name, tmp_path):
    """BATCH, batchSize 5: 2 of 40 records pass the filter, so the batch stays open until its batchTime (6 s).
    Catch-up reads the range once and waits, instead of reading it again back to back until then."""
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i, "kind": "hit" if i in (5, 30) else "miss"}
                                                   for i in range(40)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {
            "endpoint": sub.url, "deliveryType": "BATCH",
            "filters": [{"type": "jsonpath", "path": "$.kind", "matcher": "hit"}],
            "subscriptionPolicy": {"batchSize": 5, "batchTime": 6000}}})
        with RunningHerald(conf, spark):
            assert wait_until(lambda: len(sub.requests) == 1, 90)
    assert [item["i"] for item in sub.requests[0].json()] == [5, 30]
    assert _catchup_rounds(tmp_path, f"{topic_name}.s") <= 4
