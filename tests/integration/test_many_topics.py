"""Many topics in one job, the common Hermes shape: tens of topics, each with a subscription or two.

A topic costs its rows, not a query of its own: the job reads them all through one streaming query (the shared
read), on either Kafka source. Real broker, real Spark, real HTTP subscribers on 127.0.0.1, real Delta tables.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from herald.config import load_config
from herald.engine.round.state import stored_parked
from herald.engine.runner import Runner
from herald.source.stream import SPARK_KAFKA_CLASS
from tests.support.herald_env import produce, require_jars, write_topics_conf
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

TOPICS = 32


@pytest.mark.parametrize("connector", ["spark", "python"])
def test_thirty_two_topics_with_a_subscription_each_in_one_once_run(broker, spark, tmp_path, connector):
    """Every topic's messages reach its own subscription, exactly once each, in one `--once` run that reads all
    32 topics through one query; one topic's subscriber failing every request does not hold back the other 31
    (its messages are parked)."""
    if connector == "spark":
        require_jars(spark, SPARK_KAFKA_CLASS)
    stamp = time.time_ns() % 10**8
    topics = [f"many.t{n}_{stamp}" for n in range(TOPICS)]
    broker.create_topics({topic: 2 for topic in topics})
    failing = topics[7]

    def answer(request):
        return Reply(status=503) if request.path.startswith(f"/{failing}/") else Reply()

    with ScriptedSubscriber(answer) as sub:
        # requestTimeout 30 s (the default is 1 s) and a grace of 30 s for requests open at a round's deadline (the
        # default is 1 s): on 2 busy cores the test's subscriber, a Python server in this process, answered some
        # requests later than that, and their messages were parked for a minute, not lost
        layout = {topic: {"s": {"endpoint": f"{sub.url}/{topic}/s", "subscriptionPolicy": {
                      "messageTtl": 3600, "messageBackoff": 60000, "requestTimeout": 30000}}}
                  for topic in topics}
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, layout,
                                 settings={"kafka": {"connector": connector},
                                           "streaming": {"requestGraceMs": 30000}})
        for index, topic in enumerate(topics):
            produce(broker.bootstrap_servers, topic, [{"topic": index, "i": i} for i in range(5)])
        runner = Runner(load_config(conf), spark=spark)
        assert runner.run(once=True) == 0
    reads = {id(pipeline.read) for pipeline in runner.pipelines.values()}
    assert len(reads) == 1 and runner.topics.read.kafka_topics == sorted(topics), "one query read every topic"
    parked = Counter(row["subscription"] for row in stored_parked(runner.context.store).to_pylist())
    delivered: dict[str, list[int]] = {}
    for request in sub.requests:  # every answer is 200 but the failing topic's
        delivered.setdefault(request.path, []).append(request.json()["i"])
    for index, topic in enumerate(topics):
        if topic == failing:
            assert set(delivered[f"/{topic}/s"]) == set(range(5)), "each tried once, answered 503"
            continue
        # delivered, or parked with its reason: on 2 busy cores this process's subscriber has left a request
        # unanswered past its requestTimeout (30 s); never lost, never delivered twice
        got = delivered.get(f"/{topic}/s", [])
        assert len(got) == len(set(got)) and set(got) <= set(range(5)), topic
        assert len(got) + parked[f"{topic}.s"] >= 5, topic
        assert all(request.json()["topic"] == index for request in sub.requests if request.path == f"/{topic}/s")
    parked = runner.retries.parked_count(f"{failing}.s")
    assert parked == 5, "the failing subscriber's messages are parked, not lost and not blocking the others"


def _received(sub: ScriptedSubscriber, path: str) -> list[int]:
    return sorted(request.json()["i"] for request in sub.requests if request.path == path)


def test_topics_added_and_removed_while_running_replace_the_read_and_lose_nothing(broker, spark, tmp_path):
    """Three topics run; a fourth is added and then one is removed while messages keep coming. Each change
    replaces the shared read (a new query over the new set, a checkpoint of its own, the old one deleted) after
    its micro-batch in progress: the topics that stay get every message exactly once across both changes, the
    added one everything since its `earliest` start, the removed one nothing after its removal."""
    import textwrap
    from pathlib import Path

    from herald.engine.triggers.shared_read import read_root
    from tests.support.herald_env import wait_until, write_subscription
    from tests.support.running import RunningHerald

    stamp = time.time_ns() % 10**8
    kept, removed, added = f"live.kept_{stamp}", f"live.removed_{stamp}", f"live.added_{stamp}"
    third = f"live.third_{stamp}"
    broker.create_topics({kept: 2, removed: 1, added: 2, third: 1})
    with ScriptedSubscriber() as sub:
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, {
            topic: {"s": {"endpoint": f"{sub.url}/{topic}"}} for topic in (kept, removed, third)})
        produce(broker.bootstrap_servers, added, [{"i": i} for i in range(5)])  # before it is delivered
        with RunningHerald(conf, spark) as running:
            runner = running.runner
            first_read = runner.topics.read
            assert first_read.kafka_topics == sorted([kept, removed, third])
            produce(broker.bootstrap_servers, kept, [{"i": i} for i in range(0, 10)])
            produce(broker.bootstrap_servers, removed, [{"i": i} for i in range(0, 10)])
            assert wait_until(lambda: _received(sub, f"/{kept}") == list(range(10)), 60)
            since = running.generation
            (conf / "topics" / f"{added}.yaml").write_text(textwrap.dedent(f"name: {added}\ncontentType: JSON\n"))
            write_subscription(conf, added, "s", {"endpoint": f"{sub.url}/{added}"}, prefixed=True)
            produce(broker.bootstrap_servers, kept, [{"i": i} for i in range(10, 20)])  # around the change
            assert running.applied(since)
            produce(broker.bootstrap_servers, kept, [{"i": i} for i in range(20, 30)])
            produce(broker.bootstrap_servers, added, [{"i": i} for i in range(5, 10)])
            assert wait_until(lambda: _received(sub, f"/{added}") == list(range(10))
                              and _received(sub, f"/{kept}") == list(range(30)), 90), \
                (_received(sub, f"/{added}"), _received(sub, f"/{kept}"))
            second_read = runner.topics.read
            assert second_read is not first_read and second_read.kafka_topics == sorted([kept, removed, third, added])
            assert wait_until(lambda: _received(sub, f"/{removed}") == list(range(10)), 60)
            since = running.generation
            (conf / "subscriptions" / f"{removed}.s.yaml").unlink()
            (conf / "topics" / f"{removed}.yaml").unlink()
            assert running.applied(since)
            assert wait_until(lambda: runner.topics.read is not second_read
                              and runner.topics.read.query is not None and runner.topics.read.query.isActive, 60)
            produce(broker.bootstrap_servers, removed, [{"i": i} for i in range(10, 15)])
            produce(broker.bootstrap_servers, kept, [{"i": i} for i in range(30, 40)])
            produce(broker.bootstrap_servers, third, [{"i": i} for i in range(3)])
            assert wait_until(lambda: _received(sub, f"/{kept}") == list(range(40))
                              and _received(sub, f"/{third}") == [0, 1, 2], 90), _received(sub, f"/{kept}")
            assert runner.topics.read.kafka_topics == sorted([kept, third, added])
            checkpoints = sorted(path.name for path in Path(read_root(str(tmp_path / "storage"))).iterdir())
            assert checkpoints == [Path(runner.topics.read.checkpoint).name], "the other reads' are deleted"
        assert running.exit_code == 0
    assert _received(sub, f"/{removed}") == list(range(10)), "nothing delivered after its removal"
    for topic in (kept, added, third):
        paths = [request.json()["i"] for request in sub.requests if request.path == f"/{topic}"]
        assert len(paths) == len(set(paths)), f"{topic}: a message delivered twice across the changes"


def _spy(monkeypatch, module, name, calls: list, fail_first: bool = False):
    """Wrap `module.name`, recording each call (and, with `fail_first`, raising after the first has run)."""
    real = getattr(module, name)

    def spied(*args, **kwargs):
        calls.append(args)
        result = real(*args, **kwargs)
        if fail_first and len(calls) == 1:
            raise RuntimeError("Job aborted: executor lost (injected after the tasks ran)")
        return result

    monkeypatch.setattr(module, name, spied)


@pytest.mark.parametrize("job_fails", [False, True])
def test_the_topics_of_a_micro_batch_share_one_delivery_job_and_fall_back_to_one_each_when_it_fails(
        broker, spark, tmp_path, monkeypatch, job_fails):
    """The small rounds of the topics with records in a micro-batch run as one Spark job: no topic's round runs
    a job of its own. When that job fails after its tasks delivered (an executor lost, say), nothing of it is
    recorded: each topic delivers the batch again in a job of its own, so every message arrives (some twice:
    at least once), every position ends at the end of its topic and nothing is undelivered."""
    from herald import readout
    from herald.engine.round import steps
    from herald.engine.triggers import shared_read

    shared_jobs: list = []
    own_jobs: list = []
    _spy(monkeypatch, shared_read, "reports_by_round", shared_jobs, fail_first=job_fails)
    _spy(monkeypatch, steps, "run_alone", own_jobs)
    stamp = time.time_ns() % 10**8
    topics = [f"joined.t{n}_{stamp}" for n in range(8)]
    broker.create_topics({topic: 2 for topic in topics})
    for topic in topics:
        produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(6)])
    with ScriptedSubscriber() as sub:
        layout = {topic: {"s": {"endpoint": f"{sub.url}/{topic}"}} for topic in topics}
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, layout)
        runner = Runner(load_config(conf), spark=spark)
        assert runner.run(once=True) == 0
    assert len(shared_jobs) == 1 and shared_jobs[0][1] == len(topics), "the batch's topics in one job"
    assert len(own_jobs) == (len(topics) if job_fails else 0), "after a failed shared job, a job per topic"
    for topic in topics:
        got = [request.json()["i"] for request in sub.requests if request.path == f"/{topic}"]
        assert sorted(set(got)) == list(range(6)), topic
        assert len(got) == (12 if job_fails else 6), f"{topic}: {sorted(got)}"
    config = load_config(conf)
    for subscription in config.subscriptions:
        recorded = {row["partition"]: row["offset"] for row in readout.offsets(config, subscription)}
        assert sum(recorded.values()) == 6 and len(recorded) == 2, (subscription.id, recorded)
        assert readout.undelivered(config, subscription, limit=5) == [], subscription.id
