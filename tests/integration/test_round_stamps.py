"""A round's rows are stamped in the order its outcome was taken in, not the order they reach the writer.

A subscription's position is its newest offsets row (`committed_at`, then `batch_id`). A move (retransmission)
applied by another thread between a round's `apply` and its `record` writes the moved positions first; the round's
own rows, which still hold the positions from before the move, must not outrank them, or the move is lost at the
next start while its record says it was applied. No Spark: real Delta tables (delta-rs), the real pipeline.
"""

from __future__ import annotations

import datetime as dt

from herald.config import load_config
from herald.engine.context import EngineContext
from herald.engine.round import steps
from herald.engine.round.fanout import Participant
from herald.engine.round.pipeline import TopicPipeline
from herald.engine.round.planner import lane_plan
from herald.engine.round.result import STREAM, RoundResult, SubscriptionOutcome
from herald.engine.round.state import SubscriptionState, stored_positions
from herald.engine.triggers.retry_driver import RetryDriver
from herald.engine.upkeep.moves import Move
from herald.storage import DeltaRsStore, TableWriter
from tests.support.herald_env import write_conf

TOPIC = "stamps.topic"


def _pipeline(tmp_path) -> tuple[TopicPipeline, SubscriptionState]:
    conf = write_conf(tmp_path, "127.0.0.1:9", TOPIC, {"s": {"endpoint": "http://127.0.0.1:9/"}})
    config = load_config(conf)
    store = DeltaRsStore(str(tmp_path / "storage"))
    context = EngineContext(spark=None, config=config, connector="python", store=store, writer=TableWriter(store))
    subscription = config.subscriptions[0]
    state = SubscriptionState(subscription, positions={0: 0, 1: 0})
    driver = RetryDriver(context)
    driver.set_active(config.subscriptions)
    return TopicPipeline(context, config.topic_of(subscription), [state], driver), state


def _move(state: SubscriptionState, to_offsets: dict[int, int]) -> Move:
    now = dt.datetime.now(dt.timezone.utc)
    return Move(state.id, TOPIC, dict(state.positions), to_offsets, now - dt.timedelta(hours=1),
                int(now.timestamp() * 1000), "operator")


def _round_over(pipeline: TopicPipeline, state: SubscriptionState, positions: dict[int, int],
                parked: list | None = None) -> tuple[int, object]:
    """A stream round of `state` that ends at `positions` (having `parked` those messages): its outcome taken in,
    not yet recorded."""
    state.busy = True
    outcome = SubscriptionOutcome(state.subscription, positions=positions, parked=parked or [])
    participants = [Participant(0, state, lane_plan(state, pipeline.context.flow_settings, 0))]
    with pipeline.lock:
        stamp = pipeline.apply(participants, [outcome])
    return stamp, outcome


def _record(pipeline: TopicPipeline, stamp: int, outcome, batch_id: int, park=None) -> None:
    steps.record(pipeline.context, RoundResult(STREAM, "stream:q", batch_id, TOPIC, "test", [outcome]), 0.0, stamp,
                 park=park)


def test_a_move_applied_by_another_thread_before_the_round_is_recorded_outranks_the_rounds_positions(tmp_path):
    """The watcher's move lands between the round's `apply` (the subscription is free again) and its `record`."""
    pipeline, state = _pipeline(tmp_path)
    stamp, outcome = _round_over(pipeline, state, {0: 40, 1: 40})
    assert pipeline.move(state.id, _move(state, {0: 5, 1: 7})), "not busy any more: applied and written at once"
    _record(pipeline, stamp, outcome, batch_id=1)
    pipeline.context.writer.close()
    assert state.positions == {0: 5, 1: 7}
    assert stored_positions(pipeline.context.store)[(state.id, TOPIC)] == {0: 5, 1: 7}, \
        "the next start must begin where the move put the subscription"


def test_a_move_asked_during_the_round_and_flushed_by_another_round_outranks_the_rounds_positions(tmp_path):
    """Asked while the round delivers (pending), applied in `apply`, and flushed by another thread's
    `flush_moves` (a catch-up round, another batch) before this round's `record`."""
    pipeline, state = _pipeline(tmp_path)
    state.busy = True
    assert pipeline.move(state.id, _move(state, {0: 3, 1: 3})), "busy: kept until the round is over"
    assert state.pending_moves
    stamp, outcome = _round_over(pipeline, state, {0: 40, 1: 40})
    pipeline.flush_moves()
    _record(pipeline, stamp, outcome, batch_id=2)
    pipeline.context.writer.close()
    assert stored_positions(pipeline.context.store)[(state.id, TOPIC)] == {0: 3, 1: 3}


def test_a_subscriptions_next_round_recorded_first_still_outranks_the_round_before_it(tmp_path):
    """Once `apply` frees the subscription, its next round (catch-up) may be recorded before this one is."""
    pipeline, state = _pipeline(tmp_path)
    first_stamp, first = _round_over(pipeline, state, {0: 10, 1: 10})
    second_stamp, second = _round_over(pipeline, state, {0: 20, 1: 20})
    _record(pipeline, second_stamp, second, batch_id=4)
    _record(pipeline, first_stamp, first, batch_id=3)
    pipeline.context.writer.close()
    assert stored_positions(pipeline.context.store)[(state.id, TOPIC)] == {0: 20, 1: 20}
