"""The task's delivery loop on a fake clock and a fake transport: timing, independence and the end of a round.

The HTTP semantics of the real transports are tested against real servers in tests/integration; here every
answer and its latency are scripted, and time only moves when the loop waits.
"""

from __future__ import annotations

import json

import pytest

from herald.delivery.flow import FlowMode, FlowSettings, FlowState
from herald.delivery.message import RetryState, message_id
from herald.delivery.outcome import FailureKind, TransportFailure
from herald.delivery.policy import EndedBy
from herald.delivery.report import TaskReport
from herald.delivery.transport import HttpAnswer
from tests.support.clock import FakeClock
from tests.support.delivery import TOPIC, batch, by_url, lane, lane_report, record, retry_policy, run, scripted
from tests.support.fake_transport import ok


# -- delivery and fan-out ---------------------------------------------------------------------------------------
def test_each_row_goes_to_the_lanes_its_filters_passed_with_the_attempt_headers():
    rows = [(record(0, o), (0, 1) if o % 2 == 0 else (1,)) for o in range(10)]
    report, transport, _ = run({0: lane("http://sub/a"), 1: lane("http://sub/b")}, [batch(rows)], ok())
    a, b = by_url(transport, "http://sub/a"), by_url(transport, "http://sub/b")
    assert sorted(json.loads(s.request.body)["o"] for s in a) == [0, 2, 4, 6, 8]
    assert sorted(json.loads(s.request.body)["o"] for s in b) == list(range(10))
    first = a[0]
    assert first.request.header_lines[0] == "Content-Type: application/json"
    assert first.message_id == message_id(TOPIC, 0, json.loads(first.request.body)["o"], None)
    assert first.header("Hermes-Retry-Count") == "0"
    counters = lane_report(report, 0).counters
    assert (counters.read, counters.matched, counters.filtered, counters.delivered) == (10, 5, 5, 5)
    assert report.exhausted and report.progress == {0: 10}
    assert lane_report(report, 0).stops == {} and lane_report(report, 1).stops == {}


def test_rows_below_a_lanes_start_are_already_done_and_not_sent():
    rows = [(record(0, o), (0,)) for o in range(10)]
    report, transport, _ = run({0: lane(starts={0: 6})}, [batch(rows)], ok())
    assert sorted(json.loads(s.request.body)["o"] for s in transport.sent) == [6, 7, 8, 9]
    assert lane_report(report).counters.read == 4


def test_a_record_that_could_not_be_decoded_is_discarded_unsent_for_every_lane():
    bad = record(0, 3, error="bad magic byte", raw=b"\x07xyz")
    report, transport, _ = run({0: lane("http://sub/a"), 1: lane("http://sub/b")},
                               [batch([(bad, (0, 1)), (record(0, 4), (0,))])], ok())
    assert [json.loads(s.request.body)["o"] for s in transport.sent] == [4]
    for index in (0, 1):
        (item,) = lane_report(report, index).discarded
        assert (item.offset, item.ended_by, item.raw_value) == (3, EndedBy.DECODE, b"\x07xyz")
        assert item.reason == "Message could not be decoded: bad magic byte"


# -- retries, TTL, attempts ------------------------------------------------------------------------------------
def test_backoff_grows_by_the_multiplier_and_retry_count_counts():
    respond = scripted({("http://sub/a", 0): [500, 500, 500, 200]})
    retry = retry_policy(message_ttl_s=60, backoff_s=0.1, backoff_multiplier=2)
    report, transport, _ = run({0: lane(retry=retry)}, [batch([(record(0, 0), (0,))])], respond)
    sent = transport.sent
    assert [s.header("Hermes-Retry-Count") for s in sent] == ["0", "1", "2", "3"]
    gaps = [round(b.started - a.ended, 3) for a, b in zip(sent, sent[1:])]
    assert gaps == [0.1, 0.2, 0.4]
    assert lane_report(report).counters.delivered == 1 and lane_report(report).counters.codes_5xx == 3


def test_retry_after_replaces_the_backoff():
    respond = scripted({("http://sub/a", 0): [HttpAnswer(503, "2"), 200]})
    report, transport, _ = run({0: lane()}, [batch([(record(0, 0), (0,))])], respond, park_after_s=5)
    first, second = transport.sent
    assert round(second.started - first.ended, 3) == 2.0


