"""Planning a micro-batch on the driver: how many tasks, and each task's share of inflight and rate.

NSQ's rule: the subscription's `inflightSize` and `rate` are split evenly over the tasks that deliver at
once, rounding down, so their sum never exceeds the subscription's. When `inflightSize` is smaller than the
number of Kafka partitions, fewer tasks run (each reads several partitions), and while the adaptive controller
probes a failing subscriber (HEARTBEAT) a single task does.
"""

from __future__ import annotations

from dataclasses import replace

from herald.config.model import Subscription
from herald.delivery.flow import FlowMode, FlowSettings, FlowState
from herald.config.model import ContentType
from herald.delivery.headers import AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE, basic_authorization, static_headers
from herald.delivery.plan import DeliveryPlan


def task_count(partitions: int, inflight_size: int, parallelism: int, flow: FlowState) -> int:
    """Tasks for a batch read from `partitions` input partitions on a cluster with `parallelism` cores."""
    if partitions <= 1 or flow.mode is FlowMode.HEARTBEAT:
        return 1
    return max(1, min(partitions, inflight_size, parallelism))


def subscription_headers(subscription: Subscription) -> dict[str, str]:
    target = subscription.target
    authorization = basic_authorization(target.user, target.password or "") if target.user is not None else None
    return static_headers(
        AVRO_CONTENT_TYPE if subscription.contentType is ContentType.AVRO else JSON_CONTENT_TYPE,
        subscription.topicName,
        subscription.name,
        subscription.subscriptionIdentityHeadersEnabled,
        tuple((header.name, header.value) for header in subscription.headers),
        authorization,
    )


def plan_task(subscription: Subscription, tasks: int, flow_settings: FlowSettings, flow: FlowState) -> DeliveryPlan:
    """The plan each of `tasks` tasks gets: its share of inflight, rate and the controller's state."""
    policy = subscription.subscriptionPolicy
    return DeliveryPlan(
        subscription_id=subscription.id,
        url=subscription.target.url,
        headers=subscription_headers(subscription),
        retry=subscription.retry_policy(),
        inflight=max(1, policy.inflightSize // tasks),
        rate_per_s=policy.rate / tasks,
        request_timeout_s=policy.requestTimeout / 1000,
        socket_timeout_s=policy.socketTimeout / 1000,
        sending_delay_s=policy.sendingDelay / 1000,
        flow_settings=replace(
            flow_settings,
            slow_rate_per_s=flow_settings.slow_rate_per_s / tasks,
            heartbeat_interval_s=flow_settings.heartbeat_interval_s * tasks,
        ),
        flow_state=flow.share(tasks),
        schema_headers=subscription.contentType is ContentType.AVRO,
    )
