"""When to try a message again and when to give up: backoff, jitter, inflight TTL and max attempts.

All durations are float seconds. The YAML's mixed units (messageTtl s, messageBackoff ms, ...) are converted,
and its defaults given, once, where the config is loaded (`herald.config.policies`), and nowhere else: every field
here is required.

Example::

    policy = RetryPolicy(message_ttl_s=60, backoff_s=0.1, backoff_multiplier=2, max_backoff_s=5, backoff_jitter=0,
                         max_attempts=0, retry_client_errors=False)
    step = policy.after_failure(outcome, attempts=1, first_read_at=0.0, previous_backoff_s=None, now=0.2)
    # Retry(due_at=0.3, backoff_s=0.1) or GiveUp(reason=...)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from herald.delivery.outcome import Outcome


class EndedBy:
    """What ended a discarded message, stored beside its reason (the reason is always the last attempt's)."""

    STATUS = "status"  # an answer that is not retried (e.g. 400, or 429 without retryClientErrors)
    TTL = "messageTtl"  # no retry could start within messageTtl of the first read ("Total timeout elapsed")
    MAX_ATTEMPTS = "maxAttempts"
    DECODE = "decode"  # the record could not be decoded; never sent
    TEMPLATE = "template"  # an endpoint placeholder has no value in the message; never sent
    RETENTION = "retention"  # Kafka deleted the records before they were read (a LOST range, not a message)
    RESET = "reset"  # the topic's offsets went back (created again, or its log cut): a LOST range or a RESET row,
    # or a parked message whose offset the new log gives to another message


@dataclass(frozen=True)
class Retry:
    """Try again at `due_at` (same clock as `now`). `backoff_s` is the un-jittered delay the next one grows from."""

    due_at: float
    backoff_s: float | None


@dataclass(frozen=True)
class GiveUp:
    """Discard the message: `reason` is the last attempt's (as Hermes writes it), `ended_by` an `EndedBy`."""

    reason: str
    ended_by: str = EndedBy.STATUS


@dataclass(frozen=True)
class RetryPolicy:
    """Hermes' retry policy plus the `backoffJitter` (RocketMQ) and `maxAttempts` (NSQ) extensions.

    message_ttl_s: inflight TTL, counted from when the message was first read. It never refuses a message's
        first attempt: 0 means exactly one attempt, as in Hermes.
    backoff_s: delay before the first retry; later ones grow by `backoff_multiplier` up to `max_backoff_s`.
    backoff_jitter: j in [0, 1): the delay is drawn uniformly from [d(1-j), d(1+j)].
    max_attempts: 0 means no limit.
    """

    message_ttl_s: float
    backoff_s: float
    backoff_multiplier: float
    max_backoff_s: float
    backoff_jitter: float
    max_attempts: int
    retry_client_errors: bool

    def next_backoff(self, previous_backoff_s: float | None) -> float:
        """The un-jittered delay: `backoff_s` first, then previous * multiplier, never above `max_backoff_s`."""
        if previous_backoff_s is None:
            return min(self.backoff_s, self.max_backoff_s)
        return min(previous_backoff_s * self.backoff_multiplier, self.max_backoff_s)

    def jittered(self, backoff_s: float, rng: random.Random) -> float:
        """`backoff_s` spread uniformly over [d(1-j), d(1+j)] (RocketMQ's formula)."""
        if self.backoff_jitter <= 0:
            return backoff_s
        return rng.uniform(backoff_s * (1 - self.backoff_jitter), backoff_s * (1 + self.backoff_jitter))

    def deadline(self, first_read_at: float) -> float:
        """The last moment (same clock as `first_read_at`) a retry may start."""
        return first_read_at + self.message_ttl_s

    def after_failure(
        self,
        outcome: Outcome,
        attempts: int,
        first_read_at: float,
        previous_backoff_s: float | None,
        now: float,
        rng: random.Random | None = None,
    ) -> Retry | GiveUp:
        """Decide what follows a failed attempt.

        attempts: attempts made so far, including the one that produced `outcome`.
        A Retry-After delay replaces the backoff formula (and leaves the backoff sequence where it was).
        A retry is scheduled only if it can start within the TTL; otherwise the message is given up at once.
        """
        if not outcome.retry:
            return GiveUp(outcome.reason, EndedBy.STATUS)
        if self.max_attempts and attempts >= self.max_attempts:
            return GiveUp(outcome.reason, EndedBy.MAX_ATTEMPTS)
        if outcome.retry_after_s is not None:
            delay_s, backoff_s = outcome.retry_after_s, previous_backoff_s
        else:
            backoff_s = self.next_backoff(previous_backoff_s)
            delay_s = self.jittered(backoff_s, rng or random.Random())
        if now + delay_s > self.deadline(first_read_at):
            return GiveUp(outcome.reason, EndedBy.TTL)
        return Retry(due_at=now + delay_s, backoff_s=backoff_s)
