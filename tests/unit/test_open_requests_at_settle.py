"""Requests still open when a lane settles get a grace, then are aborted and count as timeouts (issue 32, item 9).

A subscriber that accepts a request and never answers used to hold its lane, and so its task and the round, for
its whole `requestTimeout` (up to 300 s) after the deadline. Now, at the task's deadline, at `stop()` and when a
lane settles on its own (its retries stalled for `parkAfterMs`, its rate, a pin's timeout, a subscription
changed), what is still open gets `TaskPlan.grace_s` (1 s by default) to answer; then the transport aborts it
and the lane takes it as a timeout: its attempt counted, backoff applied, the message parked (unordered) or
carried (ordered), never recorded delivered, never lost. An answer that would have come later never counts.

Fake clock and fake transport: the subscriber's late answer is scripted, 60 s after the request.
"""

from __future__ import annotations

import json

import pytest

from herald.delivery.flow import FlowMode, FlowSettings, FlowState
from herald.delivery.pin import PinPlan
from herald.delivery.transport import HttpAnswer
from tests.support.clock import FakeClock
from tests.support.delivery import batch, by_url, lane, lane_report, record, retry_policy, run

LATE_S = 60.0  # the hanging subscriber's answer (a 200) comes this long after its request
GRACE_S = 1.0  # TaskPlan's default grace
START_S = 1000.0  # FakeClock's start


def hangs(url_part: str = "/hang", first: HttpAnswer | None = None):
    """Requests to URLs containing `url_part` are answered 200 only after `LATE_S` (a first attempt `first`, when
    given, after 10 ms); every other request 200 after 10 ms."""

    def respond(request, attempt):
        if url_part not in request.url:
            return HttpAnswer(200), 0.01
        if first is not None and attempt == 0:
            return first, 0.01
        return HttpAnswer(200), LATE_S

    return respond


def offsets(sent) -> list[int]:
    return [json.loads(s.request.body)["o"] for s in sent]


def test_at_the_deadline_a_request_that_never_answers_is_aborted_after_the_grace_and_its_message_parked():
    rows = [(record(0, o), (0, 1)) for o in range(5)]
    hung = lane("http://sub/hang", inflight=2, request_timeout_s=LATE_S)
    report, transport, clock = run({0: hung, 1: lane("http://sub/ok")}, [batch(rows)], hangs(), deadline_s=3.0)
    assert clock.now - START_S == pytest.approx(3.0 + GRACE_S, abs=0.01), "the task ends at deadline + grace"
    result = lane_report(report, 0)
    assert lane_report(report, 1).counters.delivered == 5, "the healthy lane of the task delivers everything"
    assert offsets(by_url(transport, "http://sub/hang")) == [0, 1]
    assert all(s.aborted == pytest.approx(START_S + 3.0 + GRACE_S) for s in by_url(transport, "http://sub/hang"))
    counters = result.counters
    assert (counters.attempts, counters.timeouts, counters.delivered, counters.parked) == (2, 2, 0, 2), \
        "the late 200s never count"
    assert result.stops == {0: 2}, "the messages never attempted stop the position"
    assert [p.record.offset for p in result.parked] == [0, 1]
    for parked in result.parked:
        state = parked.state
        assert state.attempts == 1 and state.last_reason.startswith("Timeout")
        assert state.due_ms > clock.wall_ms(), "its backoff applies"


def test_an_ordered_subscription_carries_the_aborted_message_with_its_attempt_counted():
    rows = [(record(0, o), (0,)) for o in range(3)]
    hung = lane("http://sub/hang", inflight=1, ordered=True, request_timeout_s=LATE_S)
    report, transport, clock = run({0: hung}, [batch(rows)], hangs(), deadline_s=3.0)
    assert clock.now - START_S == pytest.approx(3.0 + GRACE_S, abs=0.01)
    result = lane_report(report)
    assert result.stops == {0: 0} and not result.parked and result.counters.delivered == 0
    (carried,) = result.carried
    assert (carried.partition, carried.offset) == (0, 0)
    assert carried.state.attempts == 1 and carried.state.last_reason.startswith("Timeout")


def test_stop_aborts_what_is_open_after_the_grace():
    rows = [(record(0, o), (0,)) for o in range(3)]
    clock = FakeClock()
    report, transport, _ = run({0: lane("http://sub/hang", request_timeout_s=LATE_S)}, [batch(rows)], hangs(),
                               clock=clock, deadline_s=30.0, stop=lambda: clock.now >= START_S + 1.5)
    assert clock.now - START_S == pytest.approx(1.5 + GRACE_S, abs=0.06)
    result = lane_report(report)
    assert result.counters.timeouts == 3 and result.counters.delivered == 0
    assert sorted(p.record.offset for p in result.parked) == [0, 1, 2]


