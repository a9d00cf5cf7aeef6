"""Endpoint strategies on their own (herald.delivery.choice): which endpoint each attempt goes to, and how many
units a message becomes, for one endpoint, ANYCAST round-robin, priority overflow and BROADCAST. No lane, no
transport: units are driven by hand (`attempts` counts the attempts made, as the lane does)."""

from __future__ import annotations

from herald.delivery.choice import EveryEndpoint, OneEndpoint, Overflow, RoundRobin, endpoint_choice
from herald.delivery.message import RetryState, TargetState
from herald.delivery.plan import Target
from herald.delivery.unit import MessageUnit
from tests.support.delivery import record


def unit(offset: int = 0) -> MessageUnit:
    return MessageUnit(record(0, offset), 0.0, 0.0, None)


def attempts_of(strategy, message: MessageUnit, count: int) -> list[int]:
    """The endpoints of `count` attempts of one message, made one after the other."""
    picked = []
    for _ in range(count):
        picked.append(strategy.pick(message))
        message.attempts += 1
    return picked


def test_the_shape_picks_the_strategy():
    plain = [Target("http://a"), Target("http://b")]
    assert isinstance(endpoint_choice(plain[:1], broadcast=False, load=lambda: (0, 0)), OneEndpoint)
    assert type(endpoint_choice(plain, broadcast=False, load=lambda: (0, 0))) is RoundRobin
    conditional = [Target("http://a"), Target("http://b", min_pending=10)]
    assert type(endpoint_choice(conditional, broadcast=False, load=lambda: (0, 0))) is Overflow
    every = endpoint_choice(plain, broadcast=True, load=lambda: (0, 0), departed=1)
    assert type(every) is EveryEndpoint and every.count == 1 and every.width == 2


def test_one_endpoint_takes_every_attempt_and_a_message_is_one_unit():
    strategy = OneEndpoint()
    assert attempts_of(strategy, unit(), 3) == [0, 0, 0]
    state = RetryState(2, 0, 0)
    assert strategy.spread(state) == [(None, state)] and strategy.width == 1 and not strategy.fans_out


def test_round_robin_spreads_first_attempts_and_moves_each_retry_to_the_next_endpoint():
    strategy = RoundRobin(3)
    first, second, third, fourth = unit(0), unit(1), unit(2), unit(3)
    assert [strategy.pick(message) for message in (first, second, third, fourth)] == [0, 1, 2, 0]
    second.attempts = 1
    assert strategy.pick(second) == 2, "its retry goes to the endpoint after its last"
    second.attempts = 2
    assert strategy.pick(second) == 0, "and wraps around"


def test_round_robin_places_a_carried_message_by_the_attempts_it_already_made():
    strategy = RoundRobin(3)
    carried = unit()
    carried.attempts = 4  # attempts of earlier rounds: its first here still takes the next endpoint in turn
    assert strategy.pick(carried) == 0
    assert strategy.pick(unit(1)) == 1, "the turn moved on"
    carried.attempts += 1
    assert strategy.pick(carried) == 1, "its retry: the endpoint after its last"
    assert strategy.pick(unit(2)) == 2, "a retry takes no new message's turn"


def test_overflow_serves_a_conditional_endpoint_only_while_the_load_reaches_its_threshold():
    load = [(0, 0)]
    targets = [Target("http://main"), Target("http://spill", min_pending=100), Target("http://hot", min_inflight=5)]
    strategy = Overflow(targets, lambda: load[0])
    assert [strategy.pick(unit(offset)) for offset in range(3)] == [0, 0, 0]
    load[0] = (100, 0)
    assert strategy.served() == [0, 1]
    load[0] = (0, 5)
    assert strategy.served() == [0, 2]
    load[0] = (150, 9)
    assert strategy.served() == [0, 1, 2]


def test_overflow_first_attempts_take_turns_and_retries_go_to_the_next_endpoint_served():
    load = [(500, 0)]
    strategy = Overflow([Target("http://main"), Target("http://spill", min_pending=100)], lambda: load[0])
    first, second = unit(0), unit(1)
    assert [strategy.pick(first), strategy.pick(second)] == [0, 1]
    assert strategy.pick(second) == 0, "after the last endpoint served: the first"
    assert strategy.pick(first) == 1
    load[0] = (0, 0)  # the backlog is gone: the spill endpoint is not served, even for a retry
    assert strategy.pick(first) == 0


def test_overflow_serves_every_endpoint_when_none_would_be():
    strategy = Overflow([Target("http://a", min_pending=10), Target("http://b", min_inflight=3)], lambda: (0, 0))
    assert strategy.served() == [0, 1]


def test_broadcast_makes_a_unit_per_endpoint_each_attempted_at_its_own():
    strategy = EveryEndpoint(3)
    assert strategy.spread(None) == [(0, None), (1, None), (2, None)]
    assert strategy.fans_out and strategy.width == 3
    member = unit()
    member.target = 2
    assert attempts_of(strategy, member, 2) == [2, 2]


def test_broadcast_continues_a_message_only_at_the_endpoints_it_still_owes():
    owed = (TargetState(0, 3, 1_000, 2.0, 503, "unavailable"), TargetState(4, 1, 2_000))
    state = RetryState(3, 500, 1_000, targets=owed)
    spread = EveryEndpoint(2, departed=3).spread(state)
    assert [index for index, _ in spread] == [0, 4], "a departed endpoint still owed is kept"
    assert spread[0][1] == RetryState(3, 500, 1_000, 2.0, 503, "unavailable")
    assert spread[1][1] == RetryState(1, 500, 2_000)
