"""Kafka offsets that go back: a topic deleted and created again, or a partition's log truncated (pure, no Spark).

A subscription's position is an offset in one log of a partition. When the topic is deleted and created again,
its partitions start a new log, whose offsets begin again at 0: a position of the old log means nothing there,
and read as one it would skip every new message below it. An unclean leader election can also cut the end of a
partition's log: the offsets past the cut are given to new messages. Neither is a retention gap (offsets that
vanish below the log's start, recorded as LOST by the rounds that read around them).

The job knows how far each partition's log went (`known_end`: the highest of the read's frontier, the
subscriptions' positions and the ends they saw). A reset is found when Kafka's end offset of a partition is now
below that, or when the topic's id changed (Kafka gives every topic a UUID; a topic created again gets a new
one). Then every subscription of the topic goes on from where the new log starts (`low`), or, when the id is
known and unchanged (the log was cut, not replaced), from the cut (`high`) if it was past it; what it had not yet
read of the old log is gone and recorded as LOST (`lost`); its carried states there are released; and its
parked messages there end as DISCARDED (their bodies are kept in the undelivered table): their offsets are
given to the new log's messages, which would otherwise take their place. See docs/design.md §8.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionReset:
    """One partition whose log went back. Offsets are Kafka offsets; `known_end` is exclusive (the offset after
    the last one the job knew of), `low` and `high` are the partition's first and next offsets now."""

    partition: int
    known_end: int
    low: int
    high: int
    recreated: bool  # a new log: everything starts over at `low`; False: the old log cut at `high`
    listed: bool = True  # False: the topic created again has no such partition (yet): added, it starts at 0

    @property
    def first_gone(self) -> int:
        """The first offset of the old log that is no longer there: all of a new log's, the cut log's from `high`."""
        return self.low if self.recreated else self.high

    def position_after(self, position: int) -> int:
        """Where a subscription at `position` in the old log goes on."""
        return self.low if self.recreated else min(position, self.high)

    def lost(self, position: int) -> tuple[int, int] | None:
        """[first, end) of the old log that a subscription at `position` never read and cannot any more: from its
        position (or the cut) to `known_end`; None when it had read all of it the job knew of."""
        first = position if self.recreated else max(position, self.high)
        return (first, self.known_end) if first < self.known_end else None


@dataclass(frozen=True)
class TopicReset:
    """The partitions of `kafka_topic` whose log went back, found at `found_ms` (epoch ms).

    topic_id: the topic's id now (None: the broker gives none); was_id: the id the job knew (None: unknown)."""

    kafka_topic: str
    partitions: dict[int, PartitionReset]
    topic_id: str | None
    was_id: str | None
    found_ms: int

    def describe(self) -> str:
        """The reset as a log line names it."""
        what = (f"was created again (topic id {self.was_id} -> {self.topic_id})"
                if self.was_id and self.topic_id and self.was_id != self.topic_id
                else "went back (deleted and created again, or its log cut)")
        parts = ", ".join(f"{p.partition}: {p.known_end} -> {p.low}..{p.high}" if p.listed
                          else f"{p.partition}: {p.known_end} -> not in the topic" for p in self.partitions.values())
        return f"Kafka topic {self.kafka_topic} {what}; partition: known end -> offsets now: {parts}"


def find_reset(kafka_topic: str, known_ends: Mapping[int, int], known_id: str | None,
               marks: Mapping[int, tuple[int, int]], topic_id: str | None, found_ms: int) -> TopicReset | None:
    """The reset of `kafka_topic`, or None.

    known_ends: partition -> how far the job knew the partition's log went (exclusive); known_id: the topic id
    the job knew; marks: partition -> (low, high) now; topic_id: the topic's id now. A changed id resets every
    partition (a new topic); with no id to compare, a partition resets when its end is below what the job knew
    (taken as a new log: the subscriptions start over at its start, so nothing new is skipped); with the same
    id, such a partition was cut (it goes on from the cut). A topic created again with fewer partitions: a
    partition the job knew and the new topic does not have resets too, to offset 0, where its log starts should
    it be added again (without ids, that is not seen: a known limit, docs/design.md §8)."""
    recreated_topic = bool(known_id and topic_id and known_id != topic_id)
    same_log = bool(known_id and topic_id and known_id == topic_id)
    partitions = {}
    for partition, (low, high) in marks.items():
        known_end = known_ends.get(partition, 0)
        if recreated_topic or high < known_end:
            partitions[partition] = PartitionReset(partition, known_end, low, high, recreated=not same_log)
    if recreated_topic:
        for partition, known_end in known_ends.items():
            if partition not in marks and known_end > 0:
                partitions[partition] = PartitionReset(partition, known_end, 0, 0, recreated=True, listed=False)
    if not partitions:
        return None
    return TopicReset(kafka_topic, dict(sorted(partitions.items())), topic_id, known_id, found_ms)


def known_ends(*offsets: Mapping[int, int] | None) -> dict[int, int]:
    """Per partition, the highest of several maps of offsets (positions, frontiers, ends): how far the job
    knows each partition's log went."""
    ends: dict[int, int] = {}
    for one in offsets:
        for partition, offset in (one or {}).items():
            ends[partition] = max(offset, ends.get(partition, offset))
    return ends


def past_the_log(ends: Mapping[int, int], marks: Mapping[int, tuple[int, int]]) -> list[int]:
    """The partitions whose end offset in a micro-batch Spark planned (`ends`) is past Kafka's end now (`marks`:
    partition -> (low, high)), or that Kafka does not list: the batch was planned on a log that went back."""
    return sorted(p for p, end in ends.items() if p not in marks or end > marks[p][1])


def went_back(ends: Mapping[int, int], known: Mapping[int, int]) -> list[int]:
    """The partitions whose end offset in a micro-batch (`ends`) is below how far the job knew their log went:
    worth asking Kafka whether the topic was reset."""
    return sorted(p for p, end in ends.items() if end < known.get(p, 0))


@dataclass(frozen=True)
class SubscriptionReset:
    """What a reset does to one subscription: its positions after, the old log's ranges it lost (partition,
    first, end), and the carried states it drops ((partition, offset))."""

    positions: dict[int, int]
    lost: list[tuple[int, int, int]]
    dropped: set[tuple[int, int]]


@dataclass(frozen=True)
class PendingReset:
    """A reset found while a round delivered the subscription: applied when that round is over, its lost ranges
    counted from `positions`, where the subscription was when the reset was found (the round may have moved it
    on through offsets of the new log as if they were the old one's)."""

    reset: TopicReset
    positions: dict[int, int]


def reset_subscription(reset: TopicReset, positions: Mapping[int, int], carried: Iterable[tuple[int, int]],
                       lost_from: Mapping[int, int] | None = None) -> SubscriptionReset:
    """The reset of a subscription at `positions` carrying states at `carried` ((partition, offset) keys); what
    it lost of the old log counts from `lost_from` (default: `positions`)."""
    after, lost = {}, []
    for partition, part in reset.partitions.items():
        position = positions.get(partition, part.low)
        after[partition] = part.position_after(position)
        gone = part.lost((lost_from or positions).get(partition, position))
        if gone is not None:
            lost.append((partition, *gone))
    dropped = {key for key in carried if key[0] in reset.partitions and key[1] >= reset.partitions[key[0]].first_gone}
    return SubscriptionReset(after, lost, dropped)