def test_a_stalled_lane_settles_after_park_after_and_its_hanging_retry_is_aborted_after_the_grace():
    """Its first attempt answers 500; its retry hangs: nothing but a retry is left, so it settles `parkAfterMs`
    after the 500, and its open retry gets the grace. The retry counted: it is parked with 2 attempts, and its
    next attempt will say Hermes-Retry-Count 2."""
    rows = [(record(0, 0), (0,))]
    retry = retry_policy(message_ttl_s=600, backoff_s=0.1)
    report, transport, clock = run({0: lane("http://sub/hang", retry=retry, request_timeout_s=LATE_S)},
                                   [batch(rows)], hangs(first=HttpAnswer(500)), deadline_s=30.0, park_after_s=1.0)
    assert clock.now - START_S < 1.0 + GRACE_S + 0.3, "park after, then the grace: long before the late answer"
    assert [s.header("Hermes-Retry-Count") for s in transport.sent] == ["0", "1"]
    result = lane_report(report)
    assert (result.counters.codes_5xx, result.counters.timeouts, result.counters.delivered) == (1, 1, 0)
    (parked,) = result.parked
    assert parked.state.attempts == 2 and parked.state.last_reason.startswith("Timeout")


def test_a_throttled_lane_settling_early_aborts_its_hanging_probe_after_the_grace_and_the_round_goes_on():
    rows = [(record(0, o), (0, 1)) for o in range(3)]
    settings = FlowSettings(adjust_interval_s=30, heartbeat_interval_s=60)
    probing = lane("http://sub/hang", flow_settings=settings, flow_state=FlowState(mode=FlowMode.HEARTBEAT),
                   request_timeout_s=LATE_S)
    report, transport, clock = run({0: probing, 1: lane("http://sub/ok")}, [batch(rows)], hangs(), deadline_s=10,
                                   park_after_s=1.0, settle_throttled=True)
    assert clock.now - START_S < 1.0 + GRACE_S + 0.3, "settled at once, aborted after the grace"
    assert lane_report(report, 1).counters.delivered == 3
    result = lane_report(report, 0)
    assert len(by_url(transport, "http://sub/hang")) == 1 and result.counters.timeouts == 1
    assert result.stops == {0: 1} and [p.record.offset for p in result.parked] == [0]


def test_a_lane_whose_pin_times_out_aborts_its_hanging_attempts_after_the_grace():
    """Its pinned endpoint has refused for longer than the pin's timeout: the first refusal in the task settles
    the lane (the driver gives the pin up), and its other attempt, hanging, gets the grace."""
    rows = [(record(0, o), (0,)) for o in range(4)]
    clock = FakeClock()
    pin = PinPlan("pin-1", timeout_ms=500, refused_since_ms=clock.wall_ms() - 10_000)

    def respond(request, attempt):
        return (HttpAnswer(500), 0.01) if json.loads(request.body)["o"] == 0 else (HttpAnswer(200), LATE_S)

    report, transport, _ = run({0: lane(inflight=2, pin=pin, request_timeout_s=LATE_S)}, [batch(rows)], respond,
                               clock=clock, deadline_s=30.0)
    assert clock.now - START_S < GRACE_S + 0.3, "settled at the refusal, the hanging attempt aborted after the grace"
    result = lane_report(report)
    assert (result.counters.codes_5xx, result.counters.timeouts, result.counters.delivered) == (1, 1, 0)
    assert result.stops == {0: 2} and [p.record.offset for p in result.parked] == [0, 1]
    assert result.pin_news is not None


def test_an_attempt_that_answers_within_the_grace_counts_as_answered():
    rows = [(record(0, 0), (0,))]

    def respond(request, attempt):
        return HttpAnswer(200), 2.5  # started at 0, the deadline at 2 s: answered 0.5 s into the grace

    report, transport, clock = run({0: lane(request_timeout_s=LATE_S)}, [batch(rows)], respond, deadline_s=2.0)
    result = lane_report(report)
    assert result.counters.delivered == 1 and result.counters.timeouts == 0 and not result.parked
    assert transport.sent[0].aborted is None
    assert clock.now - START_S == pytest.approx(2.5, abs=0.01)


def test_the_aborted_attempt_is_a_timeout_failure():
    rows = [(record(0, 0), (0,))]
    report, _, _ = run({0: lane("http://sub/hang", request_timeout_s=LATE_S, retry=retry_policy(
        message_ttl_s=600, backoff_s=0.1, max_attempts=1))}, [batch(rows)], hangs(), deadline_s=2.0)
    (discarded,) = lane_report(report).discarded
    assert discarded.reason.startswith("Timeout") and discarded.attempts == 1, \
        "its last attempt counted: maxAttempts ends it as for any timeout"
