"""A round whose outcome was taken into its subscriptions' states but whose rows never reached the writer.

The states' positions are then past the round's messages, with no row about them: any later round's positions
would pass them for good (review finding F11). So the job writes nothing more and stops (exit 1), and the next
run delivers them again from the positions written before. No Spark: real Delta tables (delta-rs), the real
pipeline and round steps.
"""

from __future__ import annotations

import pytest

from herald.delivery.message import Record, RetryState
from herald.delivery.report import Parked
from herald.engine.context import now_ms
from herald.engine.round import steps
from herald.engine.round.result import STREAM, RoundResult
from herald.engine.round.state import stored_positions
from herald.storage.tables import METRICS
from tests.integration.test_round_stamps import TOPIC, _pipeline, _record, _round_over


def test_a_round_that_cannot_be_handed_to_the_writer_stops_the_job_and_no_later_round_passes_it(tmp_path,
                                                                                              monkeypatch):
    pipeline, state = _pipeline(tmp_path)
    stops: list[str] = []
    pipeline.context.on_unrecorded = stops.append
    stamp, outcome = _round_over(pipeline, state, {0: 10, 1: 10})
    _record(pipeline, stamp, outcome, batch_id=1)
    assert pipeline.context.writer.flush(30.0)

    stamp, outcome = _round_over(pipeline, state, {0: 40, 1: 40})
    real_rows = steps.table_rows
    monkeypatch.setattr(steps, "table_rows", lambda result, stamp: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        _record(pipeline, stamp, outcome, batch_id=2)
    monkeypatch.setattr(steps, "table_rows", real_rows)
    assert len(stops) == 1 and "round 2 of " + TOPIC in stops[0] and "ZeroDivisionError" in stops[0], stops
    assert state.positions == {0: 40, 1: 40}, "the states moved on: only the writer can keep them from the tables"

    stamp, outcome = _round_over(pipeline, state, {0: 50, 1: 50})  # a round already delivering, recorded later
    _record(pipeline, stamp, outcome, batch_id=3)
    pipeline.context.writer.close()
    assert stored_positions(pipeline.context.store)[(state.id, TOPIC)] == {0: 10, 1: 10}, \
        "the next run must start before round 2's messages"


def test_parked_messages_the_retry_driver_cannot_take_stop_the_job(tmp_path):
    """The round's rows were handed over, but its parked messages never reached the retry driver: they would not
    be retried by this run, and no later round may pass them either."""
    pipeline, state = _pipeline(tmp_path)
    stops: list[str] = []
    pipeline.context.on_unrecorded = stops.append
    stamp, outcome = _round_over(pipeline, state, {0: 10, 1: 10})
    now = now_ms()
    outcome.parked = [Parked(Record(partition=0, offset=3, timestamp_ms=now, message_id="m3", body=b'{"n": 3}'),
                             RetryState(attempts=1, first_read_ms=now - 1000, due_ms=now + 60_000, last_status=503))]

    def refuse(subscription, kafka_topic, parked):
        raise RuntimeError("retry driver closed")

    with pytest.raises(RuntimeError):
        steps.record(pipeline.context, RoundResult(STREAM, "stream:q", 1, TOPIC, "test", [outcome]), 0.0, stamp,
                     park=refuse)
    assert len(stops) == 1 and "retry driver closed" in stops[0]
    stamp, outcome = _round_over(pipeline, state, {0: 20, 1: 20})
    _record(pipeline, stamp, outcome, batch_id=2)
    pipeline.context.writer.close()
    assert stored_positions(pipeline.context.store).get((state.id, TOPIC)) in (None, {0: 10, 1: 10}), \
        "round 1 may be written (its PARKED row with it: the next run retries it), round 2 never"


def test_a_pin_that_cannot_be_given_back_does_not_keep_the_round_from_being_recorded(tmp_path, monkeypatch):
    """A micro-batch with nothing new for the topic (no Spark job): the round is still recorded after a failed
    pin release."""
    pipeline, state = _pipeline(tmp_path)
    state.positions = {0: 25, 1: 30}
    monkeypatch.setattr(pipeline.context.priority, "release", lambda *args: 1 / 0)
    pipeline.deliver_batch(None, 7, {0: (25, 25), 1: (30, 30)}, "stream:q")
    pipeline.context.writer.close()
    rows = pipeline.context.store.read(METRICS, state.id).to_pylist()
    assert [(row["batch_id"], row["kind"]) for row in rows] == [(7, STREAM)], "the round is recorded"
    assert (state.id, TOPIC) not in stored_positions(pipeline.context.store), \
        "its positions did not move: no offsets row (docs/design.md §8)"


def test_a_round_the_writer_gave_up_is_neither_retried_nor_told_to_its_listeners(tmp_path):
    """After the writer stopped (closed, or abandoned at an earlier round) a round's rows are never written: its
    parked messages must not be retried by this run and its DISCARDED ones not published as dead letters, as the
    next run delivers all of them again from the positions written before."""
    pipeline, state = _pipeline(tmp_path)
    heard: list = []
    pipeline.context.round_listeners.append(lambda result, duration_s: heard.append(result.batch_id))
    stamp, outcome = _round_over(pipeline, state, {0: 10, 1: 10})
    _record(pipeline, stamp, outcome, batch_id=1)
    assert heard == [1]
    pipeline.context.writer.abandon()

    stamp, outcome = _round_over(pipeline, state, {0: 20, 1: 20})
    now = now_ms()
    outcome.parked = [Parked(Record(partition=0, offset=12, timestamp_ms=now, message_id="m12", body=b"{}"),
                             RetryState(attempts=1, first_read_ms=now - 1000, due_ms=now + 60_000, last_status=503))]
    taken: list = []
    steps.record(pipeline.context, RoundResult(STREAM, "stream:q", 2, TOPIC, "test", [outcome]), 0.0, stamp,
                 park=lambda subscription, kafka_topic, parked: taken.extend(parked))
    assert taken == [] and heard == [1], "a round with no rows went on to the retry driver or its listeners"
    pipeline.context.writer.close()
    assert stored_positions(pipeline.context.store).get((state.id, TOPIC)) in (None, {0: 10, 1: 10})


@pytest.mark.spark
@pytest.mark.broker
def test_a_job_stopped_while_storage_refuses_its_rounds_exits_1(broker, spark, topic_name, tmp_path, monkeypatch,
                                                                capsys):
    """Storage goes down after the job took its lease: its rounds wait for the writer; when the job is stopped
    (Ctrl-C, or a --once caller giving up) the rounds still unwritten are given up, and the exit code says the
    tables are behind (the next run delivers those messages again) instead of 0."""
    import threading

    from herald.config import load_config
    from herald.engine.runner import Runner
    from herald.storage import DeltaRsStore
    from herald.storage.tables import LEASES
    from tests.support.herald_env import produce, wait_until, write_conf
    from tests.support.subscriber import ScriptedSubscriber

    real_replace, real_append = DeltaRsStore.replace, DeltaRsStore.append

    def storage_down(self, table, rows, part, note=None):
        if table != LEASES:
            raise OSError("storage is down")
        return real_replace(self, table, rows, part, note)

    def appends_down(self, table, rows, note=None):
        if table != LEASES:
            raise OSError("storage is down")
        return real_append(self, table, rows, note)

    monkeypatch.setattr(DeltaRsStore, "replace", storage_down)
    monkeypatch.setattr(DeltaRsStore, "append", appends_down)
    broker.create_topics({topic_name: 2})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(10)])
    with ScriptedSubscriber() as subscriber:
        config = load_config(write_conf(tmp_path, broker.bootstrap_servers, topic_name,  # the store made to fail
                                        {"a": {"endpoint": f"{subscriber.url}/a"}},
                                        settings={"storage": {"engine": "deltalake"}}))
        runner = Runner(config, spark=spark)
        codes: list[int] = []
        job = threading.Thread(target=lambda: codes.append(runner.run(once=True, grace_s=1.0)))
        job.start()
        assert wait_until(lambda: len(subscriber.requests) >= 10, 120), "the job delivered nothing"
        runner.stop()
        job.join(120)
    assert codes == [1]
    assert runner.context.writer.abandoned >= 1
    assert "the tables are behind" in capsys.readouterr().out
