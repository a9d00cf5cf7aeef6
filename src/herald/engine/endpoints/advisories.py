"""Advisories on a Kafka topic: where herald.yaml names `advisories: {topic: ...}`, every pin given and given up
is also published there as JSON, shaped like NATS' consumer-group advisories (docs/design.md §6):

    {"type": "io.herald.advisory.v1.pinned", "id": "...", "timestamp": "2026-11-26T10:00:00.000Z",
     "subscription": "group.topic.name", "endpoint": "http://primary/orders", "pinned_id": "...",
     "reason": "timeout"}

(`.unpinned` for a pin given up). The `advisories` table remains the record: an advisory that cannot be
published is logged and dropped (the producer retries it for 30 s first).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid

from herald.engine.endpoints.pin_group import Advisory

log = logging.getLogger(__name__)

TYPE_PREFIX = "io.herald.advisory.v1."


def advisory_message(advisory: Advisory) -> dict:
    """The JSON document of an advisory."""
    at = dt.datetime.fromtimestamp(advisory.at_ms / 1000, tz=dt.timezone.utc)
    return {"type": TYPE_PREFIX + advisory.type, "id": uuid.uuid4().hex,
            "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "subscription": advisory.subscription, "endpoint": advisory.endpoint, "pinned_id": advisory.pin_id,
            "reason": advisory.reason}


class AdvisoryPublisher:
    """A priority listener: each advisory to `topic`, keyed by subscription id (one partition keeps a
    subscription's advisories in order)."""

    def __init__(self, client_config: dict[str, str], topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self._producer = Producer({**client_config, "enable.idempotence": True, "delivery.timeout.ms": 30_000})

    def __call__(self, advisory: Advisory) -> None:
        if self._producer is None:
            return  # closed: the job is stopping (the advisory is in the table)
        def delivered(error, message) -> None:
            if error is not None:
                log.error("advisory %s of %s could not be published to %s: %s (it is in the advisories table)",
                          advisory.type, advisory.subscription, self.topic, error)

        self._producer.produce(self.topic, key=advisory.subscription.encode(),
                               value=json.dumps(advisory_message(advisory)).encode(), on_delivery=delivered)
        self._producer.poll(0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Publish what is queued (at most `timeout_s` seconds), then let the producer go."""
        if self._producer is not None:
            self._producer.flush(timeout_s)
            self._producer = None
