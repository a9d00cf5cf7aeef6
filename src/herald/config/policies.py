"""A subscription's subscriptionPolicy: Hermes' SERIAL and BATCH options with their defaults and limits, plus
backoffJitter (RocketMQ) and maxAttempts (NSQ), and their conversion into the delivery code's units
(`delivery_spec_of`), once, here: `Subscription.delivery_spec` (`herald.config.model`) is its result.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from herald.config.base import Strict
from herald.delivery.policy import RetryPolicy
from herald.delivery.spec import BatchSpec, DeliverySpec


class _RetryOptions(Strict):
    """The retry options SERIAL and BATCH share: Hermes' plus backoffJitter (RocketMQ) and maxAttempts (NSQ)."""

    messageTtl: Annotated[int, Field(ge=0, le=7200)] = 3600  # seconds
    backoffMultiplier: Annotated[float, Field(ge=1, le=10)] = 1.0
    backoffMaxIntervalInSec: Annotated[int, Field(ge=1, le=600)] = 600  # seconds
    backoffJitter: Annotated[float, Field(ge=0, lt=1)] = 0.0
    maxAttempts: Annotated[int, Field(ge=0)] = 0  # 0 = no limit
    retryClientErrors: bool = False


class SerialPolicy(_RetryOptions):
    """Hermes' serial subscriptionPolicy plus backoffJitter (RocketMQ) and maxAttempts (NSQ); units as named."""

    rate: Annotated[float, Field(ge=1)] = 400  # messages per second
    messageBackoff: Annotated[int, Field(ge=0)] = 100  # milliseconds
    requestTimeout: Annotated[int, Field(ge=100, le=300_000)] = 1000  # milliseconds
    socketTimeout: Annotated[int, Field(ge=0, le=300_000)] = 0  # milliseconds, 0 = none
    inflightSize: Annotated[int, Field(ge=1, le=10_000)] = 100
    sendingDelay: Annotated[int, Field(ge=0, le=5000)] = 0  # milliseconds


class BatchPolicy(_RetryOptions):
    """Hermes' batch subscriptionPolicy (deliveryType BATCH) plus the same retry extensions as SERIAL: a batch
    is sent once it holds batchSize messages, once the next message would take its body past batchVolume
    bytes, or batchTime milliseconds after its first message was read."""

    batchSize: Annotated[int, Field(ge=1, le=10_000)] = 100  # messages
    batchTime: Annotated[int, Field(ge=1, le=3_600_000)] = 30_000  # milliseconds
    batchVolume: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = 64_000  # bytes of the request body
    messageBackoff: Annotated[int, Field(ge=0)] = 500  # milliseconds
    requestTimeout: Annotated[int, Field(ge=100, le=300_000)] = 30_000  # milliseconds


SERIAL_ONLY = tuple(sorted(set(SerialPolicy.model_fields) - set(BatchPolicy.model_fields)))
BATCH_ONLY = tuple(sorted(set(BatchPolicy.model_fields) - set(SerialPolicy.model_fields)))
BATCH_RATE_PER_S = 10_000.0  # attempts (batches) per second: Hermes' batch sender has no rate, so in effect none
# (at 400, the SERIAL default, the cap was what limited a backlog's drain: 40,000 messages a second)


def delivery_spec_of(policy: SerialPolicy | BatchPolicy) -> DeliverySpec:
    """subscriptionPolicy in the delivery code's units (seconds, messages per second), converted once.

    messageTtl s, messageBackoff ms, backoffMaxIntervalInSec s, requestTimeout ms, socketTimeout ms and
    sendingDelay ms all become float seconds; rate stays messages per second for the whole subscription and
    inflightSize messages for the whole subscription. messageTtl 0 stays 0 (exactly one attempt). BATCH:
    batchTime ms becomes seconds, batchVolume stays bytes, and attempts (one per batch) are capped at
    `BATCH_RATE_PER_S`.
    """
    retry = RetryPolicy(
        message_ttl_s=float(policy.messageTtl),
        backoff_s=policy.messageBackoff / 1000,
        backoff_multiplier=float(policy.backoffMultiplier),
        max_backoff_s=float(policy.backoffMaxIntervalInSec),
        backoff_jitter=float(policy.backoffJitter),
        max_attempts=policy.maxAttempts,
        retry_client_errors=policy.retryClientErrors,
    )
    if isinstance(policy, BatchPolicy):
        return DeliverySpec(
            retry=retry, rate_per_s=BATCH_RATE_PER_S, inflight=10_000,
            request_timeout_s=policy.requestTimeout / 1000,
            socket_timeout_s=0.0, sending_delay_s=0.0,  # Hermes' batch policy has neither
            batch=BatchSpec(size=policy.batchSize, time_s=policy.batchTime / 1000,
                            volume_bytes=policy.batchVolume))
    return DeliverySpec(
        retry=retry,
        rate_per_s=float(policy.rate),
        inflight=policy.inflightSize,
        request_timeout_s=policy.requestTimeout / 1000,
        socket_timeout_s=policy.socketTimeout / 1000,
        sending_delay_s=policy.sendingDelay / 1000,
        batch=None,
    )
