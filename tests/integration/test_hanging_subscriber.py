"""A subscriber that accepts requests and never answers holds the other topics back by at most the deadline plus
the grace per micro-batch, not by its requestTimeout (issue 32, item 9). Real broker, real Spark, real HTTP
subscribers on 127.0.0.1, real Delta tables.
"""

from __future__ import annotations

import threading
import time

import pytest

from herald.storage import DeltaRsStore
from herald.storage.tables import UNDELIVERED
from tests.support.herald_env import produce, wait_until, write_topics_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import Received, Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

REQUEST_TIMEOUT_S = 60


def test_a_subscriber_that_never_answers_does_not_hold_another_topics_messages(broker, spark, tmp_path):
    """Topic A's subscriber takes requests and answers none (requestTimeout 60 s, batchDeadlineMs 3 s); topic B's
    answers at once and gets a message every half second meanwhile. Every B message arrives before A's first
    request would even have timed out: each micro-batch ends at A's deadline plus the grace, not at A's
    timeout. Once A answers again, every one of its messages is answered and A has nothing left: aborted
    attempts were retried, never lost nor recorded undelivered, each counted by the next Hermes-Retry-Count."""
    stamp = time.time_ns() % 10**8
    hung_topic, live_topic = f"hang.a_{stamp}", f"hang.b_{stamp}"
    broker.create_topics({hung_topic: 1, live_topic: 1})
    answering = threading.Event()
    hung: list[Received] = []  # A's requests while it does not answer, as they came
    answered: list[tuple[int, float]] = []  # A's messages as its subscriber answered them: (message, when)

    def respond(request: Received) -> Reply:
        if request.path == "/a":
            if not answering.is_set():
                hung.append(request)
                answering.wait(600)  # taken and left without an answer until the test lets A answer
            answered.append((request.json()["i"], time.monotonic()))
        return Reply()

    with ScriptedSubscriber(respond) as sub:
        layout = {
            hung_topic: {"s": {"endpoint": f"{sub.url}/a", "subscriptionPolicy": {
                "requestTimeout": REQUEST_TIMEOUT_S * 1000, "messageTtl": 3600, "messageBackoff": 500,
                "inflightSize": 2}}},
            live_topic: {"s": {"endpoint": f"{sub.url}/b", "subscriptionPolicy": {"requestTimeout": 30_000}}},
        }
        conf = write_topics_conf(tmp_path, broker.bootstrap_servers, layout,
                                 settings={"streaming": {"batchDeadlineMs": 3000}})
        a_messages = list(range(6))
        try:
            with RunningHerald(conf, spark) as running:
                produce(broker.bootstrap_servers, hung_topic, [{"i": i} for i in a_messages])
                assert wait_until(lambda: hung, 120), "A's subscriber got a request"
                first_hung_at = hung[0].at
                published: dict[int, float] = {}
                for i in range(20):
                    published[i] = time.monotonic()
                    produce(broker.bootstrap_servers, live_topic, [{"i": i}])
                    if i % 4 == 0:
                        a_messages.append(100 + i)  # A keeps getting messages too
                        produce(broker.bootstrap_servers, hung_topic, [{"i": 100 + i}])
                    time.sleep(0.5)
                assert wait_until(lambda: len(_first_arrivals(sub, "/b")) == 20, 240), "B got every message"
                assert not answering.is_set()
                released_at = time.monotonic()
                answering.set()
                a_state = _state(running, f"{hung_topic}.s")

                def a_done() -> bool:
                    return (running.runner.retries.parked_count(a_state.id) == 0
                            and a_state.positions == {0: len(a_messages)} and not a_state.live_carried()
                            and {i for i, at in answered if at >= released_at} >= set(a_messages))

                assert wait_until(a_done, 240), "every A message answered once A answers, nothing of A left"
        finally:
            answering.set()
    arrivals = _first_arrivals(sub, "/b")
    assert sorted(arrivals) == list(range(20))
    late = {i: round(at - first_hung_at, 1) for i, at in arrivals.items() if at >= first_hung_at + REQUEST_TIMEOUT_S}
    assert not late, f"B messages that waited for A's request timeout (s after A's first request): {late}"
    assert all(arrivals[i] - published[i] < REQUEST_TIMEOUT_S for i in arrivals)
    undelivered = [row for row in DeltaRsStore(str(tmp_path / "storage")).read(UNDELIVERED).to_pylist()
                   if row["subscription"] == a_state.id]
    assert undelivered == [], "no A message given up"
    assert any(r.headers["Hermes-Retry-Count"] != "0" for r in hung), "A's messages were tried again while it hung"
    for i in a_messages:  # every attempt counted: each one's Hermes-Retry-Count is the attempts before it
        counts = [int(r.headers["Hermes-Retry-Count"]) for r in sorted(sub.requests, key=lambda r: r.at)
                  if r.path == "/a" and r.json()["i"] == i]
        assert counts == list(range(len(counts))), (i, counts)


def _state(running: RunningHerald, subscription_id: str):
    return next(state for pipeline in running.runner.pipelines.values() for state in pipeline.states.values()
                if state.id == subscription_id)


def _first_arrivals(sub: ScriptedSubscriber, path: str) -> dict[int, float]:
    """Message -> when its first request came (monotonic seconds)."""
    arrivals: dict[int, float] = {}
    for request in list(sub.requests):
        if request.path == path:
            i = request.json()["i"]
            arrivals[i] = min(arrivals.get(i, request.at), request.at)
    return arrivals
