"""Only plain configuration crosses from the driver to Spark's Python workers: each piece pickles, and the
transport rebuilds its sessions after unpickling."""

from __future__ import annotations

import pickle

from pyspark import cloudpickle  # the pickler Spark ships functions to its workers with

from herald.config.model import SerialPolicy, Subscription
from herald.delivery.flow import FlowSettings, FlowState
from herald.delivery.task import delivery_task
from herald.delivery.transport import HttpTransport
from herald.engine.planner import plan_task


def subscription() -> Subscription:
    return Subscription(topicName="a.b", name="c", endpoint="http://u:secret@127.0.0.1:9/x",
                        subscriptionPolicy=SerialPolicy(inflightSize=10, rate=100))


def test_the_plan_pickles_and_never_shows_credentials():
    plan = plan_task(subscription(), tasks=3, flow_settings=FlowSettings(), flow=FlowState())
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert plan.inflight == 3 and abs(plan.rate_per_s - 100 / 3) < 1e-9
    assert "secret" not in repr(plan) and "Authorization" not in repr(plan)


def test_the_task_function_pickles_with_its_plan():
    plan = plan_task(subscription(), tasks=1, flow_settings=FlowSettings(), flow=FlowState())
    function = cloudpickle.loads(cloudpickle.dumps(delivery_task(plan)))
    assert callable(function)


def test_a_used_transport_pickles_as_configuration_only():
    transport = HttpTransport(request_timeout_s=2.0, socket_timeout_s=0.5)
    transport._adapter()  # a live connection pool exists now
    copy = pickle.loads(pickle.dumps(transport))
    assert (copy.request_timeout_s, copy.socket_timeout_s) == (2.0, 0.5)
    assert copy._adapters == []
