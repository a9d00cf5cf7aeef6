"""Only plain configuration crosses from the driver to Spark's Python workers: each piece pickles, and none
shows a credential."""

from __future__ import annotations

import pickle

from pyspark import cloudpickle  # the pickler Spark ships functions to its workers with

from herald.config.model import Subscription
from herald.config.policies import SerialPolicy
from herald.delivery.flow import FlowSettings
from herald.delivery.plan import TaskPlan
from herald.engine.round.planner import lane_plan
from herald.engine.round.state import SubscriptionState
from herald.engine.round.task import delivery_task


def subscription() -> Subscription:
    return Subscription(topicName="a.b", name="c", endpoint="http://u:secret@127.0.0.1:9/x",
                        subscriptionPolicy=SerialPolicy(inflightSize=10, rate=100))


def task_plan() -> TaskPlan:
    lane = lane_plan(SubscriptionState(subscription(), positions={0: 5}), FlowSettings(), parked=0)
    return TaskPlan(topic="a.b", lanes={0: lane}, budget_s=1, tasks=3)


def test_the_plan_pickles_and_never_shows_credentials():
    plan = task_plan()
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert "secret" not in repr(plan) and "Authorization" not in repr(plan)
    lane = plan.lanes[0]
    assert lane.targets[0].authorization.startswith("Authorization: Basic ")
    shares = [lane.share(3, i) for i in range(3)]
    assert [s.inflight for s in shares] == [4, 3, 3] and abs(sum(s.rate_per_s for s in shares) - 100) < 1e-9


def test_the_task_function_pickles_with_its_plan():
    function = cloudpickle.loads(cloudpickle.dumps(delivery_task(task_plan())))
    assert callable(function)
