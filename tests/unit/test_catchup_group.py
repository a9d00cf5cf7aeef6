"""Which subscriptions a catch-up round takes and how far it reads (herald.engine.triggers.catchup.CatchUp._group), with
stand-ins for the topic: a subscription flow control slowed to probes reads a probe's worth, not a whole
maxOffsetsPerTrigger (the soak benchmark's failing neighbours cost a 10,000-record Spark job a minute each)."""

from __future__ import annotations

import threading
import types

from herald.config import load_config
from herald.delivery.flow import FlowMode, FlowState
from herald.engine.round.state import SubscriptionState
from herald.engine.triggers.catchup import THROTTLED_ROWS, CatchUp
from tests.support.config_files import write_conf


def _topic(tmp_path, mode: FlowMode):
    subscription = load_config(write_conf(tmp_path)).subscriptions[0]
    state = SubscriptionState(subscription, positions={0: 0, 1: 0}, flow=FlowState(mode), catching_up=True)
    settings = types.SimpleNamespace(streaming=types.SimpleNamespace(maxOffsetsPerTrigger=10_000))
    context = types.SimpleNamespace(holds=lambda sid: False, config=types.SimpleNamespace(settings=settings))
    pipeline = types.SimpleNamespace(kafka_topic="t", lock=threading.RLock(), frontier={0: 50_000, 1: 50_000},
                                     states={state.id: state}, context=context, batch_in_progress=False)
    return CatchUp(pipeline), state


def test_a_throttled_subscription_reads_a_probes_worth(tmp_path):
    catchup, state = _topic(tmp_path, FlowMode.HEARTBEAT)
    group, ranges, _ = catchup._group()
    assert group == [state] and sum(end - start for start, end in ranges.values()) == THROTTLED_ROWS


def test_a_subscription_at_full_speed_reads_max_offsets_per_trigger(tmp_path):
    catchup, _ = _topic(tmp_path, FlowMode.NORMAL)
    _, ranges, _ = catchup._group()
    assert sum(end - start for start, end in ranges.values()) == 10_000


def test_a_catch_up_read_stays_within_kafkas_log():
    """Below the low watermark: read from it, the rest recorded lost. Past the high watermark (a log that went
    back since the frontier was set): read to it, not past, or a round that read its range to the end would
    move the positions over offsets new messages will take. A partition Kafka does not list: not read."""
    from herald.engine.triggers.catchup import within_log

    ranges = {0: (5, 20), 1: (10, 12), 2: (0, 8), 3: (15, 30)}
    clamped, deleted = within_log(ranges, {0: (8, 40), 1: (0, 4), 3: (0, 50)})
    assert clamped == {0: (8, 20), 1: (4, 4), 3: (15, 30)}
    assert deleted == [(0, 5, 8)]
