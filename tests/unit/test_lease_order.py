"""Who holds the storage path's lease, by the `leases` table's commit order (herald.storage.lease.Holder): pure
logic on versions, no table."""

from __future__ import annotations

import pytest

from herald.storage.lease import Holder


def _holder(name: str, version: int, taken_version: int = -1, seen_version: int = -1) -> Holder:
    return Holder(name, "host", 1, 0, 0, False, version=version, taken_version=taken_version,
                  seen_version=seen_version)


@pytest.mark.parametrize("holder_version, holder_taken, supersedes", [
    (3, -1, True),  # the taker saw the holder's taking as its newest row, and nothing came after it
    (2, 1, True),  # the holder had renewed before the look: the taker saw that renewal
    (-1, 1, True),  # the holder's newest row is older than every commit read
    (6, 1, False),  # the holder renewed between the taker's look (5) and its taking (8): the look was stale
    (9, 1, True),  # the holder renewed after the taking, without having seen it: it must stop
])
def test_a_taking_supersedes_a_holder_it_saw_and_judged_ended(holder_version, holder_taken, supersedes):
    taker = _holder("taker", version=8, seen_version=5)
    assert taker.supersedes(_holder("holder", holder_version, holder_taken)) is supersedes


def test_two_takings_that_did_not_see_each_other_supersede_neither():
    """Jobs starting together: each decided on a version without the other's taking."""
    early = _holder("early", version=3, seen_version=1)
    late = _holder("late", version=5, seen_version=2)
    assert not late.supersedes(early) and not early.supersedes(late)
    renewed_late = _holder("late", version=9, taken_version=5, seen_version=2)
    assert not renewed_late.supersedes(early), "a renewal keeps its taking's version and look"


def test_a_taking_that_saw_no_version_supersedes_no_one():
    """A row of a Herald older than the commit order, or a taking decided on an empty table."""
    assert not _holder("taker", version=8).supersedes(_holder("holder", version=-1))
