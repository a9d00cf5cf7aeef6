"""Which endpoint an attempt goes to: one strategy per delivery shape, all with the same two questions.

- `spread(state)`: the units one message becomes in the lane, as (endpoint index or None, state) pairs: one
  unit whose attempts the strategy places (None), or one unit per endpoint (BROADCAST: each with its own
  progress, from a carried or parked `state` when it continues);
- `pick(unit)`: the endpoint of the attempt about to start (an index into the lane's targets).

`width` is the most units one message becomes: a lane's open-attempt limit is its concurrency times that;
`fans_out` says whether a message becomes one unit per endpoint.
"""

from __future__ import annotations

from herald.delivery.message import RetryState
from herald.delivery.unit import Unit

Spread = list[tuple[int | None, RetryState | None]]


class OneEndpoint:
    """A single endpoint: every attempt goes there."""

    width = 1
    fans_out = False

    def spread(self, state: RetryState | None) -> Spread:
        return [(None, state)]

    def pick(self, unit: Unit) -> int:
        return 0


class RoundRobin(OneEndpoint):
    """ANYCAST over several endpoints: a message's first attempt here goes to the next endpoint round-robin
    (per lane), each retry to the one after its last."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._next = 0

    def pick(self, unit: Unit) -> int:
        if unit.target < 0:
            unit.target = self._next - unit.attempts
            self._next = (self._next + 1) % self.count
        return (unit.target + unit.attempts) % self.count


class EveryEndpoint:
    """BROADCAST: one unit per endpoint the message has not reached yet (every endpoint, unless it continues
    with some reached), each attempted at its own endpoint. `departed`: targets after the first `count` that
    left the subscription's endpoints (docs/design.md §5c): only messages that still owe them an answer go
    there, new messages go to the first `count`."""

    fans_out = True

    def __init__(self, count: int, departed: int = 0) -> None:
        self.count = count
        self.width = count + departed

    def spread(self, state: RetryState | None) -> Spread:
        if state is not None and state.targets:
            return [(target.index, state.at_target(target)) for target in state.targets]
        return [(index, state) for index in range(self.count)]

    def pick(self, unit: Unit) -> int:
        return unit.target


def endpoint_choice(count: int, broadcast: bool, departed: int = 0) -> OneEndpoint | EveryEndpoint:
    """The strategy for a lane with `count` endpoints, followed by `departed` ones (BROADCAST only: endpoints
    that left, which messages resumed from an earlier round still owe an answer)."""
    if broadcast:
        return EveryEndpoint(count, departed)
    return RoundRobin(count) if count > 1 else OneEndpoint()
