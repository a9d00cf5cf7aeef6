"""End to end: YAML conf -> embedded Kafka broker -> Spark streaming query -> real HTTP subscriber -> Delta tables."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from herald import readout
from herald.config import load_config
from herald.delivery.message import message_id
from herald.engine.runner import Runner
from herald.source.kafka_offsets import partition_watermarks
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def run_once(conf, spark, only=None) -> int:
    return Runner(load_config(conf), only=only, spark=spark).run(once=True)


def replies_for(i: int):
    return {
        1: [[500], [200]],
        2: [[503, {"Retry-After": "1"}], [200]],
        3: [[400]],
        5: [[429]],
        6: [[302, {"Location": "http://127.0.0.1:9/"}], [200]],
    }.get(i % 10)


def test_pipeline_delivers_filters_retries_discards_and_records_everything(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 3})
    documents = []
    for i in range(40):
        document = {"i": i, "keep": "no" if i % 4 == 0 else "yes"}
        if replies_for(i):
            document["replies"] = replies_for(i)
        if i == 7:
            document["replies"] = [[503]]  # never accepted: discarded when its 3 s TTL is over
        documents.append(document)
    produce(broker.bootstrap_servers, topic_name, documents, key_field="i")

    with ScriptedSubscriber() as sub:
        endpoint = sub.url.replace("http://", "http://alice:s3cret@") + "/hook"
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"billing": {
            "endpoint": endpoint,
            "subscriptionIdentityHeadersEnabled": True,
            "headers": [{"name": "X-Team", "value": "billing"}],
            "filters": [{"type": "jsonpath", "path": "$.keep", "matcher": "yes"}],
            "subscriptionPolicy": {"messageTtl": 3, "messageBackoff": 100, "inflightSize": 6},
        }}, settings={"streaming": {"parkAfterMs": 5000}, "rateControl": {"adjustIntervalMs": 30000}})
        assert run_once(conf, spark) == 0  # message 7's TTL ends it in the task: not parked, not slowed to probes

    kept = [d for d in documents if d["keep"] == "yes"]
    rejected = {d["i"] for d in kept if d["i"] % 10 in (3, 5)} | {7}
    received: dict[int, list] = {}
    for request in sub.requests:
        received.setdefault(request.json()["i"], []).append(request)
    assert set(received) == {d["i"] for d in kept}, "every kept message, and only those, reached the subscriber"
    assert sub.delivered_ids() == {d["i"] for d in kept} - rejected

    for _i, requests in received.items():
        ids = {r.message_id for r in requests}
        assert len(ids) == 1, "retries carry the same Hermes-Message-Id"
        assert [r.headers["Hermes-Retry-Count"] for r in requests] == [str(n) for n in range(len(requests))]
        first = requests[0]
        assert first.path == "/hook"
        assert base64.b64decode(first.headers["Authorization"].split()[1]) == b"alice:s3cret"
        assert first.headers["Hermes-Topic-Name"] == topic_name
        assert first.headers["Hermes-Subscription-Name"] == "billing"
        assert first.headers["X-Team"] == "billing" and first.headers["Content-Type"] == "application/json"
    assert len(received[6]) == 2, "a 3xx is retried, never followed"

    config = load_config(conf)
    subscription = config.subscription(f"{topic_name}.billing")
    undelivered = readout.undelivered(config, subscription, limit=100)
    reasons = {json.loads(row["message"])["i"]: row for row in undelivered}
    assert set(reasons) == rejected
    assert reasons[3]["reason"] == "Message sending failed with status code:400"
    assert reasons[5]["reason"] == "Message sending failed with status code:429"
    assert reasons[7]["reason"] == "Message sending failed with status code:503" and reasons[7]["httpStatus"] == 503
    row = reasons[3]
    assert (row["subscription"], row["topicName"], row["status"], row["cluster"]) == \
        ("billing", topic_name, "DISCARDED", "test")
    assert row["messageId"] == message_id(topic_name, row["partition"], row["offset"], None)

    metrics = readout.metrics(config, subscription)
    assert metrics["delivered"] == len(kept) - len(rejected)
    assert metrics["discarded"] == len(rejected)
    assert metrics["filtered"] == len(documents) - len(kept)
    kept_ids = {d["i"] for d in kept}
    assert metrics["codes4xx"] == sum(1 for i in kept_ids if i % 10 in (3, 5))  # one attempt each: not retried
    assert metrics["codes3xx"] == sum(1 for i in kept_ids if i % 10 == 6)
    assert metrics["attempts"] == len(sub.requests)

    marks = partition_watermarks({"bootstrap.servers": broker.bootstrap_servers}, [topic_name])[topic_name]
    positions = {row["partition"]: row["offset"] for row in readout.offsets(config, subscription)}
    assert positions == {p: high for p, (_, high) in marks.items()}


def test_latest_start_counts_from_the_first_run_even_when_it_found_nothing(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i, "before": True} for i in range(5)])
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name,
                          {"late": {"endpoint": sub.url, "startingOffsets": "latest"}})
        assert run_once(conf, spark) == 0
        assert sub.requests == []
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(5, 10)])
        assert run_once(conf, spark) == 0
    assert sorted(r.json()["i"] for r in sub.requests) == list(range(5, 10))


def set_state(conf, name: str, state: str) -> None:
    path = conf / "subscriptions" / f"{name}.yaml"
    document = yaml.safe_load(path.read_text())
    document["state"] = state
    path.write_text(yaml.safe_dump(document))


def test_suspend_then_resume_loses_nothing(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {"s": {"endpoint": sub.url}})
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10)])
        assert run_once(conf, spark) == 0
        set_state(conf, "s", "SUSPENDED")
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10, 20)])
        assert run_once(conf, spark) == 0
        assert len(sub.requests) == 10, "a SUSPENDED subscription is not run"
        set_state(conf, "s", "ACTIVE")
        produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(20, 25)])
        assert run_once(conf, spark) == 0
    assert sorted(r.json()["i"] for r in sub.requests) == list(range(25))


def test_inflight_is_shared_by_all_tasks_and_the_rate_is_capped(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 3})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(24)])
    with ScriptedSubscriber(lambda request: Reply(delay_ms=100)) as slow:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name,
                          {"slow": {"endpoint": slow.url, "subscriptionPolicy": {"inflightSize": 4}}})
        assert run_once(conf, spark) == 0
    assert len(slow.requests) == 24
    assert 2 <= slow.peak_concurrency <= 4, f"{slow.peak_concurrency} requests open at once at most"

    with ScriptedSubscriber() as fast:
        conf = write_conf(tmp_path / "rate", broker.bootstrap_servers, topic_name,
                          {"capped": {"endpoint": fast.url, "subscriptionPolicy": {"rate": 10}}})
        assert run_once(conf, spark) == 0
    times = sorted(r.at for r in fast.requests)
    assert len(times) == 24
    busiest_second = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    # 10/s for the subscription, over all its tasks: they take turns in 0.1 s slots, one permit a slot, so a
    # second holds parts of 11 slots at most
    assert busiest_second <= 11, f"{busiest_second} in one second; at {[round(t - times[0], 3) for t in times]}"



def test_client_errors_retried_timeouts_and_backoff_gaps_through_spark(broker, spark, topic_name, tmp_path):
    """Two subscriptions on one topic in one run: the retryClientErrors rows, a timeout, and backoff gaps."""
    broker.create_topics({topic_name: 2})
    documents = [
        {"i": 0, "replies": [[404], [200]]},
        {"i": 1, "replies": [[429], [200]]},
        {"i": 2, "replies": [[429, {"Retry-After": "1"}], [200]]},
        {"i": 3, "replies": [{"delay_ms": 900}, [200]]},
        {"i": 4, "replies": [[500], [500], [500], [200]]},
    ]
    produce(broker.bootstrap_servers, topic_name, documents)
    policy = {"retryClientErrors": True, "requestTimeout": 300, "messageBackoff": 200, "backoffMultiplier": 2,
              "messageTtl": 30}
    with ScriptedSubscriber() as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "strict": {"endpoint": sub.url + "/strict", "subscriptionPolicy": policy},
            "plain": {"endpoint": sub.url + "/plain", "subscriptionPolicy": {"requestTimeout": 300}},
        }, settings={"streaming": {"parkAfterMs": 5000},  # the 0.8 s backoff is waited for in the task, not parked
                     # flow control's windows stay closed: five failing first attempts could slow the lane to
                     # heartbeat probes (seconds apart) and hide the backoff gaps (seen once: a 4.1 s gap)
                     "rateControl": {"adjustIntervalMs": 60000}})
        assert run_once(conf, spark) == 0

    def attempts(path: str) -> dict[int, list]:
        grouped: dict[int, list] = {}
        for request in sorted(sub.requests, key=lambda r: r.at):
            if request.path == path:
                grouped.setdefault(request.json()["i"], []).append(request)
        return grouped

    strict, plain = attempts("/strict"), attempts("/plain")
    assert {i: len(r) for i, r in strict.items()} == {0: 2, 1: 2, 2: 2, 3: 2, 4: 4}
    assert strict[2][1].at - strict[2][0].at >= 0.95, "429 + Retry-After waits as told"
    gaps = [b.at - a.at for a, b in zip(strict[4], strict[4][1:])]
    assert gaps[0] < gaps[1] < gaps[2] and gaps[0] >= 0.18, f"exponential backoff 0.2, 0.4, 0.8 s: {gaps}"
    # without retryClientErrors the 404 and 429s are final; the timeout and the 5xx are retried anyway
    assert {i: len(r) for i, r in plain.items()} == {0: 1, 1: 1, 2: 1, 3: 2, 4: 4}

    config = load_config(conf)
    metrics = readout.metrics(config, config.subscription(f"{topic_name}.strict"))
    assert (metrics["delivered"], metrics["discarded"]) == (5, 0)
    # message 3's first answer (900 ms) outlasts the 300 ms timeout; on a loaded machine another answer may too
    assert metrics["timeouts"] >= 1
    plain_metrics = readout.metrics(config, config.subscription(f"{topic_name}.plain"))
    assert (plain_metrics["delivered"], plain_metrics["discarded"]) == (2, 3)
