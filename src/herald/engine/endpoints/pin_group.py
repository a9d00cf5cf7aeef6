"""A pinned subscription's pin: which endpoint gets its traffic, and when it moves (NATS' `pinned_client`).

`priority: {policy: pinned, timeoutMs}` sends every attempt of a subscription (first attempts, retries,
batches) to ONE endpoint, the pinned one, with a `Herald-Pin-Id` header. This module is the pin's state
machine, pure and clocked by its callers (epoch ms); `herald.engine.endpoints.priority_groups` runs it for the job
(docs/design.md §6).

A pin is lost when its endpoint has accepted nothing (no 2xx) for `timeoutMs` while it had messages to take,
when an operator unpins it, or when its endpoint leaves the subscription's list. Then, as the ADR says:

1. no new round sends to it (rounds planned from now on leave the subscription out: its messages wait);
2. the rounds already sending to it finish (their in-flight requests end or time out);
3. once none is left, the next endpoint in list order (wrapping round) is pinned,
4. with a new pin id, recorded (the `advisories` table) before any request carries it;
5. and the rounds go on with it. There is no fail-back: a new pin stays until it too is lost.

"Accepted nothing while it had messages": the rounds report, for the pinned endpoint, the last time it
answered 2xx and since when the attempts that followed were all refused (`PinNews`). The endpoint is refused
since the later of its last 2xx anywhere and the start of the oldest refusal streak still running at a round's
end; an idle endpoint never times out.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass

PINNED, UNPINNED = "pinned", "unpinned"
TIMEOUT, ADMIN, START, ENDPOINT_REMOVED = "timeout", "admin", "start", "endpoint removed"
REASONS = (TIMEOUT, ADMIN, START, ENDPOINT_REMOVED)


def new_pin_id() -> str:
    """A fresh random pin id (22 characters, like a NATS nuid)."""
    return secrets.token_urlsafe(16)[:22]


@dataclass(frozen=True)
class Advisory:
    """A pin given (`pinned`) or given up (`unpinned`): a row of the advisories table. `endpoint` is the URL as
    people see it (password masked); `at_ms`: epoch ms."""

    type: str
    subscription: str
    endpoint: str
    pin_id: str
    reason: str
    at_ms: int


@dataclass(frozen=True)
class Pin:
    """What a round gets: the pinned endpoint (its index in the subscription's endpoints), the pin id, and
    since when (epoch ms) the endpoint has refused every attempt while it had messages (None: it accepts)."""

    index: int
    pin_id: str
    timeout_ms: int
    refused_since_ms: int | None
    group: int = 0  # the `PinGroup.token` of the group that leased it
    endpoint: str = ""  # the pinned endpoint as people see it (the planner finds it by this, §7)


@dataclass(frozen=True)
class PinNews:
    """What a round saw of the pinned endpoint (merged over its tasks by `merge`): the last 2xx (epoch ms, or
    None) and the start of the refusal streak it ended in (None: its last answer was a 2xx)."""

    accepted_ms: int | None
    refused_since_ms: int | None

    @staticmethod
    def merge(news: list[PinNews]) -> PinNews | None:
        """One round's news from its tasks' (None when no task attempted anything)."""
        if not news:
            return None
        accepted = max((n.accepted_ms for n in news if n.accepted_ms is not None), default=None)
        streaks = [n.refused_since_ms for n in news if n.refused_since_ms is not None]
        return PinNews(accepted, min(streaks) if streaks else None)


_tokens = itertools.count(1)


class PinGroup:
    """The pin of one subscription. `endpoints`: its endpoints as people see them (password masked), in list
    order; they identify the pinned endpoint across restarts. `token` tells this group's leases from those of
    an earlier group of the same subscription (suspended and activated again). Not thread-safe: its owner
    locks."""

    def __init__(self, subscription_id: str, endpoints: tuple[str, ...], timeout_ms: int) -> None:
        self.token = next(_tokens)
        self.active = True  # False: the subscription is no longer delivered, but rounds of it still run
        self.subscription_id = subscription_id
        self.endpoints = endpoints
        self.timeout_ms = timeout_ms
        self.index: int | None = None  # the pinned endpoint; None before the first pin
        self.pin_id: str | None = None
        self.since_ms: int | None = None
        self.leaving: Advisory | None = None  # the pin is being given up (why): no new round gets it
        self.rounds = 0  # rounds planned with the current pin that have not ended
        self.accepted_ms: int | None = None
        self.refused_since_ms: int | None = None

    @property
    def endpoint(self) -> str | None:
        return self.endpoints[self.index] if self.index is not None else None

    # -- the pin's life ---------------------------------------------------------------------------------------
    def restore(self, pinned: Advisory | None, unpinned: Advisory | None, now_ms: int) -> Advisory | None:
        """Take up where the advisories left off: `pinned` is the subscription's last pin, `unpinned` the
        advisory that gave it up, if any. The same endpoint and pin id while it is still listed and not given
        up; otherwise a switch is due (`due`), to the first endpoint at the very start. Returns the `unpinned`
        advisory to record when the pinned endpoint left the list while no job ran."""
        if pinned is None:
            self.leaving = Advisory(UNPINNED, self.subscription_id, "", "", START, now_ms)  # nothing to record
        elif unpinned is not None:
            self.leaving = unpinned  # recorded already
        elif pinned.endpoint in self.endpoints:
            self.index, self.pin_id = self.endpoints.index(pinned.endpoint), pinned.pin_id
            self.since_ms = pinned.at_ms
        else:
            self.leaving = Advisory(UNPINNED, self.subscription_id, pinned.endpoint, pinned.pin_id,
                                    ENDPOINT_REMOVED, now_ms)
            return self.leaving
        return None

    def lease(self) -> Pin | None:
        """The pin for a round about to be planned (the round must `release` it), or None: the subscription
        sits the round out (its pin is being given up, or it has none yet: call `switch` first)."""
        if self.leaving is not None or self.index is None:
            return None
        self.rounds += 1
        return Pin(self.index, self.pin_id, self.timeout_ms, self.refused_since_ms, group=self.token,
                   endpoint=self.endpoint)

    def release(self, pin: Pin, news: PinNews | None, now_ms: int) -> Advisory | None:
        """A round planned with `pin` ended, having seen `news` (None: nothing was answered). Returns the
        `unpinned` advisory when the pin times out now: only on news of a refusal, so an idle endpoint never
        times out."""
        if pin.group != self.token or pin.pin_id != self.pin_id:
            return None  # another group's lease (one a switch could not have waited for does not exist)
        self.rounds -= 1
        if news is not None:
            if news.accepted_ms is not None:
                self.accepted_ms = max(self.accepted_ms or news.accepted_ms, news.accepted_ms)
            if news.refused_since_ms is None:
                self.refused_since_ms = None
            else:
                since = news.refused_since_ms if self.refused_since_ms is None else \
                    min(self.refused_since_ms, news.refused_since_ms)
                self.refused_since_ms = max(since, self.accepted_ms or since, self.since_ms or since)
        if (self.leaving is None and news is not None and news.refused_since_ms is not None
                and self.refused_since_ms is not None and now_ms - self.refused_since_ms >= self.timeout_ms):
            return self.unpin(TIMEOUT, now_ms)
        return None

    def unpin(self, reason: str, now_ms: int, pin_id: str | None = None) -> Advisory | None:
        """Give the pin up (`pin_id`: only if it is still that one). Returns the `unpinned` advisory, or None
        when there is nothing to give up."""
        if self.index is None or self.leaving is not None or (pin_id is not None and pin_id != self.pin_id):
            return None
        # after the pin, even when it was stamped ahead of this clock (after an unpin from a host whose clock runs
        # ahead): the table's newest rows are the group's state
        at_ms = now_ms if self.since_ms is None else max(now_ms, self.since_ms + 1)
        self.leaving = Advisory(UNPINNED, self.subscription_id, self.endpoint, self.pin_id, reason, at_ms)
        return self.leaving

    def due(self) -> bool:
        """A switch may happen now: the pin is given up (or none was given) and no round is still sending."""
        return self.leaving is not None and self.rounds == 0

    def next_pin(self, now_ms: int) -> Advisory | None:
        """The `pinned` advisory of the switch `due` allows: the endpoint after the one given up, in list order
        (the first when there was none, or it left the list), with a new pin id; None while there is no
        endpoint to pin. Nothing changes until it is recorded and `take`n."""
        if not self.endpoints:
            return None
        left = self.leaving
        if left is not None and left.endpoint in self.endpoints:
            index = (self.endpoints.index(left.endpoint) + 1) % len(self.endpoints)
        else:
            index = 0
        reason = left.reason if left is not None else START
        at_ms = max(now_ms, left.at_ms + 1) if left is not None else now_ms  # after the unpin, even in its ms
        return Advisory(PINNED, self.subscription_id, self.endpoints[index], new_pin_id(), reason, at_ms)

    def take(self, pinned: Advisory) -> None:
        """The switch to `pinned` (from `next_pin`) is recorded: it is the pin from now on."""
        self.index, self.pin_id, self.since_ms = self.endpoints.index(pinned.endpoint), pinned.pin_id, pinned.at_ms
        self.leaving = None
        self.accepted_ms = self.refused_since_ms = None

    def reconfigure(self, endpoints: tuple[str, ...], timeout_ms: int, now_ms: int) -> Advisory | None:
        """The subscription's file changed: its endpoints (as people see them) and timeout. Returns the
        `unpinned` advisory when the pinned endpoint left the list."""
        pinned = self.endpoint
        advisory = None
        if pinned is not None and pinned not in endpoints:
            advisory = self.unpin(ENDPOINT_REMOVED, now_ms)
            self.index = None  # no round may get an endpoint that is not listed any more
        elif pinned is not None:
            self.index = endpoints.index(pinned)
        self.endpoints, self.timeout_ms = endpoints, timeout_ms
        return advisory
