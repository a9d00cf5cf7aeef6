"""One read for the job, each topic's rows shared by many subscriptions that each move at their own pace
(docs/design.md §2).

Real broker, real Spark, real HTTP subscribers on 127.0.0.1, real Delta tables.
"""

from __future__ import annotations

import time

import pytest

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import RETRIES
from tests.support.herald_env import produce, wait_until, write_subscription, write_topics_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def run_once(conf, spark) -> int:
    return Runner(load_config(conf), spark=spark).run(once=True)


def by_path(sub: ScriptedSubscriber) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for request in sorted(sub.requests, key=lambda r: r.at):
        grouped.setdefault(request.path, []).append(request)
    return grouped


def test_sixty_subscriptions_over_eight_topics_share_one_read(broker, spark, tmp_path):
    """The issue's scale: 60 subscriptions over 8 topics in one --once on 2 cores, each getting exactly what its
    filters pass (a plain path, and for some a wildcard with `any` as well)."""
    topics = [f"scale.t{n}_{time.time_ns() % 10**8}" for n in range(8)]
    broker.create_topics({topic: 2 for topic in topics})
    per_topic = {topic: 8 if index < 4 else 7 for index, topic in enumerate(topics)}  # 4 x 8 + 4 x 7 = 60
    with ScriptedSubscriber() as sub:
        layout = {}
        for topic, count in per_topic.items():
            subscriptions = {}
            for n in range(count):
                filters = [{"type": "jsonpath", "path": "$.k", "matcher": str(n % 6)}]
                if n % 3 == 0:
                    filters.append({"type": "jsonpath", "path": "$.tags[*]", "matcher": "hot",
                                    "matchingStrategy": "any"})
                subscriptions[f"s{n}"] = {"endpoint": f"{sub.url}/{topic}/s{n}", "filters": filters}
            layout[topic] = subscriptions
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, layout)
        documents = [{"i": i, "k": str(i % 6), "tags": ["hot"] if i % 4 == 0 else ["cold"]} for i in range(60)]
        for topic in topics:
            produce(broker.bootstrap_servers, topic, documents)
        runner = Runner(load_config(conf), spark=spark)
        assert runner.run(once=True) == 0
        assert len(runner.pipelines) == 8, "one pipeline per topic, whatever the number of subscriptions"
        assert len({id(p.read) for p in runner.pipelines.values()}) == 1, "one query for the eight topics"
        assert sum(len(p.states) for p in runner.pipelines.values()) == 60
    received = by_path(sub)
    config = load_config(conf)
    for topic, count in per_topic.items():
        for n in range(count):
            expected = {d["i"] for d in documents if d["k"] == str(n % 6) and (n % 3 or "hot" in d["tags"])}
            got = [r.json()["i"] for r in received.get(f"/{topic}/s{n}", [])]
            assert sorted(got) == sorted(expected), f"{topic} s{n}"
            metrics = readout.metrics(config, config.subscription(f"{topic}.s{n}"))
            assert metrics["delivered"] == len(expected)
            assert metrics["filtered"] == len(documents) - len(expected)


def test_a_failing_subscriber_does_not_hold_back_a_healthy_one(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})
    with ScriptedSubscriber(lambda r: Reply(status=500 if r.path == "/failing" else 200)) as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: {
            "healthy": {"endpoint": sub.url + "/healthy"},
            "failing": {"endpoint": sub.url + "/failing",
                        "subscriptionPolicy": {"messageTtl": 60, "messageBackoff": 200}},
        }})
        with RunningHerald(conf, spark):
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10)])
            assert wait_until(lambda: len(by_path(sub).get("/healthy", [])) == 10, timeout_s=60)
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10, 30)])
            assert wait_until(lambda: len(by_path(sub).get("/healthy", [])) == 30, timeout_s=60)
            last_healthy = by_path(sub)["/healthy"][-1].at
            assert wait_until(lambda: by_path(sub)["/failing"][-1].at > last_healthy + 1.0, timeout_s=30), \
                "the failing subscription is still being retried after the healthy one got everything"
            failing = by_path(sub)["/failing"]
            # the failing subscriber is slowed to heartbeat probes (every 2 s here), as in Hermes: it gets probes of
            # its own messages (which of the first ten were tried before the slow-down is timing), the healthy one
            # everything
            tried = {r.json()["i"] for r in failing}
            assert tried & set(range(10)) and tried <= set(range(30))
    parked = DeltaRsStore(str(tmp_path / "storage")).read(RETRIES, f"{topic_name}.failing").to_pylist()
    assert {row["state"] for row in parked} >= {"PARKED"}


