"""`herald publish`: send JSON messages to a topic, retrying failures with jittered exponential backoff.

The producer (librdkafka, idempotent) retries each request itself within `message_timeout_s`. Messages it
still reports as failed are sent again in rounds spaced by RocketMQ's backoff (seeds/002: initial 1 s,
multiplier 1.6, jitter 0.2, max 120 s). A message whose last round fails is reported, never dropped silently.
Every message gets an `id` header (as Hermes' frontend does), which becomes its Hermes-Message-Id.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt

from herald.delivery.policy import RetryPolicy

log = logging.getLogger(__name__)

# seeds/002: INITIAL_BACKOFF 1 s, MULTIPLIER 1.6, JITTER 0.2, MAX_BACKOFF 120 s
PUBLISH_BACKOFF = RetryPolicy(message_ttl_s=3600.0, backoff_s=1.0, backoff_multiplier=1.6, max_backoff_s=120.0,
                              backoff_jitter=0.2, max_attempts=0, retry_client_errors=False)


@dataclass
class PublishResult:
    sent: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (line number, why) never sent: not JSON
    failed: list[tuple[int, str]] = field(default_factory=list)  # (line number, last error) after every retry
    ids: list[str] = field(default_factory=list)


def backoff_wait(policy: RetryPolicy, rng: random.Random | None = None):
    """A tenacity wait strategy (seconds) from a Herald RetryPolicy: grows by the multiplier, jittered."""
    rng = rng or random.Random()

    def wait(state: RetryCallState) -> float:
        backoff = None
        for _ in range(state.attempt_number):
            backoff = policy.next_backoff(backoff)
        return policy.jittered(backoff, rng)

    return wait


def publish(
    bootstrap_servers: str,
    kafka_topic: str,
    messages: Iterable[str],
    client_properties: dict[str, str] | None = None,
    retries: int = 3,
    message_timeout_s: float = 10.0,
    policy: RetryPolicy = PUBLISH_BACKOFF,
    encode: Callable[[Any], bytes] | None = None,
) -> PublishResult:
    """Publish JSON `messages` (one per item); invalid JSON is rejected, failures are retried `retries` times.

    `encode` turns each parsed JSON document into the record's bytes (for AVRO topics, `herald.avro.encode`);
    a document it refuses (ValueError) is rejected with the reason. Without it the JSON text is sent as is.
    """
    from confluent_kafka import Producer

    result = PublishResult()
    pending: dict[int, bytes] = {}
    for number, text in enumerate(messages, start=1):
        text = text.strip()
        if not text:
            continue
        try:
            document = json.loads(text)
        except ValueError as error:
            result.rejected.append((number, f"not JSON: {error}"))
            continue
        try:
            pending[number] = encode(document) if encode is not None else text.encode()
        except ValueError as error:
            result.rejected.append((number, str(error)))
    ids = {number: str(uuid.uuid4()) for number in pending}
    producer = Producer({
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "message.timeout.ms": int(message_timeout_s * 1000),
        **(client_properties or {}),
    })
    last_error: dict[int, str] = {}

    def send_round() -> dict[int, bytes]:
        failed: dict[int, bytes] = {}

        def report(number: int):
            def on_delivery(error, _message) -> None:
                if error is not None:
                    failed[number] = pending[number]
                    last_error[number] = str(error)
            return on_delivery

        for number, body in list(pending.items()):
            try:
                producer.produce(kafka_topic, value=body, headers=[("id", ids[number].encode())],
                                 on_delivery=report(number))
            except BufferError as error:
                producer.flush(message_timeout_s)
                failed[number], last_error[number] = body, str(error)
            producer.poll(0)
        producer.flush(message_timeout_s + 5)
        for number in set(pending) - set(failed):
            result.sent += 1
            result.ids.append(ids[number])
            del pending[number]
        if failed:
            log.warning("%d message(s) failed, retrying: %s", len(failed), next(iter(last_error.values())))
        return failed

    retrying = Retrying(
        stop=stop_after_attempt(retries + 1),
        wait=backoff_wait(policy),
        retry=retry_if_result(bool),
        retry_error_callback=lambda state: state.outcome.result(),
    )
    retrying(send_round)
    result.failed = [(number, last_error.get(number, "unknown")) for number in sorted(pending)]
    return result
