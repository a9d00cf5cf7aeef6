"""The hard rate cap and the adaptive controller, on a fake clock."""

import pytest

from herald.delivery.flow import FlowController, FlowMode, FlowSettings, FlowState, RateCap

SETTINGS = FlowSettings(adjust_interval_s=1.0, slow_rate_per_s=1.0, heartbeat_interval_s=10.0)


def permits_in_first_second(rate: float, step_s: float = 0.001) -> int:
    cap, now, taken = RateCap(rate), 0.0, 0
    while now < 1.0:
        if cap.try_acquire(now) == 0.0:
            taken += 1
        now += step_s
    return taken


def test_rate_cap_never_exceeds_rate_in_a_second():
    assert permits_in_first_second(10) == 10
    assert permits_in_first_second(250) == 250


def test_rate_cap_reports_the_wait_without_taking_a_permit():
    cap = RateCap(4)
    assert cap.try_acquire(0.0) == 0.0
    assert cap.try_acquire(0.1) == pytest.approx(0.15)
    assert cap.try_acquire(0.25) == 0.0


def run_window(controller: FlowController, start: float, successes: int, failures: int) -> float:
    for _ in range(successes):
        controller.record(False, start)
    for _ in range(failures):
        controller.record(True, start)
    controller.adjust(start + 1.0)
    return start + 1.0


def test_starts_at_the_cap_and_stays_there_when_healthy():
    controller = FlowController(100, SETTINGS, FlowState(), now=0)
    run_window(controller, 0, successes=50, failures=0)
    assert controller.mode is FlowMode.NORMAL and controller.rate_per_s == 100


def test_some_failures_slow_down_gradually_then_recover():
    controller = FlowController(100, SETTINGS, FlowState(), now=0)
    now = run_window(controller, 0, successes=90, failures=10)
    assert controller.rate_per_s == 80
    now = run_window(controller, now, successes=90, failures=10)
    assert controller.rate_per_s == 64
    for _ in range(30):
        now = run_window(controller, now, successes=100, failures=0)
    assert controller.rate_per_s == 100


def test_majority_failures_go_slow_then_heartbeat_and_probe_one_at_a_time():
    controller = FlowController(100, SETTINGS, FlowState(), now=0)
    now = run_window(controller, 0, successes=1, failures=9)
    assert controller.mode is FlowMode.SLOW and controller.rate_per_s == 1.0
    now = run_window(controller, now, successes=0, failures=1)
    assert controller.mode is FlowMode.HEARTBEAT
    assert controller.rate_per_s == 0.1 and controller.concurrency(50) == 1
    now = run_window(controller, now, successes=1, failures=0)
    assert controller.mode is FlowMode.SLOW
    run_window(controller, now, successes=1, failures=0)
    assert controller.mode is FlowMode.NORMAL and controller.concurrency(50) == 50


def test_results_of_attempts_started_before_a_slow_down_are_ignored():
    controller = FlowController(100, SETTINGS, FlowState(), now=0)
    run_window(controller, 0, successes=1, failures=9)  # -> SLOW at t=1
    for _ in range(5):
        controller.record(True, started_at=0.5)  # old attempts answering late
    controller.record(False, started_at=1.5)
    controller.adjust(2.0)
    assert controller.mode is FlowMode.NORMAL  # only the new success counted


def test_empty_window_changes_nothing():
    controller = FlowController(100, SETTINGS, FlowState(FlowMode.SLOW, 1.0), now=0)
    assert controller.adjust(5.0) is False and controller.mode is FlowMode.SLOW


def test_state_is_carried_and_split_across_tasks():
    state = FlowState(FlowMode.NORMAL, 60.0)
    assert state.share(3) == FlowState(FlowMode.NORMAL, 20.0)
    controller = FlowController(50, SETTINGS, state.share(3), now=0)
    assert controller.rate_per_s == 20.0  # starts where the last batch left it, not at the cap
    combined = FlowState.combine([FlowState(FlowMode.NORMAL, 20.0), FlowState(FlowMode.SLOW, 0.5)], FlowState())
    assert combined == FlowState(FlowMode.SLOW, 20.5)
    assert FlowState.combine([], state) == state
