"""Where a subscription stands in each partition, and how a round moves it (pure functions, no Spark).

A subscription's position in a partition is the first offset not yet delivered, discarded or parked
(docs/design.md §5). A round (a micro-batch of the topic's shared query, or a catch-up read) covers, per
partition, the offsets [start, end). After it, each task says how far it read each partition it had and
whether it read all its input, and each subscription's lane says where it must stop (`stops`): at its first
message never attempted, or an ordered subscription's unfinished retry. `advance` turns that into the new
position, never going back and never past what was really read:

- a partition a task read to the end of its input: the round's end, unless the lane stops earlier;
- a partition a task read part of (the deadline came first): after its last row read, or the lane's stop;
- a lane that was cut off part-way did not reach the partitions it has no stop for: they do not move;
- a partition no task reported (it had no rows): the round's end when every task read all its input;
  otherwise unknown, so it does not move (a later round reads it again: never a loss).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from herald.delivery.report import TaskReport

Positions = dict[int, int]
"""partition -> first offset not yet delivered, discarded or parked."""

Ranges = dict[int, tuple[int, int]]
"""partition -> (start, end): the offsets [start, end) a round covers."""


def advance(before: Mapping[int, int], ranges: Mapping[int, tuple[int, int]], tasks: Sequence[TaskReport],
            lane: int) -> Positions:
    """The positions of the subscription delivered as `lane` after a round over `ranges`."""
    all_read = all(task.exhausted for task in tasks)
    after = dict(before)
    for partition, (start, end) in ranges.items():
        reader = next((task for task in tasks if partition in task.progress), None)
        if reader is None:
            reached = end if all_read else None
        else:
            reached = end if reader.exhausted else reader.progress[partition]
            report = reader.lanes.get(lane)
            if report is not None:
                if partition in report.stops:
                    reached = min(reached, report.stops[partition])
                elif report.cut:
                    reached = None
        if reached is not None:
            after[partition] = max(after.get(partition, start), reached)
    return after


def behind(positions: Mapping[int, int], frontier: Mapping[int, int]) -> bool:
    """True when the subscription still has offsets below `frontier` (the shared query's position) to go."""
    return any(positions.get(partition, end) < end for partition, end in frontier.items())


def catch_up_ranges(positions: Mapping[int, int], frontier: Mapping[int, int], max_rows: int) -> Ranges:
    """The next bounded read of a subscription that is behind: from its positions towards `frontier`, at most
    `max_rows` offsets in all, shared over the partitions by lag (every lagging partition moves)."""
    lags = {p: end - positions.get(p, end) for p, end in frontier.items() if positions.get(p, end) < end}
    total = sum(lags.values())
    if total == 0:
        return {}
    ranges: Ranges = {}
    for partition, lag in lags.items():
        start = positions[partition]
        share = lag if total <= max_rows else max(1, max_rows * lag // total)
        ranges[partition] = (start, start + min(lag, share))
    return ranges


def earliest(*positions: Mapping[int, int]) -> Positions:
    """Per partition, the lowest of several subscriptions' positions (where a read serving them all starts)."""
    lowest: Positions = {}
    for one in positions:
        for partition, offset in one.items():
            lowest[partition] = min(offset, lowest.get(partition, offset))
    return lowest


Lost = list[tuple[int, int, int]]
"""(partition, first, end): offsets [first, end) of a partition that Kafka deleted before they were read."""


def unread_ranges(ranges: Mapping[int, tuple[int, int]], tasks: Sequence[TaskReport]) -> Lost:
    """The offsets of the round's ranges that no task read although it read after them: before the first offset
    read of a partition, or the whole range when no task read the partition although every task read all its
    input. Kafka either deleted these records before they were read (retention deletes a log's oldest segments,
    so a read finds its start deleted and begins above it), or holds none there (a transaction marker at the
    start): `lost_ranges` tells which with Kafka's low watermarks, asked after the read."""
    all_read = all(task.exhausted for task in tasks)
    unread: Lost = []
    for partition, (start, end) in sorted(ranges.items()):
        if start >= end:
            continue
        readers = [task for task in tasks if partition in task.firsts]
        if not readers:
            if all_read:
                unread.append((partition, start, end))
            continue
        first = min(task.firsts[partition] for task in readers)
        if first > start:
            unread.append((partition, start, min(first, end)))
    return unread


def holes(ranges: Mapping[int, tuple[int, int]], tasks: Sequence[TaskReport]) -> Lost:
    """The offsets of the round's ranges between two offsets a task read (`TaskReport.gaps`, every one): the
    broker holds no record there by design (transaction markers and aborted records, compaction), except where a
    read fell behind retention and jumped to the log's new start (`lost_ranges`)."""
    found: Lost = []
    for partition, (start, end) in sorted(ranges.items()):
        for task in tasks:
            found.extend((partition, gap_start, gap_end) for gap_start, gap_end in task.gaps.get(partition, ())
                         if gap_start >= start and gap_end <= end)
    return found


def lost_ranges(unread: Lost, low_marks: Mapping[int, int], holes_read_around: Lost = ()) -> Lost:
    """What Kafka deleted before it was read: the part of each `unread` range below its partition's low watermark,
    and each hole (`holes`) that ends at the low watermark: a read that fell behind retention jumps to the log's
    new start, the low watermark, over the records deleted under it. Other holes, below the watermark or not,
    are offsets the broker held no record at (a transaction topic's markers are below it once retention passes
    them): not losses. (A read that jumped to Kafka's start and retention moving again before the round ended is
    not seen; the Kafka source logs it.) Contiguous ranges of a partition are merged."""
    found: Lost = []
    for partition, start, end in unread:
        low = low_marks.get(partition)
        if low is not None and low > start:
            found.append((partition, start, min(end, low)))
    found.extend((partition, start, end) for partition, start, end in holes_read_around
                 if low_marks.get(partition) == end)
    lost: Lost = []
    for partition, start, end in sorted(found):
        if lost and lost[-1][0] == partition and lost[-1][2] >= start:
            lost[-1] = (partition, lost[-1][1], max(end, lost[-1][2]))
        else:
            lost.append((partition, start, end))
    return lost
