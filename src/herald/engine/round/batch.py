"""A topic's round of a micro-batch of the shared read: the `RoundSource` that `TopicPipeline.begin_batch` makes.

Its two halves run apart (docs/design.md §3): `begin` chooses the subscriptions at the read's position and plans
their tasks; the read then delivers several topics' rounds in one Spark job (`herald.engine.triggers.shared_read`),
and `finish` takes the job's reports, or `abandon` gives the round up when that job failed. It is the pipeline's
own round: it works on the pipeline's state as the pipeline's methods do, under its lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from herald.config import Subscription
from herald.delivery.plan import TaskPlan
from herald.engine.round import steps
from herald.engine.round.fanout import Participant
from herald.engine.round.owner import Round, TopicRound
from herald.engine.round.result import STREAM, RoundResult, SubscriptionOutcome

if TYPE_CHECKING:
    from herald.engine.round.pipeline import TopicPipeline

log = logging.getLogger("herald.engine.round.pipeline")  # its lines are the pipeline's, as they always were


class BatchRound(TopicRound):
    """A topic's round of a micro-batch (`round` runs it, from `TopicPipeline.begin_batch` to `finish_batch`): the
    subscriptions projected (`subscriptions`, which the participants' indices point into), the plan of their tasks
    (None: nothing to send) and, once its Spark job ran, a callable returning the tasks' `reports`."""

    def __init__(self, pipeline: TopicPipeline, batch_id: int, ranges: dict[int, tuple[int, int]], writer: str,
                 tasks: int | None) -> None:
        super().__init__(pipeline)
        self.batch_id, self.ranges, self.writer, self.tasks = batch_id, ranges, writer, tasks
        self.subscriptions: list[Subscription] = []
        self.plan: TaskPlan | None = None
        self.topic_id: str | None = None  # Kafka's id of the topic when it was planned: its positions are in that log
        self.reports: Callable[[], list] | None = None
        self.round = Round(pipeline.context, self)

    @property
    def participants(self) -> list[Participant]:
        return self.round.participants

    @property
    def possible_replay(self) -> bool:
        return self.pipeline.replay_possible

    def choose(self) -> list[Participant]:
        pipeline, ranges = self.pipeline, self.ranges
        with pipeline.lock:
            ends = {partition: end for partition, (_, end) in ranges.items()}
            for state in pipeline.states.values():
                for partition in ranges:  # a partition added to the topic: every subscription from its start
                    state.positions.setdefault(partition, 0)
                state.topic_end = ends
            self.subscriptions = pipeline.subscriptions
            participants = pipeline.claim_participants(self.subscriptions, ranges)  # marked busy: `take` frees them
            pipeline.batch_in_progress = True
            self.topic_id = pipeline.topic_id
        return participants

    def prepare(self, participants: list[Participant]) -> None:  # failing, they catch up on the batch
        if participants and any(start < end for start, end in self.ranges.values()):
            context, tasks = self.pipeline.context, self.tasks
            if tasks is None:
                tasks = max(1, min(steps.input_partitions(self.ranges), context.parallelism))
            self.plan = steps.round_plan(context, self.pipeline.topic, self.subscriptions, participants,
                                         tasks=tasks, shared=True)

    def deliver(self, participants: list[Participant]) -> list[SubscriptionOutcome]:
        if self.plan is not None:
            return steps.delivered(self.pipeline.context, self.pipeline.kafka_topic, participants, self.ranges,
                                   self.reports())
        return [SubscriptionOutcome(p.state.subscription, flow_state=p.state.flow,  # nothing to send: the
                                    positions={q: max(p.state.positions.get(q, e), e)  # (empty) ranges passed
                                               for q, (_, e) in self.ranges.items()})
                for p in participants]

    def take(self, participants: list[Participant], results: list[SubscriptionOutcome]) -> int:
        """`apply`, and the frontier at the batch's end (`TopicPipeline.batch_ended`: not where Kafka's log went
        back since the last batch): those that failed catch up on the batch."""
        pipeline = self.pipeline
        with pipeline.lock:
            try:
                return pipeline.apply(participants, results, self.topic_id)
            finally:
                pipeline.batch_ended(self.ranges, self.batch_id)
                pipeline.batch_in_progress = False

    def drop(self, participants: list[Participant]) -> None:  # the frontier does not move
        pipeline = self.pipeline
        with pipeline.lock:
            try:
                pipeline.apply(participants, [])
            finally:
                pipeline.batch_in_progress = False

    def result(self, results: list[SubscriptionOutcome]) -> RoundResult:
        pipeline = self.pipeline
        return RoundResult(STREAM, self.writer, self.batch_id, pipeline.kafka_topic, pipeline.context.cluster,
                           results, self.topic_id)

    def after(self, results: list[SubscriptionOutcome], started: float) -> None:
        pipeline = self.pipeline
        pipeline.replay_possible = False
        pipeline.healthy = True
        pipeline.round_succeeded()
        pipeline.flush_moves()
        if pipeline.catchup is not None:
            pipeline.catchup.wake()
        counted = sum(r.counters.delivered for r in results), sum(r.counters.discarded for r in results)
        log.info("%s batch %d: %d subscription(s), delivered %d, discarded %d, %d behind, in %.1f s",
                 pipeline.kafka_topic, self.batch_id, len(self.participants), *counted,
                 sum(1 for s in pipeline.states.values() if s.catching_up), time.monotonic() - started)
