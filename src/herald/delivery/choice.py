"""Which endpoint an attempt goes to: one strategy per delivery shape, all with the same two questions.

- `spread(state)`: the units one message becomes in the lane, as (endpoint index or None, state) pairs: one
  unit whose attempts the strategy places (None), or one unit per endpoint (BROADCAST: each with its own
  progress, from a carried or parked `state` when it continues);
- `pick(unit)`: the endpoint of the attempt about to start (an index into the lane's targets).

`width` is the most units one message becomes: a lane's open-attempt limit is its concurrency times that;
`fans_out` says whether a message becomes one unit per endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from herald.delivery.message import RetryState
from herald.delivery.plan import Target
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
            unit.target = (self._next - unit.attempts) % self.count  # never negative: its turn is taken once
            self._next = (self._next + 1) % self.count
        return (unit.target + unit.attempts) % self.count


class Overflow(OneEndpoint):
    """Priority overflow (NATS' `overflow` policy, for push): the endpoints without conditions are always
    served; one with conditions only while the subscription's pending messages reach its `min_pending` or its
    messages in flight reach its `min_inflight` (either suffices). `load()` gives (pending, in flight) now.
    First attempts take turns among the endpoints served now; each retry goes to the next one served after the
    endpoint of its last attempt."""

    def __init__(self, targets: Sequence[Target], load: Callable[[], tuple[int, int]]) -> None:
        self.targets = tuple(targets)
        self.load = load
        self._next = 0

    def served(self) -> list[int]:
        """The endpoints served now, in list order (validate requires one without conditions; should none be
        served, every endpoint is)."""
        pending, in_flight = self.load()
        served = [index for index, target in enumerate(self.targets) if not target.conditional
                  or (target.min_pending is not None and pending >= target.min_pending)
                  or (target.min_inflight is not None and in_flight >= target.min_inflight)]
        return served or list(range(len(self.targets)))

    def pick(self, unit: Unit) -> int:
        served = self.served()
        if unit.target < 0:
            index = served[self._next % len(served)]
            self._next += 1
        else:
            index = next((i for i in served if i > unit.target), served[0])
        unit.target = index
        return index


class EveryEndpoint:
    """BROADCAST: one unit per endpoint the message has not reached yet (every endpoint, unless it continues
    with some reached), each attempted at its own endpoint. `departed`: targets after the first `count` that
    left the subscription's endpoints (docs/design.md §7): only messages that still owe them an answer go
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


def endpoint_choice(targets: Sequence[Target], broadcast: bool, load: Callable[[], tuple[int, int]],
                    departed: int = 0) -> OneEndpoint | EveryEndpoint:
    """The strategy for a lane with these endpoints. `load()`: (pending, in flight), for overflow endpoints;
    `departed`: the last targets are endpoints that left (BROADCAST only: messages resumed from an earlier round
    still owe them an answer)."""
    count = len(targets) - departed
    if broadcast:
        return EveryEndpoint(count, departed)
    if any(target.conditional for target in targets):
        return Overflow(targets, load)
    return RoundRobin(count) if count > 1 else OneEndpoint()
