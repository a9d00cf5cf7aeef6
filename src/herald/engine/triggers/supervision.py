"""Keeping every topic going: a topic that failed (or could not start) is started again alone, with backoff.

A topic can fail for reasons of its own (its Kafka topic deleted) or fail to start (its topic not created yet,
Kafka not reachable); the job's shared read can fail for reasons of none of its topics (a Python worker that did
not connect back under load, a lost broker connection). Subscriptions' positions are in the offsets table and
the read's in its checkpoint, so nothing is lost: the topic (or the read, for each of its topics) is started
again after 1 s, then 2, 4, ... up to 60 s between tries, and the other topics go on meanwhile
(`herald.engine.triggers.topics`). A read started again that completes a micro-batch has recovered: its next failure
starts the backoff again from 1 s.

With `--once` a topic is given up after `ONCE_RESTARTS` restarts that failed again, once it has been failing
for `ONCE_PATIENCE_S` (a read failing for no topic of its own fails each of its topics: a busy machine's Python
worker that did not start in time must not end a run at once): the run finishes every other topic and ends with
exit code 1, naming the topics it could not finish and why.

Times are the supervisor's clock: monotonic seconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from herald.avro.registry import RegistryUnavailableError
from herald.endpoint import mask_secrets

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
ONCE_RESTARTS = 3
ONCE_PATIENCE_S = 30.0


@dataclass
class TopicFailure:
    """A topic not running: why (the last error), how many failures in a row, when to try again (monotonic s)."""

    error: str
    failures: int
    retry_at: float
    given_up: bool = False


class QuerySupervisor:
    def __init__(self, once: bool, clock: Callable[[], float] = time.monotonic,
                 first_backoff_s: float = FIRST_BACKOFF_S, max_backoff_s: float = MAX_BACKOFF_S,
                 once_restarts: int = ONCE_RESTARTS) -> None:
        self.once = once
        self.clock = clock
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.once_restarts = once_restarts
        self._failures: dict[str, TopicFailure] = {}
        self._streak: dict[str, int] = {}  # topic -> failures since it last completed a micro-batch
        self._failing_since: dict[str, float] = {}  # topic -> when the streak's first failure came

    def failed(self, topic: str, error: str) -> TopicFailure:
        """`topic`'s query failed (or did not start) with `error`: when to try again, or give it up."""
        streak = self._streak.get(topic, 0) + 1
        self._streak[topic] = streak
        now = self.clock()
        since = self._failing_since.setdefault(topic, now) if streak > 1 else now
        self._failing_since[topic] = since
        backoff_s = min(self.first_backoff_s * 2 ** (streak - 1), self.max_backoff_s)
        failure = TopicFailure(error, streak, now + backoff_s, given_up=self.once and streak > self.once_restarts
                               and now - since >= ONCE_PATIENCE_S)
        self._failures[topic] = failure
        return failure

    def give_up(self, topic: str, error: str) -> None:
        """(--once) The topic's rounds keep failing while its read runs: the run finishes without it."""
        self._failures[topic] = TopicFailure(error, self._streak.get(topic, 0) + 1, self.clock(), given_up=True)

    def due(self, topic: str) -> bool:
        """True when a failed topic is to be started again now."""
        failure = self._failures.get(topic)
        return failure is not None and not failure.given_up and self.clock() >= failure.retry_at

    def restarted(self, topic: str) -> None:
        """The topic's query is running again (it may still fail: its streak counts on until it recovers)."""
        failure = self._failures.get(topic)
        if failure is not None and not failure.given_up:
            del self._failures[topic]

    def recovered(self, topic: str) -> None:
        """The topic's query completed a micro-batch: a later failure backs off from the start again."""
        self._streak.pop(topic, None)
        self._failing_since.pop(topic, None)

    def forget(self, topic: str) -> None:
        """The topic is no longer delivered (removed from the configuration)."""
        self._failures.pop(topic, None)
        self._streak.pop(topic, None)
        self._failing_since.pop(topic, None)

    def failing(self, topic: str) -> TopicFailure | None:
        return self._failures.get(topic)

    def given_up(self) -> dict[str, str]:
        """topic -> why, for the topics `--once` could not finish."""
        return {topic: failure.error for topic, failure in self._failures.items() if failure.given_up}

    def not_running(self) -> dict[str, str]:
        """topic -> why, for every topic failed and not running now."""
        return {topic: failure.error for topic, failure in self._failures.items()}


def short_error(error: BaseException) -> str:
    """The root cause of a failed query or start: the last `SomethingError: ...` line of the (Java and Python)
    chain, secrets masked."""
    lines = [line.strip() for line in str(getattr(error, "desc", None) or error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return mask_secrets(causes[-1] if causes else (lines[0] if lines else repr(error)))


OUTAGES = (RegistryUnavailableError.__name__,)
"""Errors (by name, as they come back from a Spark task) that say a service a round needs could not answer for a
while: the round fails and runs again later with backoff, which is expected, so it is logged without a trace."""


def outage(reason: str) -> bool:
    """True when `reason` (a `short_error`) is one of the `OUTAGES`."""
    return any(f"{name}: " in reason for name in OUTAGES)
