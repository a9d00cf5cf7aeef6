"""Many topics in one job, the common Hermes shape: tens of topics, each with a subscription or two.

Real broker, real Spark (its Kafka source), real HTTP subscribers on 127.0.0.1, real Delta tables.
"""

from __future__ import annotations

import time

import pytest

from herald.config import load_config
from herald.engine.runner import Runner
from herald.source.stream import SPARK_KAFKA_CLASS
from tests.support.herald_env import produce, require_jars, write_topics_conf
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

TOPICS = 32


def test_thirty_two_topics_with_a_subscription_each_in_one_once_run(broker, spark, tmp_path):
    """Every topic's messages reach its own subscription, exactly once each, in one `--once` run; one topic's
    subscriber failing every request does not hold back the other 31 (its messages are parked)."""
    require_jars(spark, SPARK_KAFKA_CLASS)
    stamp = time.time_ns() % 10**8
    topics = [f"many.t{n}_{stamp}" for n in range(TOPICS)]
    broker.create_topics({topic: 2 for topic in topics})
    failing = topics[7]

    def answer(request):
        return Reply(status=503) if request.path.startswith(f"/{failing}/") else Reply()

    with ScriptedSubscriber(answer) as sub:
        layout = {topic: {"s": {"endpoint": f"{sub.url}/{topic}/s",
                                "subscriptionPolicy": {"messageTtl": 3600, "messageBackoff": 60000}}}
                  for topic in topics}
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, layout,
                                 settings={"kafka": {"connector": "spark"}})
        for index, topic in enumerate(topics):
            produce(broker.bootstrap_servers, topic, [{"topic": index, "i": i} for i in range(5)])
        runner = Runner(load_config(conf), spark=spark)
        assert runner.run(once=True) == 0
    delivered: dict[str, list[int]] = {}
    for request in sub.requests:  # every answer is 200 but the failing topic's
        delivered.setdefault(request.path, []).append(request.json()["i"])
    for index, topic in enumerate(topics):
        if topic == failing:
            assert set(delivered[f"/{topic}/s"]) == set(range(5)), "each tried once, answered 503"
            continue
        assert sorted(delivered.get(f"/{topic}/s", [])) == list(range(5)), topic
        assert all(request.json()["topic"] == index for request in sub.requests if request.path == f"/{topic}/s")
    parked = runner.retries.parked_count(f"{failing}.s")
    assert parked == 5, "the failing subscriber's messages are parked, not lost and not blocking the others"
