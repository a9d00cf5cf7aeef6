"""The hard rate cap and the adaptive controller, on a fake clock."""

import math
from dataclasses import replace

import pytest

from herald.delivery.flow import FlowController, FlowMode, FlowSettings, FlowState, FlowWindow, RateCap, Turns

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


EPOCH_MS = 1_795_000_000_123  # a wall-clock moment the simulated rounds start at


def share_the_rate(rate: float, tasks: int, seconds: float, ready_at_s: float = 0.0, taking_turns: bool = True,
                   step_ms: int = 1, rounds: int = 1, task_rate: float | None = None) -> list[float]:
    """Every permit `tasks` tasks take when they split `rate` (each at `task_rate`, its share by default) and
    always have an attempt ready from `ready_at_s`: the permits' moments, seconds after the first round's start.
    `rounds` rounds of `seconds` each follow one another; each starts from the latest moment its tasks carried, as
    the driver combines them (in whole epoch ms, rounded up). Each task has its own monotonic clock (offset from
    the others', as on separate executors) and cuts the slots from the wall clock, as `Lane` does."""
    permits, carried_wall_s, step = [], float("-inf"), 0
    for _ in range(rounds):
        caps = []
        for task in range(tasks):
            offset_s = 1000.0 * task + 0.37 * task  # monotonic = wall - offset
            now_ms = EPOCH_MS + step * step_ms
            whole_rate = (task_rate or rate / tasks) * tasks  # as `Lane`: the slots at the rate the lanes start at
            turns = Turns.at(1.0 / whole_rate, tasks, task, now_ms / 1000 - offset_s, now_ms) if taking_turns else None
            caps.append((RateCap(task_rate or rate / tasks, carried_wall_s - offset_s, turns), offset_s))
        for _ in range(int(seconds * 1000 / step_ms)):
            wall_ms = EPOCH_MS + step * step_ms
            step += 1
            if wall_ms - EPOCH_MS < ready_at_s * 1000:
                continue
            for cap, offset_s in caps:
                if cap.try_acquire(wall_ms / 1000 - offset_s) == 0.0:
                    permits.append((wall_ms - EPOCH_MS) / 1000)
        carried_wall_s = math.ceil(max(cap.carried + offset_s for cap, offset_s in caps) * 1000) / 1000  # epoch ms
    return sorted(permits)


def most_in_a_second(permits: list[float]) -> int:
    """The most permits any window [t, t + 1 s) holds."""
    return max(sum(1 for other in permits if start <= other < start + 1.0 - 1e-9) for start in permits)


def slots_used_twice(permits: list[float], rate: float) -> int:
    """Pairs of permits in one 1/rate slot of the subscription's. A permit on a slot's very boundary counts in
    either slot (the tasks' rounding decides which)."""
    def slot(at: float, rounding: float) -> int:
        return math.floor((EPOCH_MS / 1000 + at) * rate + rounding)

    ordered = sorted(permits)
    return sum(1 for a, b in zip(ordered, ordered[1:])
               if slot(a, 1e-3) == slot(b, 1e-3) and slot(a, -1e-3) == slot(b, -1e-3))


def test_tasks_sharing_a_rate_take_turns_instead_of_starting_together():
    permits = share_the_rate(10, tasks=16, seconds=5)
    assert sum(1 for at in permits if at == permits[0]) == 1  # one task first, not all 16 at once
    assert most_in_a_second(permits) <= 11 and slots_used_twice(permits, 10) == 0
    assert len(permits) >= 10 * 5 - 1  # the whole rate is used
    untaken = share_the_rate(10, tasks=16, seconds=5, taking_turns=False)  # what each task's own cap allows
    assert sum(1 for at in untaken if at == 0.0) == 16 and most_in_a_second(untaken) == 16


def test_turns_hold_when_every_task_becomes_ready_at_the_same_moment():
    """Tasks that had nothing to send (their rows not read yet, their inflight full) and then all have something
    at once still go one slot after another."""
    permits = share_the_rate(8, tasks=4, seconds=4, ready_at_s=0.5)
    assert permits[0] >= 0.5 and sum(1 for at in permits if at < 0.5 + 1 / 8) <= 2
    assert slots_used_twice(permits, 8) == 0 and most_in_a_second(permits) <= 9
    assert sum(1 for at in share_the_rate(8, tasks=4, seconds=4, ready_at_s=0.5, taking_turns=False)
               if at == 0.5) == 4


def test_a_rate_that_does_not_divide_evenly_stays_within_one_of_it():
    assert most_in_a_second(share_the_rate(10, tasks=3, seconds=4)) <= 11
    assert most_in_a_second(share_the_rate(10, tasks=3, seconds=4, taking_turns=False)) == 12


