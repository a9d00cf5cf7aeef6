"""A subscription's delivery settings in the units the delivery code uses, converted once from the YAML.

Hermes' YAML mixes units (messageTtl in s, messageBackoff in ms, ...). `herald.config` converts them into a
`DeliverySpec` when the configuration loads; from there on everything is seconds and messages per second,
and the planner only divides rate and inflight among the tasks that deliver at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from herald.delivery.policy import RetryPolicy


@dataclass(frozen=True)
class BatchSpec:
    """BATCH delivery (Hermes' batch subscriptionPolicy): a batch is sent once it holds `size` messages, once the
    next message would take its body (a JSON array) past `volume_bytes`, or `time_s` seconds after its first
    message was read. A message larger than `volume_bytes` on its own goes out alone."""

    size: int
    time_s: float
    volume_bytes: int


@dataclass(frozen=True)
class DeliverySpec:
    """retry: backoff, TTL and attempt limits (seconds).
    rate_per_s: hard cap on attempts per second for the whole subscription.
    inflight: messages read and not yet delivered, discarded or parked, for the whole subscription.
    request_timeout_s / socket_timeout_s: total and idle limits of one attempt (socket 0 = none).
    sending_delay_s: a message is not attempted before its publish time plus this delay.
    batch: BATCH delivery's thresholds (None: SERIAL). Batches of a partition go out in order, one at a time,
        so a BATCH subscription is ordered and never parks; `inflight` then only bounds its share of tasks.
    """

    retry: RetryPolicy
    rate_per_s: float
    inflight: int
    request_timeout_s: float
    socket_timeout_s: float
    sending_delay_s: float
    batch: BatchSpec | None

    @property
    def ordered(self) -> bool:
        """inflight 1 keeps partition order (docs/design.md §4), as BATCH does: such a subscription never parks a
        message."""
        return self.inflight == 1 or self.batch is not None
