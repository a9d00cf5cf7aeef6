"""A round's rows reach only their own subscription's lane: the indices of a micro-batch's participants point
into the list the rows are projected for, also when some of the topic's subscriptions sit the round out (they
catch up on their own), and a round whose indices would not is refused before anything is read or sent."""

from __future__ import annotations

import types

import pytest

from herald.config import load_config
from herald.delivery.flow import FlowSettings
from herald.engine.endpoints.priority_groups import Priority
from herald.engine.round import steps
from herald.engine.round.fanout import Participant
from herald.engine.round.pipeline import TopicPipeline
from herald.engine.round.state import SubscriptionState
from tests.support.config_files import SUBSCRIPTION, write_conf


def _config(tmp_path):
    names = ["alpha", "beta", "gamma"]
    return load_config(write_conf(tmp_path, subscriptions={
        name: SUBSCRIPTION.replace("name: billing", f"name: {name}") for name in names}))


class _NoParked:
    @staticmethod
    def parked_count(subscription_id: str) -> int:
        return 0


def _pipeline(config, catching_up: set[str]) -> TopicPipeline:
    context = types.SimpleNamespace(config=config, flow_settings=FlowSettings(), oauth_providers={},
                                    priority=Priority(None, "test", lambda: 0),  # no pinned subscription
                                    endpoints_of=lambda s: None,  # configured endpoints, as EngineContext says
                                    former_endpoint=lambda shown: None)
    states = [SubscriptionState(s, positions={0: 0}, catching_up=s.name in catching_up) for s in config.subscriptions]
    pipeline = TopicPipeline.__new__(TopicPipeline)  # no Spark: only the states and the planning are used here
    pipeline.context, pipeline.retries, pipeline.states = context, _NoParked(), {s.id: s for s in states}
    return pipeline


@pytest.mark.parametrize("sitting_out", [set(), {"alpha"}, {"beta"}, {"alpha", "gamma"}])
def test_a_micro_batch_numbers_its_participants_by_their_place_among_the_projected_subscriptions(tmp_path,
                                                                                                    sitting_out):
    pipeline = _pipeline(_config(tmp_path), sitting_out)
    projected = pipeline.subscriptions
    members = pipeline.claim_participants(projected, {0: (0, 10)})
    assert sorted(m.state.subscription.name for m in members) == sorted({"alpha", "beta", "gamma"} - sitting_out)
    for member in members:
        assert projected[member.index] is member.state.subscription
        assert member.plan.subscription_id == member.state.id


def test_a_round_whose_indices_point_at_another_subscription_is_refused_before_it_reads(tmp_path):
    config = _config(tmp_path)
    alpha, beta, _ = config.subscriptions
    state = SubscriptionState(beta, positions={0: 0})
    misnumbered = [Participant(0, state, None)]  # beta numbered as if the projection held beta alone
    with pytest.raises(RuntimeError, match="not its place"):
        steps.deliver(types.SimpleNamespace(config=config), config.topic_of(beta), [alpha, beta], misnumbered,
                      raw=None, ranges={0: (0, 10)}, max_tasks=1, shared=True)


def test_an_overflow_subscription_is_planned_with_its_endpoints_conditions(tmp_path):
    overflow = SUBSCRIPTION.replace("endpoint: http://127.0.0.1:8080/orders", """endpoints:
  - http://127.0.0.1:8080/east
  - {url: "http://127.0.0.1:8080/west", minPending: 1000, minInflight: 50}
priority: {policy: overflow}""")
    config = load_config(write_conf(tmp_path, subscriptions={"billing": overflow}))
    pipeline = _pipeline(config, set())
    state = next(iter(pipeline.states.values()))
    state.topic_end = {0: 1500}
    (member,) = steps.participants(pipeline.context, [(0, state)], _NoParked.parked_count)
    assert [(t.min_pending, t.min_inflight) for t in member.plan.targets] == [(None, None), (1000, 50)]
    assert member.plan.pending == 1500


def _member(inflight: int) -> Participant:
    return Participant(0, None, types.SimpleNamespace(inflight=inflight))


@pytest.mark.parametrize("inflights, shared, tasks", [
    ([100], False, 4),  # a task per partition with something to read, at most max_tasks
    ([1], False, 1),  # ordered: a second task's share would be 0, and its partitions would never move
    ([100, 3], False, 3),
    ([0, 100], False, 4),  # a member whose slots are all held by parked retries takes nothing new anyway
    ([1], True, 4),  # the shared read: it falls behind on the other partitions and catches up alone
])
def test_a_round_has_no_more_tasks_than_a_member_outside_the_shared_read_can_give_a_share_to(inflights, shared,
                                                                                              tasks):
    ranges = {p: (0, 10) for p in range(6)}
    assert steps.round_tasks(ranges, 4, [_member(n) for n in inflights], shared) == tasks
    assert steps.round_tasks({0: (0, 10), 1: (5, 5)}, 4, [_member(100)], shared) == 1  # one partition to read
