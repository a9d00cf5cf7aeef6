"""The functions Spark tasks run through `mapInArrow`: rows in, report batches out.

`delivery_task`: one topic's round. The rows carry a `targets` column (the subscriptions whose filters passed,
as indices into the plan's lanes; see `herald.engine.round.fanout`). One `TaskSender` delivers for all of them; the
input is read on a thread, so the loop never blocks on Spark, and it is read to the end even when the deadline
stops delivery early.

`rounds_task`: the rounds of several topics in one Spark job (their rows projected together:
`herald.engine.round.projection.project_topics`). Each row carries `round`, its topic's place in the job; all the rows
of a round are in one task, so each round is delivered by one `TaskSender` with its own plan, whole (its
`TaskPlan.tasks` is 1), beside the task's other rounds, and reported with its `round`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from herald.delivery.input import arrow_input
from herald.delivery.plan import TaskPlan
from herald.delivery.report import REPORT_DDL
from herald.delivery.sender import TaskSender

ROUND = "round"
"""The column naming a row's (and a report row's) round in a job shared by several topics."""
ROUNDS_REPORT_DDL = f"{REPORT_DDL}, {ROUND} int"
"""What `rounds_task` yields: the report rows of `delivery_task`, each with its round."""
MAX_SENDERS = 64
"""Rounds a task of a shared job delivers at the same time (a thread each; they wait on their subscribers, so
a slow one holds its own sender only)."""


def delivery_task(plan: TaskPlan):
    """The `mapInArrow` function for one round: delivers the task's rows, yields its report."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        task_index = context.partitionId() if context is not None else 0
        yield _deliver(plan, batches, task_index).to_arrow()

    return run


def rounds_task(plans: Sequence[TaskPlan], max_senders: int = MAX_SENDERS):
    """The `mapInArrow` function for the rounds `plans` in one job: the task's rows split by `round`, each
    round delivered with its plan, at most `max_senders` rounds at a time; yields each round's report with its
    `round`. A slow subscriber holds a sender of its task up to its budget, not the other rounds' senders."""
    plans = list(plans)
    shared = [plan.topic for plan in plans if plan.tasks != 1]
    if shared:
        raise ValueError(f"a round of a shared job is delivered by one task, whole: {', '.join(shared)} "
                         "planned for several")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        by_round = split_rounds(batches)
        if not by_round:
            return

        def deliver(item) -> pa.RecordBatch:
            place, rows = item
            return with_round(_deliver(plans[place], rows, 0).to_arrow(), place)

        workers = min(len(by_round), max_senders)
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="herald-round") as pool:
            yield from pool.map(deliver, sorted(by_round.items()))

    return run


def _deliver(plan: TaskPlan, batches: Iterable[pa.RecordBatch], task_index: int):
    every_lane = tuple(plan.lanes)
    every_row = any(lane.tracks_all for lane in plan.lanes.values())
    return TaskSender(plan, task_index=task_index).run(arrow_input(batches, plan.topic, every_lane, every_row))


def split_rounds(batches: Iterable[pa.RecordBatch]) -> dict[int, list[pa.RecordBatch]]:
    """The task's input read to the end, per round, in input order, without the `round` column."""
    by_round: dict[int, list[pa.RecordBatch]] = {}
    for batch in batches:
        if not batch.num_rows:
            continue
        rounds = batch.column(ROUND)
        rows = batch.drop_columns([ROUND])
        values = np.unique(rounds.to_numpy(zero_copy_only=False))
        if len(values) == 1:
            by_round.setdefault(int(values[0]), []).append(rows)
            continue
        for place in values:
            by_round.setdefault(int(place), []).append(rows.filter(pc.equal(rounds, pa.scalar(place, rounds.type))))
    return by_round


def with_round(report: pa.RecordBatch, place: int) -> pa.RecordBatch:
    """A report batch with its `round` column."""
    return report.append_column(ROUND, pa.array(np.full(report.num_rows, place, dtype=np.int32), pa.int32()))