def test_message_ttl_zero_means_exactly_one_attempt():
    respond = scripted({("http://sub/a", 0): [500, 200]})
    report, transport, _ = run({0: lane(retry=retry_policy(message_ttl_s=0, backoff_s=0.1))},
                               [batch([(record(0, 0), (0,))])], respond)
    assert len(transport.sent) == 1
    (item,) = lane_report(report).discarded
    assert item.reason == "Message sending failed with status code:500"
    assert item.ended_by == EndedBy.TTL and item.attempts == 1 and item.http_status == 500


def test_a_message_discarded_by_its_ttl_keeps_its_last_reason():
    respond = scripted({("http://sub/a", 0): [503, TransportFailure(FailureKind.TIMEOUT, "Timeout: x")]})
    retry = retry_policy(message_ttl_s=1.0, backoff_s=0.3)
    report, transport, _ = run({0: lane(retry=retry)}, [batch([(record(0, 0), (0,))])], respond)
    (item,) = lane_report(report).discarded
    assert item.reason == "Timeout: x" and item.ended_by == EndedBy.TTL
    assert len(transport.sent) == 1 + int(1.0 // 0.31)  # retries while they can start within the TTL


def test_max_attempts_ends_a_message_with_its_last_reason():
    respond = scripted({("http://sub/a", 0): [500]})
    report, transport, _ = run({0: lane(retry=retry_policy(message_ttl_s=60, backoff_s=0.01, max_attempts=3))},
                               [batch([(record(0, 0), (0,))])], respond)
    (item,) = lane_report(report).discarded
    assert len(transport.sent) == 3 and item.ended_by == EndedBy.MAX_ATTEMPTS
    assert item.reason == "Message sending failed with status code:500"


def test_a_400_is_discarded_at_once_and_a_retried_message_keeps_its_id():
    respond = scripted({("http://sub/a", 1): [400], ("http://sub/a", 2): [502, 200]})
    report, transport, _ = run({0: lane()}, [batch([(record(0, o), (0,)) for o in range(3)])], respond)
    attempts_of_2 = [s for s in transport.sent if json.loads(s.request.body)["o"] == 2]
    assert len({s.message_id for s in attempts_of_2}) == 1 and len(attempts_of_2) == 2
    assert [d.offset for d in lane_report(report).discarded] == [1]


# -- flow ------------------------------------------------------------------------------------------------------
def test_the_rate_cap_spaces_attempts_and_holds_across_rounds():
    clock = FakeClock()
    rows = [(record(0, o), (0,)) for o in range(5)]
    report, transport, _ = run({0: lane(rate_per_s=10.0)}, [batch(rows)], ok(0.001), clock=clock)
    starts = [s.started for s in transport.sent]
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(starts, starts[1:]))
    state = lane_report(report).flow_state
    assert state.permit_in_ms > 0 and state.next_permit_ms == 0, "a duration crosses to the driver, not an instant"
    # the next round starts at once, but its first permit waits for the one the last round took
    rows = [(record(0, o), (0,)) for o in range(5, 7)]
    _, transport2, _ = run({0: lane(rate_per_s=10.0, flow_state=state)}, [batch(rows)], ok(0.001), clock=clock)
    assert transport2.sent[0].started - starts[-1] >= 0.1 - 1e-9


