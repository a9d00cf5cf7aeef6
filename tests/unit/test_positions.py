"""How a round moves a subscription's positions, and how catch-up reads are bounded (pure, no Spark)."""

from __future__ import annotations

import numpy as np
import pytest

from herald.delivery.report import LaneReport, TaskReport
from herald.engine.round.planner import split_inflight
from herald.engine.round.positions import advance, behind, catch_up_ranges, earliest


def task(progress: dict[int, int], exhausted: bool = True, **lanes: LaneReport) -> TaskReport:
    return TaskReport(task="t", progress=progress, exhausted=exhausted,
                      lanes={int(name[1:]): lane for name, lane in lanes.items()})


RANGES = {0: (10, 20), 1: (5, 9), 2: (7, 7)}


def test_a_round_read_to_its_end_moves_every_partition_to_the_end():
    reports = [task({0: 18}, l0=LaneReport()), task({1: 9}, l0=LaneReport())]  # 18: the last rows were gaps
    assert advance({0: 10, 1: 5, 2: 7}, RANGES, reports, 0) == {0: 20, 1: 9, 2: 7}


def test_a_lane_stop_holds_the_position_at_its_first_unfinished_message():
    reports = [task({0: 20, 1: 9}, l0=LaneReport(stops={0: 14}))]
    assert advance({0: 10, 1: 5}, RANGES, reports, 0) == {0: 14, 1: 9, 2: 7}


def test_a_task_stopped_by_the_deadline_moves_only_as_far_as_it_read():
    reports = [task({0: 16}, exhausted=False, l0=LaneReport()), task({1: 9}, l0=LaneReport())]
    # partition 2 had no rows and a task did not read all its input: it might have been that task's: it stays
    assert advance({0: 10, 1: 5, 2: 7}, RANGES, reports, 0) == {0: 16, 1: 9, 2: 7}
    assert advance({0: 10, 1: 5, 2: 3}, {**RANGES, 2: (3, 7)}, reports, 0)[2] == 3


def test_a_cut_lane_does_not_move_in_partitions_it_never_reached():
    reports = [task({0: 20, 1: 9}, l0=LaneReport(stops={0: 12}, cut=True))]
    assert advance({0: 10, 1: 5}, RANGES, reports, 0) == {0: 12, 1: 5, 2: 7}


def test_positions_never_go_back_and_a_subscription_ahead_stays_ahead():
    reports = [task({0: 20, 1: 9}, l0=LaneReport(stops={0: 12}))]
    assert advance({0: 15, 1: 30}, RANGES, reports, 0) == {0: 15, 1: 30, 2: 7}


def test_behind_and_earliest():
    assert behind({0: 5, 1: 9}, {0: 5, 1: 10})
    assert not behind({0: 5, 1: 12}, {0: 5, 1: 10})
    assert earliest({0: 5, 1: 9}, {0: 3, 1: 12}) == {0: 3, 1: 9}


def test_catch_up_reads_are_bounded_and_shared_by_lag():
    assert catch_up_ranges({0: 0, 1: 90}, {0: 100, 1: 100}, 1000) == {0: (0, 100), 1: (90, 100)}
    bounded = catch_up_ranges({0: 0, 1: 900}, {0: 1000, 1: 1000}, 110)
    assert bounded == {0: (0, 100), 1: (900, 910)}
    assert sum(end - start for start, end in bounded.values()) <= 110
    assert catch_up_ranges({0: 100}, {0: 100}, 10) == {}


def test_parked_messages_get_at_most_half_the_inflight_and_the_reading_path_never_none():
    assert split_inflight(100, 0) == (100, 0)
    assert split_inflight(100, 3) == (97, 3)
    assert split_inflight(100, 500) == (50, 50)
    assert split_inflight(2, 9) == (1, 1)
    assert split_inflight(1, 0) == (1, 0)


