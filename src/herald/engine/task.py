"""The function each Spark task runs through `mapInArrow`: the topic's rows in, one report batch out.

The rows carry a `targets` column (the subscriptions whose filters passed, as indices into the plan's lanes;
see `herald.engine.fanout`). One `TaskSender` delivers for all of them; the input is read on a thread, so
the loop never blocks on Spark, and it is read to the end even when the deadline stops delivery early.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from herald.delivery.input import arrow_input
from herald.delivery.plan import TaskPlan
from herald.delivery.sender import TaskSender


def delivery_task(plan: TaskPlan):
    """The `mapInArrow` function for one round: delivers the task's rows, yields its report."""
    every_lane = tuple(plan.lanes)
    every_row = any(lane.tracks_all for lane in plan.lanes.values())

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        task_index = context.partitionId() if context is not None else 0
        report = TaskSender(plan, task_index=task_index).run(arrow_input(batches, plan.topic, every_lane, every_row))
        yield report.to_arrow()

    return run
