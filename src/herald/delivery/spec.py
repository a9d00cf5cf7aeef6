"""A subscription's delivery settings in the units the delivery code uses, converted once from the YAML.

Hermes' YAML mixes units (messageTtl in s, messageBackoff in ms, ...). `herald.config` converts them into a
`DeliverySpec` when the configuration loads; from there on everything is seconds and messages per second,
and the planner only divides rate and inflight among the tasks that deliver at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from herald.delivery.policy import RetryPolicy


@dataclass(frozen=True)
class DeliverySpec:
    """retry: backoff, TTL and attempt limits (seconds).
    rate_per_s: hard cap on attempts per second for the whole subscription.
    inflight: messages read and not yet delivered, discarded or parked, for the whole subscription.
    request_timeout_s / socket_timeout_s: total and idle limits of one attempt (socket 0 = none).
    sending_delay_s: a message is not attempted before its publish time plus this delay.
    """

    retry: RetryPolicy
    rate_per_s: float = 400.0
    inflight: int = 100
    request_timeout_s: float = 1.0
    socket_timeout_s: float = 0.0
    sending_delay_s: float = 0.0

    @property
    def ordered(self) -> bool:
        """inflight 1 keeps partition order (DESIGN.md §4): such a subscription never parks a message."""
        return self.inflight == 1