def test_catch_up_waits_only_while_every_partition_behind_is_held_by_something_not_due():
    from herald.config import Subscription
    from herald.delivery.message import RetryState
    from herald.engine.round.state import SubscriptionState
    from herald.engine.triggers.catchup import _waiting_for_retry

    now = 1_000_000
    batch = Subscription(topicName="g.t", name="b", endpoint="http://127.0.0.1:9/", deliveryType="BATCH",
                         subscriptionPolicy={"batchSize": 10})
    open_batch = RetryState(attempts=0, first_read_ms=now - 500, due_ms=now + 2500)
    state = SubscriptionState(batch, positions={0: 100, 1: 50}, carried={(0, 100): open_batch})
    assert _waiting_for_retry(state, now, {0: 105, 1: 50}), "its open batch waits for its time or more records"
    assert not _waiting_for_retry(state, now, {0: 110, 1: 50}), "enough new records may fill it"
    assert not _waiting_for_retry(state, now + 2500, {0: 105, 1: 50}), "its time is up"
    assert not _waiting_for_retry(state, now, {0: 105, 1: 53}), "partition 1 has new records and nothing held"
    retrying = RetryState(attempts=2, first_read_ms=now - 500, due_ms=now + 2500, batch_last_offset=109)
    state.carried = {(0, 100): retrying}
    assert _waiting_for_retry(state, now, {0: 500, 1: 50}), "a batch in retry waits for its due time"
    serial = Subscription(topicName="g.t", name="s", endpoint="http://127.0.0.1:9/",
                          subscriptionPolicy={"inflightSize": 5})
    unordered = SubscriptionState(serial, positions={0: 100}, carried={(0, 100): retrying})
    assert not _waiting_for_retry(unordered, now, {0: 500}), "only ordered subscriptions are held"


def test_once_stops_for_an_ordered_subscription_only_when_every_partition_behind_is_held_by_a_retried_message():
    from herald.config import Subscription
    from herald.delivery.message import RetryState
    from herald.engine.context import now_ms
    from herald.engine.once import held
    from herald.engine.round.state import SubscriptionState

    now = now_ms()
    batch = Subscription(topicName="g.t", name="b", endpoint="http://127.0.0.1:9/", deliveryType="BATCH",
                         subscriptionPolicy={"batchSize": 10})
    retried_long = RetryState(attempts=3, first_read_ms=now - 20_000, due_ms=now + 5_000, batch_last_offset=109)
    state = SubscriptionState(batch, positions={0: 100, 1: 50}, carried={(0, 100): retried_long})
    assert held(state, {0: 200, 1: 50}, patience_s=10), "its only partition behind keeps failing"
    assert not held(state, {0: 200, 1: 60}, patience_s=10), "partition 1 is behind with nothing in its way"
    assert not held(state, {0: 200, 1: 50}, patience_s=30), "not retried for long enough yet"
    never_sent = RetryState(attempts=0, first_read_ms=now - 20_000, due_ms=now, batch_last_offset=109)
    state.carried = {(0, 100): never_sent}
    assert not held(state, {0: 200, 1: 50}, patience_s=10), "a batch closed but not attempted yet holds nothing"
    serial = Subscription(topicName="g.t", name="s", endpoint="http://127.0.0.1:9/")
    unordered = SubscriptionState(serial, positions={0: 100}, carried={(0, 100): retried_long})
    assert not held(unordered, {0: 200}, patience_s=10), "an unordered subscription parks instead"


def test_a_partition_added_to_the_topic_is_read_from_its_start_and_never_skipped(tmp_path):
    """The query's checkpoint logs batch 1 with a partition batch 0 did not have: its range starts at 0, and a
    subscription stopped part-way through it (the deadline) keeps its place there instead of jumping to the end."""
    import json

    from herald.engine.triggers.checkpoint import batch_ranges

    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for batch_id, ends in {0: {"0": 5}, 1: {"0": 8, "1": 30}}.items():
        (offsets / str(batch_id)).write_text("v1\n{}\n" + json.dumps({"t": ends}) + "\n")
    ranges = batch_ranges(None, str(tmp_path), 1, "t", None)
    assert ranges == {0: (5, 8), 1: (0, 30)}
    reports = [task({0: 8, 1: 12}, exhausted=False, l0=LaneReport(stops={1: 12}))]
    assert advance({0: 5, 1: 0}, ranges, reports, 0) == {0: 8, 1: 12}