def deliver_rounds_to_a_failing_subscriber(round_s: float, tasks: int, total_s: float) -> list[tuple[FlowMode, int]]:
    """Rounds of `round_s` seconds one after another on a fake clock, to a subscriber answering 500 to
    everything, with the default `FlowSettings` (Hermes' 30 s window): each round's `tasks` tasks start from the
    flow state the last round carried, merged as the driver merges it. Returns each round's (mode, attempts)."""
    clock = FakeClock()
    carried, rounds, offset = FlowState(), [], 0
    for _ in range(int(total_s / round_s)):
        rows = [(record(0, o), (0,)) for o in range(offset, offset + 50)]
        offset += 50
        plan = lane(rate_per_s=400.0, flow_settings=FlowSettings(), flow_state=carried)
        started, started_ms, states, attempts = clock.now, clock.wall_ms(), [], 0
        for task_index in range(tasks):  # the round's tasks run side by side: each from the round's start
            task_clock = FakeClock(started, started_ms)
            report, transport, _ = run({0: plan}, [batch(rows)], lambda request, attempt: (HttpAnswer(500), 0.01),
                                       clock=task_clock, deadline_s=round_s, park_after_s=round_s, tasks=tasks,
                                       task_index=task_index)
            states.append(lane_report(report).flow_state)
            attempts += len(transport.sent)
            clock.now = max(clock.now, task_clock.now)
        carried = FlowState.combine(states, plan.flow_state)
        rounds.append((carried.mode, attempts))
    return rounds


@pytest.mark.parametrize("round_s, tasks", [(10.0, 1), (1.0, 1), (2.0, 2)])
def test_the_default_window_spans_rounds_and_slows_a_failing_subscriber(round_s, tasks):
    """The default window (30 s) is longer than a round (`batchDeadlineMs`, 10 s; a failing subscription's rounds
    end sooner): each round goes on with the window the last one carried, so a subscriber answering 500 to
    everything drops to the slow rate after one window and to probes after the next, instead of taking the full
    rate forever."""
    rounds = deliver_rounds_to_a_failing_subscriber(round_s, tasks, total_s=100.0)
    modes = [mode for mode, _ in rounds]
    assert FlowMode.SLOW in modes[:int(40 / round_s)], modes
    assert modes[-1] is FlowMode.HEARTBEAT and FlowMode.HEARTBEAT in modes[:int(70 / round_s)], modes
    first_window = sum(attempts for _, attempts in rounds[:int(30 / round_s)])
    last_window = sum(attempts for _, attempts in rounds[-int(30 / round_s):])
    assert last_window * 100 < first_window, (first_window, last_window)


def test_inflight_bounds_open_attempts_and_inflight_one_keeps_order():
    rows = [(record(0, o), (0,)) for o in range(20)]
    respond = scripted({("http://sub/a", 3): [500, 500, 200]})
    _, transport, _ = run({0: lane(inflight=4)}, [batch(rows)], respond)
    assert transport.peak_open <= 4
    _, transport, _ = run({0: lane(inflight=1, ordered=True)}, [batch(rows)], respond)
    assert [json.loads(s.request.body)["o"] for s in transport.sent] == [0, 1, 2, 3, 3, 3] + list(range(4, 20))


# -- independence and the end of a round -------------------------------------------------------------------------
def test_a_failing_subscriber_is_parked_and_does_not_hold_the_task():
    rows = [(record(0, o), (0, 1)) for o in range(10)]
    respond = lambda request, attempt: (HttpAnswer(500 if request.url.endswith("/bad") else 200), 0.01)  # noqa: E731
    clock = FakeClock()
    start = clock.now
    report, transport, _ = run({0: lane("http://sub/good"), 1: lane("http://sub/bad")}, [batch(rows)], respond,
                               clock=clock, deadline_s=30, park_after_s=1.0)
    good, bad = lane_report(report, 0), lane_report(report, 1)
    assert good.counters.delivered == 10 and good.stops == {}
    assert clock.now - start < 2.0, "the task ends about park_after after the healthy work, not at the deadline"
    assert bad.counters.parked == 10 and bad.stops == {} and not bad.carried
    parked = {item.record.offset: item.state for item in bad.parked}
    assert set(parked) == set(range(10))
    state = parked[0]
    assert state.attempts >= 2 and state.last_status == 500
    assert state.last_reason == "Message sending failed with status code:500"
    assert state.first_read_ms <= state.due_ms and state.first_read_ms >= 1_800_000_000_000