def test_rounds_one_after_another_go_on_from_the_slot_the_last_one_left():
    """Each round carries the subscription's next slot: short rounds keep the whole rate, and no slot is used
    twice across a round boundary."""
    permits = share_the_rate(10, tasks=16, seconds=2, rounds=5)
    assert slots_used_twice(permits, 10) == 0 and most_in_a_second(permits) <= 11
    assert len(permits) >= 10 * 10 - 2


def test_slowed_tasks_keep_their_rate_across_rounds_too():
    """A round's first permits are spaced at the lanes' own rate, not at the turns' (the full rate): short rounds
    of a slowed subscription do not each open with a burst."""
    half = share_the_rate(10, tasks=16, seconds=1, rounds=20, task_rate=0.5 * 10 / 16)  # 0.5 of the rate
    assert len(half) <= 0.5 * 10 * 20 + 2, f"{len(half)} permits in 20 s at 5/s"
    assert len(half) >= 0.5 * 10 * 20 - 3
    probes = share_the_rate(10, tasks=8, seconds=10, rounds=60, task_rate=1 / (60 * 8), step_ms=10)
    assert len(probes) <= 600 / 60 + 1, f"{len(probes)} heartbeat probes in 600 s, one a minute allowed"


def test_slots_are_never_reused_across_rounds_when_a_slot_is_not_whole_milliseconds():
    permits = share_the_rate(7, tasks=3, seconds=1, rounds=50)
    assert slots_used_twice(permits, 7) == 0 and most_in_a_second(permits) <= 8


def test_a_task_slowed_in_the_round_keeps_its_own_rate_while_taking_turns():
    """The slots are cut at the rate the round starts at; when the adaptive controller slows a task in the round,
    its rate holds on average: a wait for its turn does not shift its schedule, and it never snaps to a whole
    number of cycles."""
    for tasks, slowed_to in ((4, 2.0), (2, 4.0), (4, 2.4)):  # shares of 10/s: 2.5 and 5
        caps = [RateCap(10 / tasks, turns=Turns.at(0.1, tasks, turn, 0.0, EPOCH_MS)) for turn in range(tasks)]
        for cap in caps:
            cap.set_rate(slowed_to)
        permits = [step / 1000 for step in range(30_000) for cap in caps if cap.try_acquire(step / 1000) == 0.0]
        assert abs(len(permits) - tasks * slowed_to * 30) <= tasks, (tasks, slowed_to, len(permits))
        assert slots_used_twice(permits, 10) == 0


def test_a_task_waiting_for_its_turn_takes_nothing_and_moves_no_carried_permit():
    turns = Turns.at(0.1, tasks=4, turn=3, now_s=50.0, now_ms=1_000_000)  # slot 10,000 starts now: turn 0's
    cap = RateCap(2.5, next_free=49.0, turns=turns)
    assert cap.wait(50.0) == pytest.approx(0.3)
    assert cap.try_acquire(50.0) == pytest.approx(0.3) and cap.carried == 49.0 and cap.next_free == 49.0
    assert cap.try_acquire(50.31) == 0.0
    assert cap.carried == pytest.approx(50.4)  # the subscription's next slot
    assert cap.try_acquire(50.35) == pytest.approx(0.35)  # never two in one slot: its next turn is at 50.7
    assert cap.try_acquire(50.7) == 0.0


def test_every_task_cuts_the_same_slots_whatever_its_monotonic_clock():
    a = Turns.at(0.25, tasks=2, turn=0, now_s=10.0, now_ms=1_795_000_000_100)
    b = Turns.at(0.25, tasks=2, turn=1, now_s=987.6, now_ms=1_795_000_000_100)
    assert a.wait(10.0) == 0.0 and b.wait(987.6) == pytest.approx(0.15)
    assert a.wait(10.16) == pytest.approx(0.24) and b.wait(987.76) == 0.0


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


DEFAULTS = FlowSettings()  # Hermes' 30 s window


def test_a_window_longer_than_a_round_goes_on_in_the_next_round():
    """A round ends before the window: the state it carries says how long the window has been open and what it
    counted; the next round's controller goes on from there and closes it when the 30 s are over."""
    first = FlowController(100, DEFAULTS, FlowState(), now=50.0)
    for _ in range(9):
        first.record(True, started_at=51.0)
    first.record(False, started_at=51.0)
    assert first.adjust(60.0) is False
    carried = first.state(now=60.0)
    assert carried.window == FlowWindow(number=0, elapsed_ms=10_000, successes=1, failures=9)
    second = FlowController(100, DEFAULTS, carried, now=7_000.0)  # another executor: a clock of its own
    assert second.adjust(7_019.9) is False and second.mode is FlowMode.NORMAL
    assert second.adjust(7_020.0) is True and second.mode is FlowMode.SLOW
    assert second.state(now=7_021.0).window == FlowWindow(number=1, elapsed_ms=1000)


