"""Kill the delivery job mid-batch and restart it: every message is delivered at least once, also after maintenance
deleted the tables' history; and a restart after maintenance reads back exactly the newest positions and retry
states (no Spark: the real pipeline's rounds). (The restart tests are one file each, so that pytest's workers can
run them side by side: test_restart_catch_up.py, test_restart_ctrl_c.py; the spark-submit entry point is
test_spark_submit_entry.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from herald.delivery.message import Record, RetryState
from herald.delivery.report import SUCCESS, Carried, LaneReport, Parked
from herald.engine.context import now_ms
from herald.engine.round import steps
from herald.engine.round.fanout import Participant
from herald.engine.round.planner import lane_plan
from herald.engine.round.result import CATCHUP, RoundResult, SubscriptionOutcome
from herald.engine.round.state import stored_offsets
from herald.engine.upkeep.moves import Move
from herald.storage import DeltaRsStore
from herald.storage.history import HistoryRetention
from herald.storage.maintenance import maintain_tables
from herald.storage.tables import OFFSETS, RETRIES, at_ms
from tests.support.herald_env import produce, wait_until, write_conf
from tests.support.rounds import TOPIC, job, micro_batch
from tests.support.subscriber import Reply, ScriptedSubscriber


def herald(*args: str) -> list[str]:
    return [sys.executable, "-m", "herald", *args]


def _standing(root) -> dict:
    """What a job starting on the tables under `root` goes on from: each subscription's positions and carried (HELD)
    states (`StateBook`), and the messages its retry driver re-drives (`RetryDriver.load`), with their states."""
    pipeline = job(root, partitions=4)
    pipeline.retries.load({state.id: TOPIC for state in pipeline.states.values()})
    parked = {sid: sorted(((m.record.partition, m.record.offset), m.state, m.record.body) for m in messages)
              for sid, messages in pipeline.retries.due_now().items()}  # all of them are due
    pipeline.context.writer.close()
    return {state.id: (state.positions, state.carried, parked.get(state.id, [])) for state in pipeline.states.values()}


def test_a_restart_after_maintenance_reads_back_exactly_the_newest_positions_and_retry_states(tmp_path):
    """A job's history without Spark (real pipeline, retry driver and tables): positions that move, stay, go back
    (a retransmission, a topic whose log was cut), a message parked and re-driven twice (500), carried states
    that end or stay HELD. Maintenance with no retention left deletes every row it may: the positions, HELD
    states and parked messages a restart reads back are exactly those it read before."""
    with ScriptedSubscriber(lambda request: Reply(500)) as sub:
        pipeline = job(tmp_path, partitions=4, fields={"endpoint": sub.url,
                                                       "subscriptionPolicy": {"messageBackoff": 100}})
        a, b = pipeline.states.values()
        now = now_ms()
        parked = Parked(Record(partition=0, offset=103, timestamp_ms=now, message_id="m103", body=b'{"n": 103}'),
                        RetryState(attempts=1, first_read_ms=now, due_ms=now - 1, last_status=500))
        held = RetryState(attempts=2, first_read_ms=now, due_ms=now + 3_600_000, last_status=503)
        micro_batch(pipeline, 0, {p: (100, 110) for p in range(4)}, {
            0: LaneReport(parked=[parked], carried=[Carried(1, 105, held)], stops={1: 105}), 1: LaneReport()})
        for batch_id in range(1, 6):  # b alone (a is behind on partition 1); partition 3 has nothing new
            micro_batch(pipeline, batch_id, {p: (100 + 10 * batch_id, 110 + 10 * batch_id) if p < 3 else (110, 110)
                                             for p in range(4)}, {1: LaneReport()})
        for _ in range(2):  # the parked message, re-driven when due (its rate allows): 500 again
            assert wait_until(lambda: pipeline.retries.due_now(), timeout_s=30)
            assert pipeline.retries.run_round(pipeline.retries.due_now()).outcomes[0].parked
        back = Move(b.id, TOPIC, dict(b.positions), {0: 120, 1: 120}, at_ms(now - 60_000), now, "operator")
        assert pipeline.move(b.id, back), "a retransmission: b goes back on partitions 0 and 1"
        pipeline.check_log({0: (100, 200), 1: (100, 200), 2: (100, 200), 3: (0, 50)}, None)  # partition 3 went back
        a.busy = True  # a's catch-up: the HELD message delivered, another one held further on
        with pipeline.lock:
            outcome = SubscriptionOutcome(a.subscription, positions={1: 117}, ended_carried=[(1, 105, SUCCESS)],
                                          carried=[Carried(1, 117, held)])
            stamp = pipeline.apply([Participant(0, a, lane_plan(a, pipeline.context.flow_settings, 1))], [outcome])
        steps.record(pipeline.context, RoundResult(CATCHUP, "catchup:r", 1, TOPIC, "test", [outcome]), 0.0, stamp)
        assert pipeline.context.writer.close()
    assert a.positions == {0: 110, 1: 117, 2: 110, 3: 0} and set(a.carried) == {(1, 117)}
    assert b.positions == {0: 120, 1: 120, 2: 160, 3: 0}

    before = _standing(tmp_path)
    assert {sid: (positions, carried) for sid, (positions, carried, _) in before.items()} == \
        {a.id: (a.positions, a.carried), b.id: (b.positions, b.carried)}, "the newest rows are where the job was"
    store = DeltaRsStore(str(tmp_path / "storage"))

    def parked_rows() -> list[tuple[str, int]]:
        return sorted((r["state"], r["attempts"]) for r in store.read(RETRIES).to_pylist() if r["offset"] == 103)

    assert len(parked_rows()) == 3, "parked, then parked again by two retry rounds"
    results = {u.table: u.rows_deleted for u in maintain_tables(store, 168, history=HistoryRetention(0, 0))}
    assert results[OFFSETS] > 0 and results[RETRIES] == 3, results  # 2 PARKED, 1 HELD superseded
    assert _standing(tmp_path) == before
    (_, attempts), = parked_rows()
    assert parked_rows() == [("PARKED", attempts)] and attempts > 1, "its newest row: the state it goes on from"
    assert [state.attempts for _, state, _ in before[a.id][2]] == [attempts]


@pytest.mark.spark
@pytest.mark.broker
def test_kill_mid_batch_and_restart_loses_nothing(broker, topic_name, tmp_path):
    broker.create_topics({topic_name: 3})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(60)])
    with ScriptedSubscriber(lambda request: Reply(delay_ms=40)) as sub:
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name,
                          {"k": {"endpoint": sub.url, "subscriptionPolicy": {"inflightSize": 3}}},
                          settings={"streaming": {"maxOffsetsPerTrigger": 12}})
        job = subprocess.Popen(herald("run", "--conf", str(conf)), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert wait_until(lambda: len(sub.requests) >= 20, timeout_s=180), job.stderr.read1().decode()
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and Python workers, at once
            job.wait()
        delivered_before_kill = len(sub.requests)
        assert delivered_before_kill < 60, "killed while work was left"
        store = DeltaRsStore(str(tmp_path / "storage"))  # maintenance with no history kept, before the restart
        positions = stored_offsets(store)
        maintain_tables(store, 168, history=HistoryRetention(0, 0))
        assert stored_offsets(store) == positions

        restart = subprocess.run(herald("run", "--conf", str(conf), "--once"), capture_output=True, text=True,
                                 timeout=300)
        assert restart.returncode == 0, restart.stderr[-3000:]
    assert sub.delivered_ids() == set(range(60))