def test_at_the_deadline_unattempted_messages_stop_the_position_and_retries_are_parked():
    rows = [(record(0, o), (0,)) for o in range(20)]

    def respond(request, attempt):
        offset = json.loads(request.body)["o"]
        return HttpAnswer(500 if offset == 0 else 200), 1.0  # a slow subscriber: 1 s per answer

    report, transport, clock = run({0: lane(inflight=2)}, [batch(rows)], respond, deadline_s=3.5)
    result = lane_report(report)
    delivered = sorted(json.loads(s.request.body)["o"] for s in transport.sent
                       if isinstance(s.result, HttpAnswer) and s.result.status == 200)
    first_unattempted = max(json.loads(s.request.body)["o"] for s in transport.sent) + 1
    assert result.stops == {0: first_unattempted}
    assert [p.record.offset for p in result.parked] == [0], "the retrying message is parked below the stop"
    assert delivered == list(range(1, first_unattempted))
    assert not report.exhausted or report.progress[0] == 20
    assert result.counters.read == first_unattempted


def test_an_ordered_subscription_never_parks_it_stops_at_its_retry_and_carries_its_state():
    rows = [(record(0, o), (0,)) for o in range(6)]
    respond = scripted({("http://sub/a", 2): [500]})
    report, transport, _ = run({0: lane(inflight=1, ordered=True)}, [batch(rows)], respond, park_after_s=1.0)
    result = lane_report(report)
    assert result.stops == {0: 2} and not result.parked
    (carried,) = result.carried
    assert (carried.partition, carried.offset) == (0, 2) and carried.state.attempts >= 2
    assert [json.loads(s.request.body)["o"] for s in transport.sent][:2] == [0, 1]
    assert result.counters.read == 2


def test_an_undecodable_record_past_where_the_position_stops_is_discarded_by_the_round_that_passes_it_only():
    rows = [(record(0, o), (0,)) for o in range(2)] + [(record(0, 2, error="bad bytes"), (0,))]
    respond = scripted({("http://sub/a", 1): [500]})
    report, _, _ = run({0: lane(inflight=1, ordered=True)}, [batch(rows)], respond, park_after_s=1.0)
    result = lane_report(report)
    assert result.stops == {0: 1}, "held at its retry: offset 2 is read again by the next round"
    assert result.discarded == [] and result.counters.discarded == 0, "that round discards it, once"
    report, _, _ = run({0: lane(inflight=1, ordered=True, starts={0: 1})}, [batch(rows[1:])], ok())
    (discarded,) = lane_report(report).discarded
    assert discarded.offset == 2 and discarded.reason == "Message could not be decoded: bad bytes"


def test_a_carried_state_continues_its_attempts_and_ttl():
    clock = FakeClock()
    first_read_ms = clock.wall_ms() - 5_000
    state = RetryState(attempts=3, first_read_ms=first_read_ms, due_ms=clock.wall_ms() + 200, backoff_s=0.1,
                       last_status=500, last_reason="Message sending failed with status code:500")
    respond = scripted({("http://sub/a", 0): [500]})
    retry = retry_policy(message_ttl_s=6.0, backoff_s=0.5)
    report, transport, _ = run({0: lane(retry=retry, resume={(0, 0): state})}, [batch([(record(0, 0), (0,))])],
                               respond, clock=clock)
    assert transport.sent[0].header("Hermes-Retry-Count") == "3"
    assert transport.sent[0].started >= 1000.2 - 1e-9
    (item,) = lane_report(report).discarded
    assert item.ended_by == EndedBy.TTL and item.attempts == len(transport.sent) + 3
    assert lane_report(report).ended_carried == [(0, 0, "DISCARDED")], "the driver ends its HELD state with it"
    report, _, _ = run({0: lane(retry=retry, resume={(0, 0): state})}, [batch([(record(0, 0), (0,)), (record(0, 1),
                                                                                                       (0,))])], ok())
    assert lane_report(report).ended_carried == [(0, 0, "SUCCESS")], "only the carried one, delivered"


def test_a_slow_lane_holding_the_read_ahead_is_cut_and_the_others_go_on():
    rows = [(record(0, o), (0, 1)) for o in range(50)]

    def respond(request, attempt):
        return HttpAnswer(200), (2.0 if request.url.endswith("/slow") else 0.001)

    report, transport, _ = run({0: lane("http://sub/slow", inflight=1), 1: lane("http://sub/fast")},
                               [batch(rows[i:i + 5]) for i in range(0, 50, 5)], respond, deadline_s=60,
                               readahead_rows=10)
    slow, fast = lane_report(report, 0), lane_report(report, 1)
    assert fast.counters.delivered == 50 and fast.stops == {}
    assert slow.cut and 0 in slow.stops and slow.stops[0] < 50
    assert slow.counters.delivered == slow.stops[0]
    assert report.exhausted


