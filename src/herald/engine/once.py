"""How a `--once` run knows a subscription is done for this run: caught up, or held until the next one (at a
message an ordered subscription keeps retrying, or by flow control slowing it past the run's patience). The runner
(`herald.engine.runner`) asks these when it decides the run is over and when it says what each held
subscription has left."""

from __future__ import annotations

from herald.delivery.flow import FlowMode, FlowSettings
from herald.engine.context import now_ms
from herald.engine.round.state import SubscriptionState


def throttled(state: SubscriptionState, frontier: dict[int, int], patience_s: float, flow: FlowSettings) -> bool:
    """A subscription behind `frontier` that flow control slowed (its subscriber keeps failing) so much that
    what it has left would take longer than `patience_s` (seconds) at its rate now: --once counts it as held
    until the next run, instead of probing a failing subscriber once a minute for days. (A subscription at its
    hard `rate` is not throttled: the run delivers what was there, at the pace it was asked for.)"""
    if state.flow.mode is FlowMode.NORMAL:
        return False
    left = lag(state.positions, frontier)
    return left > 0 and left / rate_of(state, flow) > patience_s


def rate_of(state: SubscriptionState, flow: FlowSettings) -> float:
    """Messages a second flow control lets a slowed subscription send now."""
    if state.flow.mode is FlowMode.HEARTBEAT:
        return 1.0 / flow.heartbeat_interval_s
    return state.flow.rate_per_s or flow.slow_rate_per_s


def lag(positions: dict[int, int], frontier: dict[int, int]) -> int:
    """Offsets between a subscription's positions and `frontier`."""
    return sum(max(0, end - positions.get(partition, end)) for partition, end in frontier.items())


def held(state: SubscriptionState, frontier: dict[int, int], patience_s: float) -> bool:
    """An ordered subscription whose every partition behind `frontier` is stopped at a message (or batch) it has
    attempted and kept retrying for longer than `patience_s` since its first read: --once does not wait out its
    TTL. A message not attempted yet (a batch closed as the round ended, a subscription slowed by flow control)
    holds nothing: it is sent by the next catch-up round."""
    if not state.subscription.delivery_spec.ordered:
        return False
    carried, now = state.live_carried(), now_ms()
    for partition, end in frontier.items():
        position = state.positions.get(partition, end)
        if position >= end:
            continue
        blocking = carried.get((partition, position))
        if blocking is None or blocking.attempts == 0 or now - blocking.first_read_ms < patience_s * 1000:
            return False
    return True