def test_a_range_read_from_above_its_start_or_with_a_hole_is_lost_only_below_kafkas_low_watermark():
    from herald.engine.round.positions import holes, lost_ranges, unread_ranges

    ranges = {0: (5, 15), 1: (0, 4), 2: (3, 9), 3: (2, 2), 4: (0, 20)}
    reports = [TaskReport("t1", progress={0: 15}, firsts={0: 10}),
               TaskReport("t2", progress={2: 9, 4: 20}, firsts={2: 3, 4: 0}, gaps={2: [(5, 6)], 4: [(3, 12)]})]
    unread, read_around = unread_ranges(ranges, reports), holes(ranges, reports)
    assert unread == [(0, 5, 10), (1, 0, 4)], "partition 1: rows to read and none read"
    assert read_around == [(2, 5, 6), (4, 3, 12)]
    # below the low watermark: deleted (a read that jumped over a deletion to Kafka's start, partition 4, too);
    # above it: offsets Kafka holds no record at (transaction markers, compaction)
    assert lost_ranges(unread, {0: 8, 1: 4, 2: 0, 4: 12}, read_around) == [(0, 5, 8), (1, 0, 4), (4, 3, 12)]
    assert lost_ranges(unread, {0: 5, 1: 0, 4: 3}, read_around) == []
    assert lost_ranges([(0, 0, 4), (0, 4, 9)], {0: 9}) == [(0, 0, 9)], "adjacent ranges are one"
    cut_short = [TaskReport("t1", progress={0: 12}, exhausted=False, firsts={0: 5})]
    assert unread_ranges(ranges, cut_short) == [], "a partition no task reached while one was cut is not known"


def test_a_transactional_topics_holes_are_not_losses_and_a_retention_jump_after_many_of_them_is():
    """A transactional topic: a marker after each record leaves a hole at every other offset (100 of them here,
    more than a task used to report). Retention has since passed them all: they are offsets Kafka held no record
    at, not losses. A read that fell behind retention after them and jumped to the log's start (the low
    watermark, 250) lost what it jumped over: reported, recorded."""
    from herald.delivery.sender import _gaps
    from herald.engine.round.positions import holes, lost_ranges, unread_ranges

    read = list(range(0, 200, 2)) + list(range(250, 260))
    report = TaskReport("t", progress={0: 260}, firsts={0: 0}, gaps={0: _gaps(np.array(read))})
    assert len(report.gaps[0]) == 100, "every hole, not the first 64"
    ranges = {0: (0, 260)}
    lost = lost_ranges(unread_ranges(ranges, [report]), {0: 250}, holes(ranges, [report]))
    assert lost == [(0, 199, 250)]


def test_the_last_logged_batch_is_the_last_one_that_may_replay_and_a_checkpoint_left_behind_is_an_error(
        tmp_path, monkeypatch):
    """Spark logs a micro-batch in `offsets/` before it runs it: the highest id there when a query starts is the
    last batch that may have run before (`SharedRead.may_replay`). A stale checkpoint that could not be deleted
    must stop the read from starting on it, as its query id and batch ids would be reused."""
    import shutil

    from herald.engine.triggers import checkpoint

    root = tmp_path / "cp"
    assert checkpoint.last_logged(None, str(root)) is None
    (root / "offsets").mkdir(parents=True)
    for name in ("0", "1", "7", ".7.crc", "3.tmp"):
        (root / "offsets" / name).write_text("v1\n")
    assert checkpoint.last_logged(None, str(root)) == 7
    monkeypatch.setattr(shutil, "rmtree", lambda path, ignore_errors=False: None)  # a delete that did nothing
    checkpoint.remove(None, str(root))  # best effort: stale checkpoints of other reads
    with pytest.raises(RuntimeError, match="could not delete the stale checkpoint"):
        checkpoint.remove(None, str(root), must=True)
    monkeypatch.undo()
    checkpoint.remove(None, str(root), must=True)
    assert not root.exists()