def test_a_lane_without_inflight_room_takes_nothing_and_keeps_its_position():
    rows = [(record(0, o), (0, 1)) for o in range(5)]
    report, transport, _ = run({0: lane("http://sub/a", inflight=0), 1: lane("http://sub/b")}, [batch(rows)], ok())
    assert all(s.request.url == "http://sub/b" for s in transport.sent)
    assert lane_report(report, 0).cut and lane_report(report, 0).stops == {}


def test_parked_retries_re_driven_outside_a_position_are_parked_again_when_unfinished():
    clock = FakeClock()
    state = RetryState(attempts=2, first_read_ms=clock.wall_ms(), due_ms=clock.wall_ms(), backoff_s=0.1,
                       last_status=500, last_reason="x")
    rows = [(record(0, o), (0,)) for o in (4, 9)]
    resume = {(0, 4): state, (0, 9): state}
    respond = scripted({("http://sub/a", 4): [500]})
    report, transport, _ = run({0: lane(positional=False, resume=resume)}, [batch(rows)], respond, clock=clock)
    result = lane_report(report)
    assert result.counters.delivered == 1 and [p.record.offset for p in result.parked] == [4]
    assert result.parked[0].state.attempts > 2 and result.stops == {}


def test_the_report_survives_the_trip_through_arrow():
    respond = scripted({("http://sub/a", 1): [400], ("http://sub/a", 2): [500]})
    report, _, _ = run({0: lane(), 3: lane("http://sub/b")}, [batch([(record(0, o), (0, 3)) for o in range(4)])],
                       respond, park_after_s=0.5)
    (back,) = TaskReport.from_table(__import__("pyarrow").Table.from_batches([report.to_arrow()]))
    assert report.lanes[0].flow_state.window.failures > 0, "its open window goes back to the driver too"
    assert back.progress == report.progress and back.exhausted == report.exhausted
    for index in (0, 3):
        original, copy = report.lanes[index], back.lanes[index]
        assert copy.counters == original.counters and copy.stops == original.stops
        assert copy.discarded == original.discarded and copy.parked == original.parked
        assert copy.flow_state == original.flow_state


@pytest.mark.parametrize("lanes", [1, 60])
def test_threads_do_not_grow_with_the_number_of_subscriptions(lanes):
    import threading

    seen = []

    def respond(request, attempt):
        seen.append(threading.active_count())
        return HttpAnswer(200), 0.01

    rows = [(record(0, o), tuple(range(lanes))) for o in range(20)]
    report, _, _ = run({i: lane(f"http://sub/{i}") for i in range(lanes)}, [batch(rows)], respond)
    assert sum(r.counters.delivered for r in report.lanes.values()) == 20 * lanes
    assert max(seen) <= threading.active_count() + 1  # the loop and the input reader, whatever the lanes


def test_a_lane_slowed_to_probes_settles_early_in_the_shared_query_and_the_others_finish():
    rows = [(record(0, o), (0, 1)) for o in range(20)]
    settings = FlowSettings(adjust_interval_s=30, heartbeat_interval_s=60)

    def respond(request, attempt):
        return HttpAnswer(500 if request.url.endswith("/failing") else 200), 0.01

    failing = lane("http://sub/failing", flow_settings=settings, flow_state=FlowState(mode=FlowMode.HEARTBEAT))
    report, transport, clock = run({0: failing, 1: lane("http://sub/ok")}, [batch(rows)], respond, deadline_s=10,
                                   park_after_s=1.0, settle_throttled=True)
    assert lane_report(report, 1).counters.delivered == 20
    assert len(by_url(transport, "http://sub/failing")) == 1, "one probe"
    slow = lane_report(report, 0)
    assert slow.stops == {0: 1} and [p.record.offset for p in slow.parked] == [0]
    assert clock.now - 1000.0 < 2.0, "the round ended long before its 10 s deadline"


