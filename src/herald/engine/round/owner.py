"""The one owner of a round's steps: every kind of round runs them in this order, with these failure rules.

Three things start rounds (docs/design.md §3): a micro-batch of a topic's shared read (`pipeline.BatchRound`), a
catch-up read of subscriptions behind it (`herald.engine.triggers.catchup`) and a batch of parked retries
(`herald.engine.triggers.retry_driver`). Each supplies a `RoundSource`, only what differs; `Round` runs:

1. `choose`: the participants (the source takes its own lock; None: no round at all);
2. `prepare`: what must be ready before the delivery (a micro-batch's `TaskPlan`, before the shared Spark job);
3. `deliver`: each participant's `SubscriptionOutcome`;
4. whether 3 returned or raised: `take` its outcomes (none when it raised) into the states, under the source's
   lock, which also stamps the round's rows (epoch ms) before its subscriptions are free; and the pins given back
   with what the round saw of them (`steps.release_pins`: a pin that cannot be given back is logged and never
   keeps the round from being recorded). Given back after `take`, or before it for a source that says
   `pins_back_first`;
5. only when 3 returned: `steps.record` the source's `result`, then `parking_ended`, recorded or not;
6. `after`: what follows a recorded round (moves written, catch-up woken, the round logged).

A round that raises at 2 or 3 is taken with no outcomes, its participants freed, and the error raised: nothing of
it is recorded and its messages are delivered again. Should taking its outcomes raise (at 4), its participants are
freed too, and the job writes nothing more and stops (`EngineContext.unrecorded`), as when recording fails. A
micro-batch runs the two halves apart (`begin`, then `finish` once the Spark job it shares with other topics'
rounds has reported, or `abandon` when that job failed); the other rounds `run` both at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from herald.engine.context import EngineContext
from herald.engine.round import steps
from herald.engine.round.fanout import Participant
from herald.engine.round.result import RoundResult, SubscriptionOutcome


class RoundSource:
    """What one kind of round supplies to `Round`. `park`: where a recorded round's parked messages go (None: the
    source keeps them itself, in `take`); `possible_replay`: the round may replay an earlier run's
    (`steps.record`); `pins_back_first`: the pins are given back before `take`, which then sees the pins as the
    round's own news left them (a retry round: docs/design.md §6)."""

    park: Callable | None = None
    possible_replay: bool = False
    pins_back_first: bool = False

    def choose(self) -> list[Participant] | None:
        """The round's participants, chosen and marked busy under the source's lock, their pins leased; None when
        there is no round (an empty list is a round that takes nobody's messages)."""
        raise NotImplementedError

    def prepare(self, participants: list[Participant]) -> None:
        """What must be ready before `deliver` is called (by then, possibly by another thread's Spark job)."""

    def deliver(self, participants: list[Participant]) -> list[SubscriptionOutcome]:
        """Deliver the round; what it did for each participant."""
        raise NotImplementedError

    def take(self, participants: list[Participant], results: list[SubscriptionOutcome]) -> int:
        """Take `results` (empty: the round failed) into the states under the source's lock and free the
        participants; the stamp (epoch ms) of the round's rows, taken under that lock before they are free."""
        raise NotImplementedError

    def drop(self, participants: list[Participant]) -> None:
        """Free the participants of a round given up before it delivered (`Round.abandon`), taking nothing."""
        raise NotImplementedError

    def result(self, results: list[SubscriptionOutcome]) -> RoundResult:
        """The round to record, once taken."""
        raise NotImplementedError

    def parking_ended(self, results: list[SubscriptionOutcome]) -> None:
        """The round has handed its parked messages over, or never will (it was not recorded)."""

    def after(self, results: list[SubscriptionOutcome], started: float) -> None:
        """What follows the recorded round. started: when it began (monotonic s)."""


class TopicRound(RoundSource):
    """A round of the subscriptions of one topic's `pipeline` (`herald.engine.round.pipeline.TopicPipeline`): a
    micro-batch's (`batch.BatchRound`) or a catch-up read's. Its outcomes are taken under the topic's lock
    (`TopicPipeline.apply`), and its parked messages handed over by `TopicPipeline.park`."""

    def __init__(self, pipeline) -> None:
        self.pipeline = pipeline
        self.park = pipeline.park

    def parking_ended(self, results: list[SubscriptionOutcome]) -> None:
        self.pipeline.parking_ended(results)


class Round:
    """One round of `source`, its steps run once, in order (module docstring)."""

    def __init__(self, context: EngineContext, source: RoundSource) -> None:
        self.context = context
        self.source = source
        self.participants: list[Participant] = []
        self.started = 0.0  # monotonic s: when `begin` was called

    def run(self) -> RoundResult | None:
        """The whole round; what was recorded, or None when there was no round."""
        return self.finish() if self.begin() else None

    def begin(self) -> bool:
        """Choose the participants and prepare their delivery; False when there is no round. When preparing
        raises, the round ends with no outcomes and this raises."""
        self.started = time.monotonic()
        participants = self.source.choose()
        if participants is None:
            return False
        self.participants = participants
        try:
            self.source.prepare(participants)
        except BaseException:  # no round: they are free again
            self._end([])
            raise
        return True

    def finish(self) -> RoundResult:
        """Deliver, take the outcomes and give the pins back, record, then what follows. When the delivery
        raises, the participants are freed with no outcome, nothing is recorded, and this raises."""
        source = self.source
        results: list[SubscriptionOutcome] = []
        try:
            try:
                results = source.deliver(self.participants)
            finally:
                stamp = self._end(results)
            result = source.result(results)
            steps.record(self.context, result, time.monotonic() - self.started, stamp,
                         possible_replay=source.possible_replay, park=source.park)
        finally:  # recorded or not, and however far `take` went: nothing waits for this round's parked messages
            source.parking_ended(results)
        source.after(results, self.started)
        return result

    def abandon(self) -> None:
        """The round is given up after `begin` (its delivery is done again another way): its participants are
        freed at the positions they had and their pins given back; nothing is taken or recorded."""
        try:
            self.source.drop(self.participants)
        finally:
            steps.release_pins(self.context, self.participants, ())

    def _end(self, results: list[SubscriptionOutcome]) -> int:
        """Take `results` and give the pins back (in the source's order); the stamp of the round's rows."""
        if self.source.pins_back_first:
            steps.release_pins(self.context, self.participants, results)
            return self._take(results)
        try:
            return self._take(results)
        finally:
            steps.release_pins(self.context, self.participants, results)

    def _take(self, results: list[SubscriptionOutcome]) -> int:
        """`take`; should it raise, no participant stays busy, and when it was taking outcomes (some positions
        may have moved past messages the round has no row for) the job writes nothing more and stops
        (`EngineContext.unrecorded`): the next run delivers them again."""
        try:
            return self.source.take(self.participants, results)
        except BaseException as error:
            for member in self.participants:
                member.state.busy = False
            if results:
                try:
                    described = self.source.result(results)
                except Exception:  # noqa: BLE001 - only for the log line: the round is not recorded anyway
                    described = None
                self.context.unrecorded(described, error)
            raise
