"""Units of delivery on their own (herald.delivery.unit): how a unit ends, and how a BROADCAST message's members
end it together. No lane, no transport; times are the loop's `Instant` (monotonic s, epoch ms)."""

from __future__ import annotations

import pytest

from herald.delivery.clock import Instant
from herald.delivery.unit import Broadcast, MemberUnit, MessageUnit, UnitEnd
from tests.support.delivery import record

NOW = Instant(100.0, 1_800_000_000_000)


def members(count: int) -> tuple[Broadcast, list[MemberUnit]]:
    group = Broadcast()
    message = record(0, 7)
    group.members = [MemberUnit(message, NOW.s, NOW.s, None, index, group) for index in range(count)]
    group.remaining = count
    return group, group.members


def test_a_message_ends_as_its_unit_does():
    unit = MessageUnit(record(0, 1), NOW.s, NOW.s, None)
    assert unit.end(failed=False) is UnitEnd.DELIVERED
    assert MessageUnit(record(0, 2), NOW.s, NOW.s, None).end(failed=True) is UnitEnd.DISCARDED


def test_a_unit_ends_once():
    unit = MessageUnit(record(0, 1), NOW.s, NOW.s, None)
    unit.finish(UnitEnd.PARKED)
    with pytest.raises(AssertionError, match="already"):
        unit.finish(UnitEnd.DELIVERED)


def test_a_broadcast_message_ends_with_its_last_member_delivered_only_if_none_was_given_up():
    _, (first, second, third) = members(3)
    assert first.end(failed=False) is None and second.end(failed=True) is None, "siblings still going"
    assert third.end(failed=False) is UnitEnd.DISCARDED, "one endpoint missed it"
    _, (alone, other) = members(2)
    assert alone.end(failed=False) is None and other.end(failed=False) is UnitEnd.DELIVERED


def test_a_broadcast_message_left_over_sums_up_its_members_states():
    group, (first, second, third) = members(3)
    assert group.untouched([first, second, third])
    first.attempts, first.due_at, first.last_status = 3, NOW.s + 5, 503
    second.attempts, second.due_at = 1, NOW.s + 1
    assert third.end(failed=False) is None
    state = Broadcast.state([first, second], NOW)
    assert (state.attempts, state.last_status, state.due_ms) == (3, 503, NOW.ms + 1000), "most tried, earliest due"
    assert [(target.index, target.attempts) for target in state.targets] == [(0, 3), (1, 1)], "the third got it"
    assert not group.untouched([first, second])