def test_tasks_sharing_a_rate_wait_for_their_turn_and_a_long_wait_settles_them_in_the_shared_query():
    """A subscription at 4/s over 4 tasks: slots of 0.25 s from the wall clock's epoch; task i sends in slots i
    modulo 4 (the fake wall clock starts on slot 0). Task 3 waits 0.75 s for its first attempt; each task
    carries the subscription's next slot after its attempt, not its own next permit. In the shared query a wait
    for the rate longer than `park_after_s`, turn included, settles the lane: task 3 with 0.5 s stops at its
    first row, nothing sent (its subscription catches up on its own)."""
    rows = [(record(0, o), (0,)) for o in range(3)]
    sent_at = {}
    for task_index, park_after_s in ((0, 0.5), (3, 0.9), (3, 0.5)):
        report, transport, clock = run({0: lane(rate_per_s=4.0)}, [batch(rows)], ok(), park_after_s=park_after_s,
                                       settle_throttled=True, tasks=4, task_index=task_index)
        sent = sent_at[task_index, park_after_s] = [round(s.started - 1000.0, 3) for s in transport.sent]
        assert lane_report(report).counters.delivered == len(sent)
        assert lane_report(report).stops == {0: len(sent)}, "its rate (1/s a task) settles it after its attempt"
        if sent:
            last_slot_ms = 1_800_000_000_000 + round(sent[-1] * 1000)
            next_permit_ms = clock.wall_ms() + lane_report(report).flow_state.permit_in_ms  # from the report's time
            assert 0 <= next_permit_ms - (last_slot_ms + 250) <= 1  # rounded up
    assert sent_at == {(0, 0.5): [0.0], (3, 0.9): [0.75], (3, 0.5): []}


def test_without_settle_throttled_a_probing_lane_keeps_the_round_open_until_the_deadline():
    rows = [(record(0, o), (0,)) for o in range(3)]
    settings = FlowSettings(adjust_interval_s=30, heartbeat_interval_s=60)
    failing = lane("http://sub/failing", flow_settings=settings, flow_state=FlowState(mode=FlowMode.HEARTBEAT))
    report, transport, clock = run({0: failing}, [batch(rows)], lambda r, a: (HttpAnswer(500), 0.01),
                                   deadline_s=10, park_after_s=1.0)
    assert clock.now - 1000.0 >= 10.0 and len(transport.sent) == 1
    assert lane_report(report, 0).stops == {0: 1}


def test_the_next_permit_crosses_hosts_as_a_duration_so_a_skewed_clock_never_stalls_a_lane():
    """Round 1 on an executor whose wall clock runs 1.5 s ahead of the driver's and of round 2's executor (rate
    2/s: the next permit is 0.5 s after its last attempt). Round 2, in the shared query with parkAfterMs 1 s: its
    first permit is the carried 0.5 s after the plan, whatever the executors' clocks, and its messages go out
    (before, the epoch instant from the fast clock read 2 s away on the other host and the lane settled with
    nothing attempted)."""
    from herald.engine.round.state import SubscriptionState

    ahead = FakeClock(wall_start_ms=1_800_000_001_500)
    report, transport, _ = run({0: lane(rate_per_s=2.0)}, [batch([(record(0, 0), (0,))])], ok(0.001), clock=ahead)
    reported = lane_report(report).flow_state
    assert reported.permit_in_ms == 500

    driver = SubscriptionState(subscription=None)
    driver.take_flow(reported, now_s=0.0, now_ms=1_800_000_000_000)  # the driver's own clock
    planned = driver.flow_now(now_s=0.1, now_ms=1_800_000_000_100)
    assert (planned.permit_in_ms, planned.next_permit_ms) == (400, 0)

    behind = FakeClock(wall_start_ms=1_800_000_000_000)
    rows = [(record(0, o), (0,)) for o in range(1, 3)]
    report, transport, _ = run({0: lane(rate_per_s=2.0, flow_state=planned)}, [batch(rows)], ok(0.001),
                               clock=behind, park_after_s=1.0, settle_throttled=True)
    assert transport.sent and round(transport.sent[0].started - 1000.0, 3) == 0.4
    assert lane_report(report).counters.delivered >= 1
