"""Message tracking in the task's loop (trackingAll / discardedOnly), on a fake clock and transport, and the
tracking table's rows built from a round (Hermes' "Message tracking")."""

from __future__ import annotations

import json

import pyarrow as pa

from herald.delivery.message import RetryState
from herald.delivery.report import TRACK_ALL, TRACK_DISCARDED, TaskReport
from herald.delivery.transport import HttpAnswer
from herald.engine.round.result import STREAM, RoundResult, SubscriptionOutcome, table_rows
from herald.storage.tables import TRACKING
from tests.support.delivery import batch, lane, lane_report, record, run, scripted
from tests.support.fake_transport import FakeClock


def steps(report, index=0):
    return [(s.offset, s.status, s.http_status) for s in lane_report(report, index).traced]


def test_tracking_all_records_read_failed_attempts_and_the_end_of_every_message_in_order():
    rows = [(record(0, 0), (0,)), (record(0, 1), ()), (record(0, 2), (0,)), (record(0, 3), (0,))]
    respond = scripted({("http://sub/a", 2): [503, 200], ("http://sub/a", 3): [400]})
    report, _, _ = run({0: lane(inflight=1, tracking=TRACK_ALL)}, [batch(rows)], respond)
    history = steps(report)
    assert [h for h in history if h[0] == 0] == [(0, "INFLIGHT", None), (0, "SUCCESS", None)]
    assert [h for h in history if h[0] == 1] == [(1, "FILTERED", None)]
    assert [h for h in history if h[0] == 2] == [(2, "INFLIGHT", None), (2, "FAILED", 503), (2, "SUCCESS", None)]
    assert [h for h in history if h[0] == 3] == [(3, "INFLIGHT", None), (3, "FAILED", 400)]  # DISCARDED: the driver
    failed = next(s for s in lane_report(report).traced if s.status == "FAILED" and s.offset == 2)
    assert failed.reason == "Message sending failed with status code:503"
    times = [s.event_ms for s in lane_report(report).traced if s.offset == 2]
    assert times == sorted(times) and times[-1] > times[0]


def test_discarded_only_and_off_record_nothing_in_the_task():
    rows = [(record(0, o), (0, 1)) for o in range(3)]
    respond = scripted({("http://sub/a", 1): [400]})
    report, _, _ = run({0: lane(tracking=TRACK_DISCARDED), 1: lane("http://sub/b")}, [batch(rows)], respond)
    assert lane_report(report, 0).traced == [] and lane_report(report, 1).traced == []
    assert [d.offset for d in lane_report(report, 0).discarded] == [1]


def test_rows_past_the_position_are_not_traced_twice_and_a_resumed_message_is_not_read_again():
    clock = FakeClock()
    state = RetryState(attempts=2, first_read_ms=clock.wall_ms(), due_ms=clock.wall_ms(), backoff_s=0.1)
    rows = [(record(0, o), (0,) if o != 3 else ()) for o in range(6)]

    def respond(request, attempt):
        return HttpAnswer(200), 1.0  # 1 s per answer: the deadline leaves the tail unattempted

    report, transport, _ = run({0: lane(inflight=1, tracking=TRACK_ALL, resume={(0, 0): state})}, [batch(rows)],
                               respond, clock=clock, deadline_s=2.5)
    stop = lane_report(report).stops[0]
    assert 0 < stop < 6
    history = steps(report)
    assert all(offset < stop for offset, status, _ in history if status in ("INFLIGHT", "FILTERED"))
    assert (0, "INFLIGHT", None) not in history, "offset 0 was read in an earlier round (its state resumes)"
    assert (0, "SUCCESS", None) in history


def test_traced_steps_survive_the_trip_through_arrow():
    respond = scripted({("http://sub/a", 1): [500, 200]})
    report, _, _ = run({0: lane(tracking=TRACK_ALL)}, [batch([(record(0, o), (0,)) for o in range(3)])], respond)
    (back,) = TaskReport.from_table(pa.Table.from_batches([report.to_arrow()]))
    assert back.lanes[0].traced == report.lanes[0].traced and len(back.lanes[0].traced) == 7


def _subscription(tracking: str):
    from herald.config.model import Subscription

    return Subscription(topicName="g.t", name=f"s-{tracking}", endpoint="http://127.0.0.1:9/",
                        trackingMode=tracking)


def test_the_tracking_table_holds_every_step_for_tracking_all_and_only_discards_for_discarded_only():
    respond = scripted({("http://sub/a", 1): [400]})
    report, _, _ = run({0: lane(tracking=TRACK_ALL)}, [batch([(record(0, o), (0,)) for o in range(2)])], respond)
    lane_result = lane_report(report)
    outcomes = [SubscriptionOutcome(_subscription(mode), discarded=lane_result.discarded, traced=lane_result.traced)
                for mode in ("trackingAll", "discardedOnly", "trackingOff")]
    result = RoundResult(STREAM, "stream:q", 7, "g_t", "primary", outcomes)
    tables = dict(table_rows(result, now_ms=1_800_000_000_000))
    rows = tables[TRACKING].to_pylist()
    by_subscription: dict[str, list] = {}
    for row in rows:
        by_subscription.setdefault(row["subscription"], []).append((row["offset"], row["status"]))
    assert sorted(by_subscription["g.t.s-trackingAll"]) == [(0, "INFLIGHT"), (0, "SUCCESS"), (1, "DISCARDED"),
                                                           (1, "FAILED"), (1, "INFLIGHT")]
    assert by_subscription["g.t.s-discardedOnly"] == [(1, "DISCARDED")]
    assert "g.t.s-trackingOff" not in by_subscription
    discarded = next(r for r in rows if r["status"] == "DISCARDED")
    assert discarded["reason"] == lane_result.discarded[0].reason and discarded["http_status"] == 400
    assert {r["batch_id"] for r in rows} == {7} and {r["cluster"] for r in rows} == {"primary"}
    assert json.loads(json.dumps([r["message_id"] for r in rows]))  # ids are plain strings
