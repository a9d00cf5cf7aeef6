"""What one Spark task needs to deliver its share of a micro-batch: plain, picklable configuration.

The driver builds a `DeliveryPlan` per micro-batch (`herald.engine.planner`) and ships it to the tasks.
Only configuration crosses the process boundary; pools, sessions and threads are created in the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from herald.delivery.flow import FlowSettings, FlowState
from herald.delivery.policy import RetryPolicy


@dataclass(frozen=True)
class DeliveryPlan:
    """One task's delivery settings.

    url: the endpoint without credentials (the Authorization header carries them).
    inflight: messages this task may hold in flight (its share of the subscription's inflightSize).
    rate_per_s: this task's share of the subscription's hard rate cap.
    request_timeout_s / socket_timeout_s: total and idle limits of one attempt (socket 0 = none).
    sending_delay_s: a message is not sent before its publish time plus this delay.
    """

    subscription_id: str
    url: str
    headers: dict[str, str] = field(repr=False)  # carries Authorization: never printed
    retry: RetryPolicy
    inflight: int
    rate_per_s: float
    request_timeout_s: float = 1.0
    socket_timeout_s: float = 0.0
    sending_delay_s: float = 0.0
    flow_settings: FlowSettings = field(default_factory=FlowSettings)
    flow_state: FlowState = field(default_factory=FlowState)
    oauth: bool = False
    schema_headers: bool = False  # AVRO delivery: send Schema-Id / Schema-Version