def test_a_poison_message_retries_beside_later_messages_then_is_discarded_by_its_ttl(
        broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: {"s": {
            "endpoint": sub.url, "subscriptionPolicy": {"messageTtl": 6, "messageBackoff": 300, "inflightSize": 10},
        }}}, settings={"streaming": {"parkAfterMs": 500},
                       # no flow-control window closes during the test: the poison's failures alone would
                       # otherwise slow the whole subscription to probes (by design, tested elsewhere) and
                       # the later messages' timing would depend on when the windows close
                       "rateControl": {"adjustIntervalMs": 60_000}})
        with RunningHerald(conf, spark):
            produce(broker.bootstrap_servers, topic_name, [{"i": 0, "replies": [[500]]}])
            assert wait_until(lambda: len(sub.requests) >= 2, timeout_s=60)
            produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(1, 21)])
            config = load_config(conf)
            subscription = config.subscription(f"{topic_name}.s")
            assert wait_until(lambda: readout.undelivered(config, subscription, limit=5), timeout_s=60)
    attempts = {}
    for request in sorted(sub.requests, key=lambda r: r.at):
        attempts.setdefault(request.json()["i"], []).append(request)
    assert set(attempts) == set(range(21)) and all(len(attempts[i]) == 1 for i in range(1, 21))
    poison = attempts[0]
    assert max(attempts[i][0].at for i in range(1, 21)) < poison[-1].at, "later messages went out while it retried"
    assert [r.headers["Hermes-Retry-Count"] for r in poison] == [str(n) for n in range(len(poison))]
    assert len({r.message_id for r in poison}) == 1
    (row,) = readout.undelivered(config, subscription, limit=5)
    assert row["reason"] == "Message sending failed with status code:500" and row["attempts"] == len(poison)
    states = [r["state"] for r in DeltaRsStore(str(tmp_path / "storage")).read(RETRIES, subscription.id).to_pylist()]
    assert "PARKED" in states and "DISCARDED" in states


def test_parked_retries_survive_a_restart_and_go_on_counting(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    store = DeltaRsStore(str(tmp_path / "storage"))

    def newest(offset: int) -> dict:
        rows = [row for row in store.read(RETRIES, f"{topic_name}.s").to_pylist() if row["offset"] == offset]
        return max(rows, key=lambda row: row["recorded_at"])

    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: {"s": {
            "endpoint": sub.url, "subscriptionPolicy": {"messageTtl": 120, "messageBackoff": 3000},
        }}}, settings={"streaming": {"parkAfterMs": 200}})
        produce(broker.bootstrap_servers, topic_name, [{"i": 0, "replies": [[503], [503], [200]]}, {"i": 1}])
        runs = 0
        while True:
            assert run_once(conf, spark) == 0
            runs += 1
            state = newest(0)
            if state["state"] == "DELIVERED":
                break
            # parked between runs, attempts counted on (a slow run may also re-drive it once it is due)
            assert state["state"] == "PARKED" and state["attempts"] >= runs and runs < 3
            time.sleep(max(0.0, state["due_at"].timestamp() - time.time()) + 0.2)  # due before the next run
    assert runs >= 2, "the first run parks it and ends; a later run continues its retries"
    poison = [r for r in sorted(sub.requests, key=lambda r: r.at) if r.json()["i"] == 0]
    assert [r.headers["Hermes-Retry-Count"] for r in poison] == ["0", "1", "2"], "counted on across runs"
    assert len({r.message_id for r in poison}) == 1
    assert [r.json()["i"] for r in sub.requests].count(1) == 1, "the other message was delivered once"


def test_an_ordered_subscription_never_parks_and_keeps_partition_order(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 1})
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: {"o": {
            "endpoint": sub.url, "subscriptionPolicy": {"inflightSize": 1, "messageBackoff": 300, "messageTtl": 60},
        }}}, settings={"streaming": {"parkAfterMs": 200}})
        documents = [{"i": 0}, {"i": 1, "replies": [[500], [500], [500], [200]]}] + [{"i": i} for i in range(2, 8)]
        produce(broker.bootstrap_servers, topic_name, documents)
        assert run_once(conf, spark) == 0
    order = [r.json()["i"] for r in sorted(sub.requests, key=lambda r: r.at)]
    assert order == [0, 1, 1, 1, 1, 2, 3, 4, 5, 6, 7]
    states = {row["state"] for row in DeltaRsStore(str(tmp_path / "storage")).read(RETRIES, f"{topic_name}.o")
              .to_pylist()}
    assert "PARKED" not in states


