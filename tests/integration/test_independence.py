"""A subscription's latency never depends on another one's backlog (issue: nothing lost, nothing stuck)."""

from __future__ import annotations

import pytest

from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.running import RunningHerald
from tests.support.subscriber import Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def test_an_earliest_subscription_on_a_fresh_checkpoint_does_not_hold_back_an_up_to_date_one(
        broker, spark, topic_name, tmp_path):
    """A 3,000-message backlog for `old` (earliest, a slow subscriber) and none for `live` (latest): the shared
    query starts where `live` is, so a message published now reaches `live` before `old` is through its backlog,
    which it reads on its own (catch-up)."""
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(3000)])

    def respond(request) -> Reply:
        return Reply(delay_ms=20 if request.path == "/old" else 0)

    with ScriptedSubscriber(respond) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "old": {"endpoint": f"{sub.url}/old", "subscriptionPolicy": {"inflightSize": 10}},
            "live": {"endpoint": f"{sub.url}/live", "startingOffsets": "latest"}})
        with RunningHerald(conf, spark):
            produce(broker.bootstrap_servers, topic_name, [{"i": "now"}])
            assert wait_until(lambda: any(r.path == "/live" for r in sub.requests), 120)
            assert wait_until(lambda: sum(r.path == "/old" for r in sub.requests) >= 3001, 300)
    live = [r for r in sub.requests if r.path == "/live"]
    assert [r.json()["i"] for r in live] == ["now"], "live got only what was published after it started"
    old = sorted((r for r in sub.requests if r.path == "/old"), key=lambda r: r.at)
    backlog_done = max(r.at for r in old if r.json()["i"] != "now")
    assert live[0].at < backlog_done, "the new message did not wait for the other subscription's backlog"
    assert sorted(r.json()["i"] for r in old if r.json()["i"] != "now") == list(range(3000))
