"""Offsets that go back (herald.engine.round.resets): when a topic created again, or a partition's log cut, is a reset,
where each subscription goes on, and what it lost."""

from __future__ import annotations

from herald.engine.round.resets import PartitionReset, find_reset, known_ends, reset_subscription, went_back


def test_an_end_below_what_the_job_knew_is_a_new_log_when_no_id_says_otherwise():
    reset = find_reset("t", {0: 20, 1: 5}, None, {0: (0, 10), 1: (0, 7)}, None, found_ms=1)
    assert reset is not None and set(reset.partitions) == {0}, "partition 1 grew past what was known: not told"
    part = reset.partitions[0]
    assert (part.known_end, part.low, part.high, part.recreated) == (20, 0, 10, True)
    assert part.position_after(20) == 0 and part.position_after(3) == 0, "a new log: from its start"


def test_nothing_went_back_is_no_reset():
    assert find_reset("t", {0: 10}, "A", {0: (0, 10)}, "A", 1) is None
    assert find_reset("t", {0: 10}, None, {0: (3, 12)}, None, 1) is None, "retention moved the start: no reset"
    assert find_reset("t", {}, None, {0: (0, 0)}, None, 1) is None, "nothing known yet"


def test_a_new_topic_id_resets_every_partition_even_when_it_grew_past_the_old_ends():
    reset = find_reset("t", {0: 20, 1: 4}, "A", {0: (0, 30), 1: (0, 2)}, "B", 1)
    assert reset is not None and set(reset.partitions) == {0, 1}
    assert all(part.recreated for part in reset.partitions.values())
    assert reset.partitions[0].position_after(20) == 0


def test_the_same_id_with_an_end_below_is_a_cut_log_that_goes_on_from_the_cut():
    reset = find_reset("t", {0: 20}, "A", {0: (0, 15)}, "A", 1)
    part = reset.partitions[0]
    assert not part.recreated and part.first_gone == 15
    assert part.position_after(18) == 15, "past the cut: from the cut"
    assert part.position_after(12) == 12, "below the cut: nothing changes, its messages are still there"
    assert part.lost(18) == (18, 20) and part.lost(12) == (15, 20)


def test_a_subscription_loses_what_it_had_not_read_of_the_old_log():
    reset = find_reset("t", {0: 20, 1: 9}, "A", {0: (0, 3), 1: (0, 1)}, "B", 1)
    outcome = reset_subscription(reset, {0: 12, 1: 9}, carried=[(0, 12), (0, 14), (1, 9)])
    assert outcome.positions == {0: 0, 1: 0}
    assert outcome.lost == [(0, 12, 20)], "partition 1 was read to its known end: nothing lost there"
    assert outcome.dropped == {(0, 12), (0, 14), (1, 9)}, "carried states of the old log are released"


def test_a_cut_log_drops_only_the_carried_states_past_the_cut():
    reset = find_reset("t", {0: 20}, "A", {0: (0, 15)}, "A", 1)
    outcome = reset_subscription(reset, {0: 10}, carried=[(0, 10), (0, 16)])
    assert outcome.positions == {0: 10}
    assert outcome.dropped == {(0, 16)}
    assert outcome.lost == [(0, 15, 20)]


def test_known_ends_and_went_back():
    assert known_ends({0: 5}, None, {0: 9, 1: 2}, {}) == {0: 9, 1: 2}
    assert went_back({0: 10, 1: 8}, {0: 20, 1: 8}) == [0]
    assert went_back({0: 10, 2: 0}, {0: 10}) == [], "a partition added since: not a reset"


def test_describe_names_the_topic_the_partitions_and_both_offsets():
    reset = find_reset("orders", {0: 20}, "A", {0: (0, 10)}, "B", 1)
    text = reset.describe()
    assert "orders" in text and "created again" in text and "A -> B" in text and "0: 20 -> 0..10" in text
    assert PartitionReset(0, 20, 0, 10, True).lost(20) is None


def test_a_topic_created_again_with_fewer_partitions_resets_the_partition_it_no_longer_has():
    """The new topic has partition 0 only: partition 1, which the job knew to offset 9, starts at 0 should it be
    added again; a partition the job knew nothing of is left alone; with the same id nothing is reset."""
    reset = find_reset("t", {0: 20, 1: 10, 2: 0}, "A", {0: (0, 3)}, "B", 1)
    assert sorted(reset.partitions) == [0, 1]
    gone = reset.partitions[1]
    assert (gone.listed, gone.recreated, gone.low, gone.high, gone.known_end) == (False, True, 0, 0, 10)
    assert gone.position_after(10) == 0 and gone.lost(10) is None and gone.lost(4) == (4, 10)
    assert "1: 10 -> not in the topic" in reset.describe()
    assert find_reset("t", {0: 20, 1: 10}, "A", {0: (0, 30)}, "A", 1) is None


def test_a_micro_batch_planned_past_kafkas_end_is_told():
    """A logged micro-batch a restart would replay first: planned on a log cut (or created again) since, its ends
    are past Kafka's end, or in a partition Kafka no longer lists; within the log, nothing is told."""
    from herald.engine.round.resets import past_the_log

    assert past_the_log({0: 110, 1: 50, 2: 7}, {0: (0, 105), 1: (0, 60)}) == [0, 2]
    assert past_the_log({0: 105, 1: 60}, {0: (0, 105), 1: (3, 60)}) == []
