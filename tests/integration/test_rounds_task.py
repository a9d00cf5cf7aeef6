"""The task function of a Spark job shared by several topics' rounds (`herald.engine.round.task.rounds_task`), run as
`mapInArrow` runs it, on Arrow batches shaped as `projection.project_topics` gives them, against a real HTTP
subscriber on 127.0.0.1 (no Spark: the function alone).
"""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from herald.delivery.message import message_id
from herald.delivery.plan import TaskPlan
from herald.engine.round.fanout import reports_by_round
from herald.engine.round.task import ROUND, rounds_task, split_rounds
from tests.support.delivery import lane_plan
from tests.support.subscriber import ScriptedSubscriber

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema([(ROUND, pa.int32()), ("partition", pa.int32()), ("offset", pa.int64()),
                    ("timestamp", pa.timestamp("us")), ("headers", HEADERS), ("targets", pa.list_(pa.int32())),
                    ("key", pa.binary()), ("value", pa.binary()), ("position_id", pa.string())])


def rows(entries: list[tuple[int, int, int, list[int]]]) -> pa.RecordBatch:
    """(round, partition, offset, targets) -> a batch; a row that goes somewhere carries its message."""
    now = dt.datetime(2026, 11, 27)
    columns = {ROUND: [], "partition": [], "offset": [], "timestamp": [], "headers": [], "targets": [], "key": [],
               "value": [], "position_id": []}
    for place, partition, offset, targets in entries:
        goes = bool(targets)
        for name, value in ((ROUND, place), ("partition", partition), ("offset", offset), ("timestamp", now),
                            ("headers", []), ("targets", targets), ("key", None),
                            ("value", json.dumps({"round": place, "p": partition, "o": offset}).encode()
                             if goes else None),
                            ("position_id", message_id(f"t{place}", partition, offset, None) if goes else None)):
            columns[name].append(value)
    return pa.RecordBatch.from_pydict(columns, schema=SCHEMA)


def test_split_rounds_keeps_each_rounds_rows_in_input_order_without_the_round_column():
    first = rows([(0, 0, 0, [0]), (1, 0, 0, []), (0, 0, 1, []), (1, 0, 1, [0])])
    second = rows([(1, 1, 5, [0]), (1, 1, 6, [0])])
    by_round = split_rounds(iter([first, rows([]), second]))
    assert sorted(by_round) == [0, 1]
    assert all(ROUND not in batch.schema.names for batches in by_round.values() for batch in batches)
    assert [(r["partition"], r["offset"]) for b in by_round[0] for r in b.to_pylist()] == [(0, 0), (0, 1)]
    assert [(r["partition"], r["offset"]) for b in by_round[1] for r in b.to_pylist()] == [(0, 0), (0, 1), (1, 5),
                                                                                           (1, 6)]
    assert len(by_round[1]) == 2, "a batch of one round is passed on as it is"


def test_each_round_is_delivered_with_its_own_plan_and_reported_with_its_round():
    """Two topics' rounds in one task, each with its lane 0 (a subscription of its own topic): each row reaches
    the subscription its round names, never the other topic's, and the reports read back per round say how far
    each partition was read, so each topic's positions move over its own rows only."""
    with ScriptedSubscriber() as sub:
        plans = [TaskPlan(topic=f"t{place}", lanes={0: lane_plan(f"{sub.url}/t{place}",
                                                                 subscription_id=f"t{place}.s")},
                          budget_s=30, tasks=1, transport="requests")
                 for place in range(3)]
        task = rounds_task(plans, max_senders=2)
        batches = [rows([(0, 0, 0, [0]), (1, 0, 0, [0]), (0, 0, 1, []), (1, 1, 7, [0])]),
                   rows([(0, 0, 2, [0]), (1, 1, 8, [])])]  # round 2 has no rows in this task
        out = list(task(iter(batches)))
    assert sorted(request.path for request in sub.requests) == ["/t0", "/t0", "/t1", "/t1"]
    for request in sub.requests:
        assert request.path == f"/t{request.json()['round']}"
    table = pa.Table.from_batches(out)
    first, second, third = reports_by_round(table, 3)
    assert third == [], "no report for a round the task had no rows of"
    ((zero,), (one,)) = (first, second)
    assert zero.progress == {0: 3} and one.progress == {0: 1, 1: 9}
    assert zero.lanes[0].counters.delivered == 2 and one.lanes[0].counters.delivered == 2
    assert zero.exhausted and one.exhausted


def test_a_round_planned_for_several_tasks_is_refused():
    plan = TaskPlan(topic="t0", lanes={0: lane_plan("http://127.0.0.1:9/x")}, budget_s=1, tasks=2)
    with pytest.raises(ValueError, match="one task, whole: t0"):
        rounds_task([plan])


def test_a_round_reported_by_two_tasks_is_refused_so_the_shared_job_counts_as_failed():
    """A round's plan is for one task, and its positions move on what that task read: should a round's rows
    ever be split over two tasks, the job's reports are refused (each topic then delivers in a job of its own)."""
    with ScriptedSubscriber() as sub:
        plans = [TaskPlan(topic="t0", lanes={0: lane_plan(f"{sub.url}/t0", subscription_id="t0.s")}, budget_s=30,
                          tasks=1, transport="requests")]
        task = rounds_task(plans)
        out = list(task(iter([rows([(0, 0, 0, [0])])]))) + list(task(iter([rows([(0, 0, 1, [0])])])))
    ((alone,),) = reports_by_round(pa.Table.from_batches(out[:1]), 1)
    assert alone.progress == {0: 1}
    with pytest.raises(RuntimeError, match="delivered by 2 tasks"):
        reports_by_round(pa.Table.from_batches(out), 1)
