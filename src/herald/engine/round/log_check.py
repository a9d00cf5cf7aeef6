"""A topic's log that goes back, as its pipeline sees it (`TopicPipeline`, which this class is a part of): the
topic created again (maybe with fewer partitions) or a partition's log cut. `check_log` finds it from Kafka's
watermarks and topic id and sends the subscriptions concerned to the new log (`_reset`, the rows of
`engine/round/resets.py`); the read's frontier is kept within the new log around micro-batches Spark may have
planned on the old one (`batch_ended`, `settle_frontier`), partitions Kafka stopped listing are kept out of the
read (`listed`), and watermarks read before a micro-batch ended are judged as of the frontier they saw
(`seen`). The design and its known limits: docs/design.md §8, "Offsets that go back".

The state these methods use (the topic's lock, its states, frontier, cuts, unlisted partitions, pending moves,
the retry driver) is the pipeline's, set up in `TopicPipeline.__init__`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace

from herald.delivery.report import Parked
from herald.engine.context import now_ms
from herald.engine.round.positions import behind
from herald.engine.round.resets import PendingReset, TopicReset, find_reset, known_ends, reset_subscription, went_back
from herald.engine.round.result import parked_discard_tables, reset_tables, reset_writer
from herald.engine.round.state import SubscriptionState
from herald.source.kafka_offsets import partition_watermarks
from herald.storage import Slice

log = logging.getLogger(__name__)


class LogChecks:
    """The part of `TopicPipeline` that deals with Kafka offsets that go back (see the module's docstring)."""

    def _below_frontier(self, marks: dict[int, tuple[int, int]], seen: dict[int, int] | None
                        ) -> tuple[dict[int, tuple[int, int]], bool, dict[int, int]]:
        """(Kafka's watermarks to check a joiner with, whether Kafka's log ends below the read's frontier, the
        frontier they are to be compared with: `check_log`'s `seen`). When
        `marks` (read before) end a partition below the frontier, they are read again: `marks` alone cannot tell,
        as a micro-batch may have ended past them since; one never ends past Kafka's end, so watermarks read
        after the frontier that are below it are a log that went back (cut, or the topic created again). When
        Kafka cannot say now: `marks` with their ends raised to the frontier, and False (no cut is taken from
        them: the next micro-batch's ends, or the periodic id check, find one)."""
        frontier = self.frontier_copy()

        def below(found) -> bool:
            return any(partition in frontier and high < frontier[partition] for partition, (_, high) in found.items())

        before = frontier if seen is None else seen  # what `marks` may have seen of the frontier
        if not below(marks):
            return marks, False, before
        try:
            now = self.kafka_marks()
        except Exception as error:  # noqa: BLE001 - see above
            log.info("%s: Kafka's offsets cannot be read again now (%s)", self.kafka_topic, error)
            return {p: (low, max(high, frontier.get(p, high))) for p, (low, high) in marks.items()}, False, before
        return now, below(now), frontier

    def frontier_copy(self) -> dict[int, int]:
        """The read's frontier now (empty: none yet), for `check_log`'s `seen`."""
        with self.lock:
            return dict(self.frontier or {})

    def kafka_marks(self) -> dict[int, tuple[int, int]]:
        """Kafka's (low, high) watermarks of the topic's partitions now."""
        return partition_watermarks(self.context.client_config, [self.kafka_topic])[self.kafka_topic]

    def check_log(self, marks: dict[int, tuple[int, int]], topic_id: str | None,
                  read_at: dict[int, int] | None = None,
                  states: list[SubscriptionState] | None = None,
                  seen: dict[int, int] | None = None) -> dict[int, int] | None:
        """Kafka's log of the topic now: `marks` (partition -> (low, high)) and its id (None: not given). Every
        subscription (of `states`, None: the topic's; all of them, `states` too, when the id is not the one the
        job knows) whose log went back (the topic created again, or a
        partition cut) goes on from the new log, and it is recorded (`_reset`; a subscription a round delivers
        now, once that round is over); the read's frontier, and `read_at` (where a checkpoint left the read),
        are kept within the log. Returns `read_at` so kept. seen: the read's frontier when `marks` were read (a
        copy taken before reading them; None: the frontier now, `marks` read after the last micro-batch ended): a
        micro-batch may end past `marks` after they were read, so the frontier is compared with them as it was
        then (a partition lowered where they are below that, left out where they do not list one it had)."""
        found_ms = now_ms()
        with self.lock:
            if states is not None and topic_id and topic_id != self.topic_id:
                # not the id the job knows (or the first it learns: the others' rows may name another): every
                # subscription of the topic is looked at, not `states` alone
                states = list(self.states.values()) + [s for s in states if s.id not in self.states]
            states = list(self.states.values()) if states is None else states
            then = (self.frontier or {}) if seen is None else seen

            now = self.frontier or {}

            def known(state: SubscriptionState, offsets: dict[int, int]) -> dict[int, int]:
                """What `offsets` (a position, an end seen) of `state` say of the log as `marks` saw it: a
                micro-batch that ended since they were read (`seen`) may have moved those of the read's
                subscriptions past `marks`, in the same log, up to its end (the frontier now): those are taken
                as of `seen`. A joiner's, or one past the frontier (joined at Kafka's end, moved), no
                micro-batch moved: as they are."""
                if seen is None or state.id not in self.states:
                    return offsets
                return {p: min(offset, then[p]) if p in then and offset <= now.get(p, -1) else offset
                        for p, offset in offsets.items()}
            # what the job knows of the log, for the subscriptions whose id says nothing
            unsure = [s for s in states if not ((s.topic_id or self.topic_id) and topic_id)]
            shared = known_ends(then, read_at, *[known(s, s.positions) for s in unsure],
                                *[known(s, s.topic_end) for s in unsure])
            found = {state.id: self._reset_of(state, marks, topic_id, shared, found_ms, known) for state in states}
            resets = [reset for reset in found.values() if reset is not None]
            if resets:
                log.warning("%s; %d subscription(s) go on from the new offsets; what they had not read of the old "
                            "ones is recorded LOST", resets[0].describe(), len(resets))
            if self.topic_id is None and any(
                    (reset := found.get(state.id)) is not None and reset.was_id and reset.was_id != topic_id
                    for state in states if state.id in self.states):
                # the first id the job learns says the log the read was in with its subscriptions is an old one:
                # a micro-batch in flight read it (`batch_ended`)
                for partition in self.frontier or {}:
                    self.cuts[partition] = self.cuts.get(partition, 0) + 1
            if marks:  # a partition Kafka does not list is not in the topic (any more): out of the frontier
                for partition, end in {**(read_at or {}), **then, **(self.frontier or {})}.items():
                    if partition not in marks and (partition in then or partition in (read_at or {})):
                        self.unlisted[partition] = end
            if self.frontier is not None:
                within = {}
                for partition, end in self.frontier.items():
                    if partition in marks:
                        high = marks[partition][1]
                        within[partition] = min(end, high) if high < then.get(partition, end) else end
                    elif partition not in self.unlisted:  # new since `marks` were read
                        within[partition] = end
                    if within.get(partition, -1) < end:  # a micro-batch in flight read the old log there
                        self.cuts[partition] = self.cuts.get(partition, 0) + 1
                self.frontier = within
            for state in states:
                reset = found.get(state.id)
                if reset is None:
                    state.topic_id = topic_id or state.topic_id
                    continue
                pending = PendingReset(reset, dict(state.positions))
                if state.busy:  # its round ends first (`apply`); a newer reset takes the place of one waiting
                    state.topic_id = state.topic_id or self.topic_id  # its positions are in the old log until then
                    state.pending_moves = [m for m in state.pending_moves if not isinstance(m, PendingReset)]
                    state.pending_moves.append(pending)
                else:
                    self._reset(state, pending)
            self.topic_id = topic_id or self.topic_id
        self.flush_moves()
        return None if read_at is None else {p: min(o, marks[p][1]) for p, o in read_at.items() if p in marks}

    def listed(self, ranges: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """A micro-batch's `ranges` of the topic without the partitions Kafka stopped listing (`check_log`): a
        source that keeps one (Herald's Python source) gives it empty ranges at the end it had, and a batch Spark
        planned before the topic was created again may hold a range of its old log. Those are left out (the end
        they reach remembered), and any other range of such a partition is taken only once Kafka lists it again
        (added again: its new log, read from its start); Kafka is asked then, outside the lock."""
        with self.lock:
            if not self.unlisted:
                return ranges
            doubtful = [p for p, (start, end) in ranges.items()
                        if p in self.unlisted and not start == end == self.unlisted[p]]
        listed_now: set[int] = set()
        answered = True
        if doubtful:
            try:
                listed_now = set(self.kafka_marks())
            except Exception as error:  # noqa: BLE001 - left out this time: asked again at its next range
                answered = False
                log.info("%s: whether Kafka lists partition(s) %s again cannot be told now (%s)", self.kafka_topic,
                         doubtful, error)
        with self.lock:
            kept = {}
            for partition, (start, end) in ranges.items():
                if partition in self.unlisted and partition not in listed_now:
                    if answered and start >= self.unlisted[partition]:  # the old log's: its next ranges go on from
                        self.unlisted[partition] = end  # there (one that went back, a new log Kafka's answer may
                    continue  # not show yet, and one Kafka was not asked about, are asked about again)
                self.unlisted.pop(partition, None)
                kept[partition] = (start, end)
            return kept

    def went_back(self, ends: dict[int, int]) -> bool:
        """True when a micro-batch ends a partition below the read's frontier: Kafka's offsets went back, and
        the caller asks Kafka about the topic (`check_log`)."""
        with self.lock:
            return self.frontier is not None and bool(went_back(ends, self.frontier))

    def _reset_of(self, state: SubscriptionState, marks, topic_id: str | None, shared: dict[int, int],
                  found_ms: int, known: Callable) -> TopicReset | None:
        """(lock held) The reset of one subscription's log, if any: by topic id when the id its positions are in
        (or, when its rows named none, the topic's as the job knew it) and the one Kafka gives now are known, else
        by Kafka's end offsets against all the job knows of the log (`shared`). `known`: its offsets as `marks`
        can judge them (`check_log`): they tell whether there is a reset; how far the old log went (what it
        lost) is all it knows."""
        known_id = state.topic_id or self.topic_id
        judged = known_ends(known(state, state.positions), known(state, state.topic_end))
        ends = known_ends(state.positions, state.topic_end)
        if not (known_id and topic_id):
            judged, ends, known_id, topic_id = known_ends(shared, judged), known_ends(shared, ends), None, None
        reset = find_reset(self.kafka_topic, judged, known_id, marks, topic_id, found_ms)
        if reset is None or judged == ends:
            return reset
        full = find_reset(self.kafka_topic, ends, known_id, marks, topic_id, found_ms)
        return replace(reset, partitions={p: full.partitions[p] for p in reset.partitions})

    def _reset(self, state: SubscriptionState, pending: PendingReset) -> None:
        """(lock held) One subscription goes on from the new log. What it had not read of the old log is lost
        from where it was when the reset was found (`pending.positions`). Its parked messages in the old log are
        taken out of the retry driver now, under this lock, before any round can read the new log for it: their
        DISCARDED rows and the reset's rows are one slice, stamped then, so a new message parked at one of their
        offsets later is always newer. The slice is written by `flush_moves`."""
        reset = pending.reset
        outcome = reset_subscription(reset, state.positions, state.carried, lost_from=pending.positions)
        ended, stamp = self.retries.end_old_log(
            self.kafka_topic, {p: part.first_gone for p, part in reset.partitions.items()},
            f"Kafka topic {self.kafka_topic}: {reset.describe()}; the offset of this parked message belongs to a "
            "message of the new log now", state.subscription)
        state.positions.update(outcome.positions)
        state.carried = {key: value for key, value in state.carried.items() if key not in outcome.dropped}
        state.topic_end = dict(state.topic_end)  # it may be the frontier itself (`set_frontier`): not changed here
        for partition, part in reset.partitions.items():
            if partition in state.topic_end:
                state.topic_end[partition] = min(state.topic_end[partition], part.high)
        state.idle = None
        state.topic_id = reset.topic_id or state.topic_id
        state.rows_topic_id = None  # its rows name the id for the partitions reset only: the next round's, for all
        state.catching_up = self.frontier is not None and behind(state.positions, self.frontier)
        tables = reset_tables(state.subscription, reset, outcome, stamp, self.context.cluster, pending.positions,
                              ended)
        self._moved.append((Slice(reset_writer(state.id), reset.found_ms), lambda _: tables, True, True,
                            frozenset()))
        # rounds applied and not parked yet (the one this reset waited for, or one that ended just before) park
        # what they read of the old log after this: those messages, exactly, end once those rounds have parked
        rounds = self._unparked.get(state.id, {})
        firsts = {p: part.first_gone for p, part in reset.partitions.items()}
        late = [item for items in rounds.values() for item in items
                if item.record.offset >= firsts.get(item.record.partition, math.inf)]
        if late:
            subscription = state.subscription
            reason = (f"Kafka topic {self.kafka_topic}: {reset.describe()}; the offset of this parked message belongs "
                      "to a message of the new log now")
            ended: list[Parked] = []  # filled by `park` as their rounds hand them over: they are never parked
            for item in late:
                self._claimed[id(item)] = ended

            def parked_since(_):
                outcome, late_stamp = self.retries.ended_by_reset(subscription, self.kafka_topic, ended, reason)
                return [] if outcome is None else parked_discard_tables(
                    subscription, outcome, late_stamp, self.context.cluster, f"reset-parked:{subscription.id}",
                    reset.found_ms)
            self._moved.append((Slice(f"reset-parked:{subscription.id}", reset.found_ms), parked_since, True, True,
                                frozenset(rounds)))
        log.info("%s: %s goes on from %s (was at %s)%s", state.id, self.kafka_topic, outcome.positions,
                 {p: pending.positions.get(p) for p in outcome.positions},
                 "; lost " + ", ".join(f"{p}: {a}..{b - 1}" for p, a, b in outcome.lost) if outcome.lost else "")

    def batch_ended(self, ranges: dict[int, tuple[int, int]], batch_id: int | None = None) -> None:
        """(lock held) A micro-batch of the read ended at the end of `ranges`: the frontier moves there, but where
        Kafka's log went back since the read's last micro-batch ended (the topic's id changed: every partition;
        else the partitions `check_log` lowered the frontier of), as Spark may have planned this one before: its
        ends may be in the old log, and the frontier stays where `check_log` put it, within the new one (a
        partition `check_log` left out stays out, its end in the old log remembered: `listed`)."""
        topic_id, cuts = self._log_at_last_batch
        recreated = topic_id is not None and self.topic_id != topic_id
        old_log = {p for p in ranges if recreated or self.cuts.get(p, 0) != cuts.get(p, 0)}
        if old_log:
            log.info("%s batch %s: the topic's log went back since the read's last micro-batch; the read's frontier "
                     "stays in the new log for partition(s) %s", self.kafka_topic, batch_id, sorted(old_log))
        frontier = self.frontier or {}
        for partition in old_log & set(self.unlisted):
            self.unlisted[partition] = ranges[partition][1]
        self.set_frontier({p: (start, frontier[p] if p in old_log else end) for p, (start, end) in ranges.items()
                           if p not in old_log or p in frontier})
        self._log_at_last_batch = (self.topic_id, dict(self.cuts))
        self._held = {p: ranges[p][1] for p in old_log if p not in self.unlisted}
        self._batches_ended += 1

    def settle_frontier(self) -> None:
        """After a micro-batch whose ends `batch_ended` held (outside the lock): Kafka's end offsets read now,
        after the reset, bound how far the read is in the new log. The read goes on from the batch's end in
        whichever log Kafka has (or, past that log's end, from its end), so the frontier of a held partition moves
        to the lower of the two: the subscriptions sent to the new log's start catch up on all the read will not
        give them, without waiting for the topic's next micro-batch (none comes while it is quiet), and never
        past what Kafka holds. Nothing when the log went back again meanwhile, another micro-batch ended, or Kafka
        cannot say now (the next micro-batch moves the frontier)."""
        with self.lock:
            held, ended, log_at = dict(self._held), self._batches_ended, self._log_at_last_batch
        if not held:
            return
        try:
            marks = self.kafka_marks()
        except Exception as error:  # noqa: BLE001 - see above
            log.info("%s: Kafka's offsets cannot be read now (%s); the frontier moves with the next micro-batch",
                     self.kafka_topic, error)
            return
        with self.lock:
            if ended != self._batches_ended or (self.topic_id, self.cuts) != log_at or self.frontier is None:
                return
            frontier = dict(self.frontier)
            for partition, end in held.items():
                if partition in marks:
                    frontier[partition] = max(frontier.get(partition, 0), min(end, marks[partition][1]))
            self._held = {}
            self.set_frontier({p: (end, end) for p, end in frontier.items()})
            self._log_at_last_batch = (self.topic_id, dict(self.cuts))
        if self.catchup is not None:
            self.catchup.wake()