def test_a_window_that_ran_out_between_rounds_closes_before_the_first_attempt():
    carried = FlowState(window=FlowWindow(number=4, elapsed_ms=31_000, successes=0, failures=3))
    controller = FlowController(100, DEFAULTS, carried, now=0.0)
    assert controller.mode is FlowMode.SLOW and controller.rate_per_s == 1.0
    assert controller.state(now=0.0).window == FlowWindow(number=5)


def test_the_tasks_windows_merge_into_one_whatever_their_order():
    """Every task starts from the whole carried window: the driver counts the carried results once, adds what
    each task counted, and keeps the longest task's time. A task that closed the window wins over those still in
    it (their results belong to the window it closed)."""
    carried = FlowWindow(number=2, elapsed_ms=12_000, successes=5, failures=1)
    open_windows = [FlowWindow(2, 14_000, 8, 1), FlowWindow(2, 13_500, 5, 4)]
    assert FlowWindow.merge(open_windows, carried) == FlowWindow(2, 14_000, 8, 4)
    assert FlowWindow.merge(open_windows[::-1], carried) == FlowWindow(2, 14_000, 8, 4)
    closed = [FlowWindow(2, 29_900, 9, 9), FlowWindow(3, 400, 0, 2), FlowWindow(3, 300, 1, 1)]
    assert FlowWindow.merge(closed, carried) == FlowWindow(3, 400, 1, 3)
    assert FlowWindow.merge(closed[::-1], carried) == FlowWindow(3, 400, 1, 3)
    state = FlowState(window=carried)
    assert state.share(4).window == carried and FlowState(rate_per_s=8.0, window=carried).share(4).window == carried
    assert FlowState.combine([FlowState(window=w) for w in closed], state).window == FlowWindow(3, 400, 1, 3)


def test_the_driver_counts_the_time_between_rounds_in_the_window():
    """The driver ages the carried window by its own clock (monotonic seconds) between rounds, and measures a
    round no task closed the window in itself: the time Spark takes to start and end the tasks counts too."""
    from herald.engine.round.state import SubscriptionState

    state = SubscriptionState(subscription=None)  # type: ignore[arg-type]
    assert state.flow_now(100.0) == FlowState(), "no round yet: the window starts with the first round"
    state.take_flow(FlowState(window=FlowWindow(0, 8_000, 2, 3)), now_s=100.0)  # the tasks' measure
    assert state.flow.window == FlowWindow(0, 8_000, 2, 3)
    planned = state.flow_now(101.5)  # 1.5 s between the rounds
    assert planned.window == FlowWindow(0, 9_500, 2, 3)
    state.take_flow(replace(planned, window=FlowWindow(0, 17_500, 2, 9)), now_s=110.0)  # tasks ran 8 of 8.5 s
    assert state.flow.window == FlowWindow(0, 18_000, 2, 9), "the driver's 10 s since the last round"
    state.take_flow(FlowState(FlowMode.SLOW, 1.0, window=FlowWindow(1, 2_000)), now_s=125.0)  # a task closed it
    assert state.flow.window == FlowWindow(1, 2_000) and state.flow_now(126.0).window.elapsed_ms == 3_000


def test_a_round_that_closed_no_window_does_not_undo_a_slow_down_handed_over_meanwhile():
    """The retry driver's controller saw the subscriber fail and handed SLOW over while a stream round planned at
    NORMAL was still running (CI: the subscriber kept ~100 requests a second after the job had reported SLOW).
    That round closed no window, so the mode and rate it ends with are only the ones it was planned with: the
    state keeps SLOW and takes the round's counts. A round that closed a window decides the mode afresh."""
    from herald.engine.round.state import SubscriptionState

    state = SubscriptionState(subscription=None)  # type: ignore[arg-type]
    state.take_flow(FlowState(window=FlowWindow(2, 5_000, 1, 4)), now_s=100.0)
    planned = state.flow_now(100.0)
    state.flow = replace(state.flow, mode=FlowMode.SLOW, rate_per_s=1.0)  # the retry driver's hand-back
    state.take_flow(replace(planned, window=FlowWindow(2, 9_000, 1, 20)), now_s=104.0)
    assert (state.flow.mode, state.flow.rate_per_s, state.flow.window.failures) == (FlowMode.SLOW, 1.0, 20)

    state.take_flow(FlowState(FlowMode.NORMAL, 1.0, window=FlowWindow(3, 1_000)), now_s=140.0)  # it recovered
    assert state.flow.mode is FlowMode.NORMAL