def test_live_configuration_add_edit_suspend_activate_and_an_invalid_edit(broker, spark, topic_name, tmp_path):
    broker.create_topics({topic_name: 2})

    def ids(path: str) -> list[int]:
        return sorted(r.json()["i"] for r in by_path(sub).get(path, []))

    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: {"a": {"endpoint": sub.url + "/a"}}})
        produce(broker.bootstrap_servers, topic_name, [{"i": i, "k": "x"} for i in range(5)])
        with RunningHerald(conf, spark) as running:
            assert wait_until(lambda: ids("/a") == list(range(5)), timeout_s=60)
            # added while running: `latest` gets only what comes after it is seen; `earliest` catches up alone
            write_subscription(conf, topic_name, "late", {"endpoint": sub.url + "/late", "startingOffsets": "latest"})
            write_subscription(conf, topic_name, "early", {"endpoint": sub.url + "/early"})
            assert wait_until(lambda: ids("/early") == list(range(5)), timeout_s=60)
            pipeline = running.runner.pipelines[topic_name]
            assert wait_until(lambda: f"{topic_name}.late" in pipeline.states, timeout_s=30), "late is delivered"
            produce(broker.bootstrap_servers, topic_name, [{"i": i, "k": "y"} for i in range(5, 10)])
            assert wait_until(lambda: ids("/late") == list(range(5, 10)) and ids("/a") == list(range(10)),
                              timeout_s=60)
            # suspended: nothing new; activated: what was published meanwhile follows
            generation = running.generation
            write_subscription(conf, topic_name, "a", {"endpoint": sub.url + "/a", "state": "SUSPENDED"})
            assert running.applied(generation)
            produce(broker.bootstrap_servers, topic_name, [{"i": i, "k": "x"} for i in range(10, 15)])
            assert wait_until(lambda: ids("/early") == list(range(15)), timeout_s=60)
            assert ids("/a") == list(range(10))
            # an edit applies; an invalid edit keeps the last valid version running
            write_subscription(conf, topic_name, "late", {"endpoint": sub.url + "/late", "startingOffsets": "latest",
                                                          "filters": [{"type": "jsonpath", "path": "$.k",
                                                                       "matcher": "x"}]})
            (conf / "subscriptions" / "early.yaml").write_text("topicName: [not, valid\n")
            generation = running.generation
            write_subscription(conf, topic_name, "a", {"endpoint": sub.url + "/a", "state": "ACTIVE"})
            assert wait_until(lambda: ids("/a") == list(range(15)), timeout_s=60)
            assert wait_until(lambda: running.generation > generation and pipeline.states[
                f"{topic_name}.late"].subscription.filters, timeout_s=30), "the edit of late applied"
            produce(broker.bootstrap_servers, topic_name, [{"i": 15, "k": "y"}, {"i": 16, "k": "x"}])
            assert wait_until(lambda: ids("/early") == list(range(17)) and 16 in ids("/late"), timeout_s=60)
            time.sleep(1.0)
            assert 15 not in ids("/late"), "the edited filter applies"


def test_a_subscription_sitting_a_micro_batch_out_leaves_the_others_their_own_messages(broker, spark, topic_name,
                                                                                       tmp_path):
    """The first subscription of the topic falls behind (inflight 1, its first message held by a retry due in ten
    minutes) and catches up alone; the micro-batches after that are delivered to the other two only. Each of them
    gets exactly the messages its filter passes, at its own endpoint: a row's target must name its own lane
    whatever the place of the subscriptions sitting the round out."""
    broker.create_topics({topic_name: 1})

    with ScriptedSubscriber(lambda r: Reply(status=503 if r.path == "/a_held" else 200)) as sub:
        layout = {name: {"endpoint": f"{sub.url}/{name}",
                         "filters": [{"type": "jsonpath", "path": "$.to", "matcher": name}]}
                  for name in ("a_held", "b", "c")}
        layout["a_held"]["subscriptionPolicy"] = {"inflightSize": 1, "messageBackoff": 600000}
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {topic_name: layout})
        first = [{"i": i, "to": ("a_held", "b", "c")[i % 3]} for i in range(6)]
        later = [{"i": i, "to": ("a_held", "b", "c")[i % 3]} for i in range(6, 36)]
        with RunningHerald(conf, spark) as running:
            produce(broker.bootstrap_servers, topic_name, first)
            assert wait_until(lambda: len(by_path(sub).get("/c", [])) == 2, 90), "the first micro-batch"
            pipeline = next(iter(running.runner.pipelines.values()))
            assert wait_until(lambda: pipeline.states[f"{topic_name}.a_held"].catching_up, 30), \
                "held at its retry, the first subscription sits the next micro-batches out"
            produce(broker.bootstrap_servers, topic_name, later)
            expected = {name: sorted(d["i"] for d in first + later if d["to"] == name) for name in ("b", "c")}
            assert wait_until(lambda: all(sorted(r.json()["i"] for r in by_path(sub).get(f"/{name}", []))
                                          == expected[name] for name in ("b", "c")), 90), by_path(sub).keys()
    received = by_path(sub)
    for name in ("a_held", "b", "c"):
        assert all(r.json()["to"] == name for r in received.get(f"/{name}", [])), f"another's message at /{name}"
    assert [r.json()["i"] for r in received["/a_held"]] == [0], "only its first message, held at its retry"
