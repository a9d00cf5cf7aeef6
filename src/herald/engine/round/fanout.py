"""One delivery job: a round's rows fanned out to their subscriptions' senders, collected once.

`run_round` coalesces the rows into at most `max_tasks` tasks, runs the senders with `mapInArrow` (the only
action on the rows, so the senders run exactly once per task) and reads the tasks' reports back. `outcomes`
turns the reports into what the round did for each subscription, positions included (see `positions`).
`reports_by_round` reads back the reports of a job shared by several topics' rounds (`task.rounds_task`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from herald.delivery.flow import FlowState
from herald.delivery.plan import LanePlan, TaskPlan
from herald.delivery.report import REPORT_DDL, LaneCounters, TaskReport
from herald.engine.endpoints.pin_group import Pin, PinNews
from herald.engine.round.planner import named
from herald.engine.round.positions import Lost, advance
from herald.engine.round.result import SubscriptionOutcome
from herald.engine.round.state import SubscriptionState
from herald.engine.round.task import ROUND, delivery_task


@dataclass(frozen=True)
class Participant:
    """A subscription in a round: `index` is its value in the rows' `targets`."""

    index: int
    state: SubscriptionState
    plan: LanePlan
    pin: Pin | None = None  # its pin (priority pinned), from `herald.engine.endpoints.priority_groups.Priority.lease`


def run_round(rows, plan: TaskPlan, input_partitions: int) -> list[TaskReport]:
    """Deliver `rows` in `plan.tasks` tasks (the rows' `input_partitions` coalesced when there are more)."""
    frame = rows.coalesce(plan.tasks) if plan.tasks < input_partitions else rows
    table = frame.mapInArrow(delivery_task(plan), REPORT_DDL).toArrow()
    return TaskReport.from_table(table)


def reports_by_round(table: pa.Table, rounds: int) -> list[list[TaskReport]]:
    """The collected rows of a job shared by `rounds` rounds (`task.rounds_task`): each round's task reports,
    in the order of the rounds (a round no task reported on gets none). Raises when a round was delivered by
    more than one task: the job partitions the rows by round, and a round's plan is for one task."""
    places = table.column(ROUND)
    table = table.drop_columns([ROUND])
    found = []
    for place in range(rounds):
        reports = TaskReport.from_table(table.filter(pc.equal(places, pa.scalar(place, places.type))))
        if len(reports) > 1:  # its positions would move on one task's reading of a partition (`advance`)
            raise RuntimeError(f"round {place} of the shared job was delivered by {len(reports)} tasks, not one")
        found.append(reports)
    return found


def outcomes(participants: Sequence[Participant], ranges: Mapping[int, tuple[int, int]],
             reports: Sequence[TaskReport], lost: Lost = ()) -> list[SubscriptionOutcome]:
    """What the round did for each participant; `ranges` is what it covered, per partition, and `lost` the
    offsets of it Kafka deleted before they were read (recorded for each participant whose range held them)."""
    results = []
    for participant in participants:
        outcome = SubscriptionOutcome(participant.state.subscription, counters=LaneCounters(),
                                      pending=participant.plan.pending)
        flow_states, pin_news = [], []
        for report in reports:
            lane = report.lanes.get(participant.index)
            if lane is None:
                continue
            outcome.counters.add(lane.counters)
            flow_states.append(lane.flow_state)
            outcome.discarded.extend(lane.discarded)
            targets = participant.plan.targets  # BROADCAST states leave the round naming their endpoints (§7)
            outcome.parked.extend(replace(item, state=named(item.state, targets)) for item in lane.parked)
            outcome.carried.extend(replace(item, state=named(item.state, targets)) for item in lane.carried)
            outcome.ended_carried.extend(lane.ended_carried)
            outcome.traced.extend(lane.traced)
            if lane.pin_news is not None:
                pin_news.append(PinNews(*lane.pin_news))
        outcome.pin_news = PinNews.merge(pin_news)
        outcome.flow_state = FlowState.combine(flow_states, participant.plan.flow_state) if flow_states \
            else participant.state.flow
        if participant.plan.positional:
            moved = advance(participant.state.positions, ranges, reports, participant.index)
            outcome.positions = {p: moved[p] for p in ranges if p in moved}
            for partition, first, end in lost:
                first = max(first, participant.state.positions.get(partition, first))
                if first < end:
                    outcome.lost.append((partition, first, end))
                    outcome.counters.lost += end - first
        results.append(outcome)
    return results
