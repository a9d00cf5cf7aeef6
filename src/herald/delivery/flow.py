"""Flow control: a hard rate cap, and an adaptive controller that matches a struggling subscriber.

`RateCap` spaces a task's attempts 1/rate seconds apart (rate: the task's share). The tasks of a round that share
a subscription's rate of at most 100 a second also take turns (`Turns`): each gives permits only inside slots of
its own, so two tasks never start their first attempts at once and no 1/rate slot of the subscription's holds
two permits (rate: what the round's lanes start at, the adaptive controller's; docs/design.md §4).

`FlowController` sets the rate below that cap, after Hermes' output rate calculator and NSQ's backoff:

- NORMAL: few failures in a window -> the rate converges towards the cap; more than `slowdown_tolerance`
  failures -> the rate falls by the convergence factor; failures outnumbering successes -> SLOW.
- SLOW: the rate is `slow_rate_per_s`; a window of only successes -> NORMAL (converging up from there);
  failures outnumbering successes -> HEARTBEAT.
- HEARTBEAT: one attempt at a time, one per `heartbeat_interval_s` ("test the waters"); a window of only
  successes -> SLOW.

A "failure" is an attempt whose outcome slows the flow (see `outcome.classify`). Results of attempts that
started before the last slow-down are ignored: one result per backoff window, as NSQ asks.
The state survives micro-batches: the driver carries `FlowState` from one batch's tasks to the next, the open
window included (`FlowWindow`): a window (Hermes' 30 s) is longer than a round, so it closes in whichever round
it runs out in.
All durations are seconds (a carried window's: milliseconds), all rates attempts per second.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace


class FlowMode(str, enum.Enum):
    NORMAL = "NORMAL"
    SLOW = "SLOW"
    HEARTBEAT = "HEARTBEAT"

    @property
    def severity(self) -> int:
        return {"NORMAL": 0, "SLOW": 1, "HEARTBEAT": 2}[self.value]


@dataclass(frozen=True)
class FlowSettings:
    """Tuning of the adaptive controller (herald.yaml `rateControl`); the defaults follow Hermes."""

    adjust_interval_s: float = 30.0
    convergence: float = 0.2
    speedup_tolerance: float = 0.01
    slowdown_tolerance: float = 0.05
    slow_rate_per_s: float = 1.0
    heartbeat_interval_s: float = 60.0


@dataclass(frozen=True)
class FlowWindow:
    """The controller's open window, carried from round to round.

    number: how many windows the subscription's controller closed before this one. When the driver merges a
        round's tasks, it tells the tasks that closed the window they were given from those still in it.
    elapsed_ms: how long it has been open, in milliseconds. A duration, never an instant: the tasks carrying it
        run on executors with clocks of their own. Tasks add the time they deliver, the driver the time between
        rounds (on its own clock, `herald.engine.round.state.SubscriptionState.flow_now`).
    successes / failures: the results it counted (a failure: an attempt that slows the flow).
    """

    number: int = 0
    elapsed_ms: int = 0
    successes: int = 0
    failures: int = 0

    @staticmethod
    def merge(task_windows: list[FlowWindow], carried: FlowWindow) -> FlowWindow:
        """The subscription's window after a round whose tasks all started from `carried` (each with its whole
        counts) and reported `task_windows` (not empty). When none closed it, it stays open: the counts the
        tasks added, summed, on top of the carried ones, and the longest task's time. Otherwise the latest
        window any task opened: the counts of the tasks that opened it, summed, and the longest time since; the
        results of tasks still in the old window are dropped, as results from before a slow-down are."""
        latest = max(window.number for window in task_windows)
        current = [window for window in task_windows if window.number == latest]
        elapsed_ms = max(window.elapsed_ms for window in current)
        if latest == carried.number:
            return FlowWindow(latest, elapsed_ms,
                              carried.successes + sum(window.successes - carried.successes for window in current),
                              carried.failures + sum(window.failures - carried.failures for window in current))
        return FlowWindow(latest, elapsed_ms, sum(window.successes for window in current),
                          sum(window.failures for window in current))


@dataclass(frozen=True)
class FlowState:
    """What the controller carries between micro-batches for the whole subscription: its mode, its rate, when
    the hard cap gives the next permit, so the cap also holds across batch boundaries, and its open window.

    The next permit crosses processes as a duration, never as one host's clock reading compared on another's
    (docs/design.md §11): `permit_in_ms`, milliseconds from a round's plan (driver to tasks) or from a task's
    report (tasks to driver); the driver keeps it as `next_permit_ms`, an instant of its own wall clock (epoch ms),
    which only the driver reads (`herald.engine.round.state.SubscriptionState.take_flow` and `flow_now` convert)."""

    mode: FlowMode = FlowMode.NORMAL
    rate_per_s: float | None = None  # None: start at the hard cap
    next_permit_ms: int = 0  # the driver's: epoch ms on its clock (0: none)
    window: FlowWindow = FlowWindow()
    permit_in_ms: int = 0  # across processes: milliseconds until the next permit (0: none)

    def share(self, tasks: int) -> FlowState:
        """This state as seen by one of `tasks` tasks that split the subscription's rate evenly (each sees the
        whole window: `FlowWindow.merge` counts the carried results once)."""
        if self.rate_per_s is None:
            return self
        return replace(self, rate_per_s=self.rate_per_s / tasks)

    def aged(self, elapsed_ms: int) -> FlowState:
        """This state with its open window `elapsed_ms` milliseconds older."""
        return replace(self, window=replace(self.window, elapsed_ms=self.window.elapsed_ms + elapsed_ms))

    @staticmethod
    def combine(task_states: list[FlowState], carried: FlowState) -> FlowState:
        """The subscription's state after a batch whose tasks started from `carried`: the tasks' rates summed,
        the most severe mode kept, the latest next permit, their windows merged (`FlowWindow.merge`)."""
        if not task_states:
            return carried
        mode = max((state.mode for state in task_states), key=lambda mode: mode.severity)
        rates = [state.rate_per_s for state in task_states]
        rate = None if any(value is None for value in rates) else sum(rates)  # type: ignore[arg-type]
        return FlowState(mode, rate, 0, FlowWindow.merge([state.window for state in task_states], carried.window),
                         max(state.permit_in_ms for state in task_states))


MAX_TURNS_RATE_PER_S = 100.0
"""Tasks take turns only at subscription rates up to this (slots of 10 ms or more): a shorter slot is missed by
an ordinary late wake-up, and n requests at once are little against such a rate."""

CARRIED_SNAP_S = 0.002
"""A carried next permit this close before a slot's start is taken as that start: it went through whole
milliseconds (rounded up) and the slots are cut from a whole-millisecond wall clock reading."""


@dataclass(frozen=True)
class Turns:
    """Task `turn` of `tasks` that share a subscription's rate. Time is cut into slots `slot_s` seconds long
    (1 / the subscription's whole rate, as the round's lanes start), numbered from the wall clock's epoch so that
    every task of a round cuts it alike (up to a millisecond, and the executors' clock skew); the task owns the
    slots whose number is `turn` modulo `tasks`.

    origin: where slot `origin_index` starts, on the cap's clock (monotonic seconds). Slots are counted from it,
    so that the arithmetic stays exact to well under a microsecond.
    """

    slot_s: float
    tasks: int
    turn: int
    origin: float
    origin_index: int

    @staticmethod
    def at(slot_s: float, tasks: int, turn: int, now_s: float, now_ms: int) -> Turns:
        """The turns of task `turn`, for a task whose clocks read `now_s` (monotonic s) and `now_ms` (epoch ms)."""
        index = math.floor(now_ms / 1000 / slot_s)
        into_slot_s = now_ms / 1000 - index * slot_s  # in [0, slot_s), up to rounding
        return Turns(slot_s, tasks, turn % tasks, now_s - into_slot_s, index)

    @property
    def cycle_s(self) -> float:
        """Seconds from one of the task's slots to its next."""
        return self.slot_s * self.tasks

    def slot(self, now: float) -> int:
        """The slot holding `now`, counted from `origin`. A moment within a microsecond of a slot's start is in
        that slot: slots start where earlier rounds said the next permit is free, and rounding must not put
        that moment at the end of the slot before."""
        return math.floor((now - self.origin + 1e-6) / self.slot_s)

    def start(self, slot: int) -> float:
        return self.origin + slot * self.slot_s

    def wait(self, now: float, used: int | None = None) -> float:
        """Seconds from `now` until a slot of this task's begins, other than `used`; 0.0 inside one."""
        slot = self.slot(now)
        ahead = (self.turn - self.origin_index - slot) % self.tasks
        if ahead == 0 and slot == used:
            ahead = self.tasks
        if ahead == 0:
            return 0.0
        return max(self.start(slot + ahead) - now, 1e-6)  # rounding never returns 0 early


class RateCap:
    """Paces permits `1 / rate_per_s` seconds apart on average (no bursts), on an injectable clock.

    next_free: the first moment (same clock as `now`) a permit may be given, carried over from earlier rounds.
    turns: when several tasks share the subscription's rate, this task's slots (cut at the rate the round's lanes
    start at): a permit is given inside one only, one per slot. Its schedule then keeps its pace through a wait
    for its turn: the next permit is due an interval after the one before was due (not after it was given), as
    long as that was less than a cycle ago.
    """

    def __init__(self, rate_per_s: float, next_free: float = float("-inf"), turns: Turns | None = None) -> None:
        self._interval_s = 1.0 / rate_per_s
        self._turns = turns
        self._used: int | None = None  # taking turns: the slot of the last permit
        self._carried = next_free
        if turns is not None and math.isfinite(next_free):  # it went through whole ms: snap it to its slot
            next_free = max(next_free, turns.start(turns.slot(next_free + CARRIED_SNAP_S)))
        self._next_free = next_free

    @property
    def next_free(self) -> float:
        """The first moment the spacing allows a permit."""
        return self._next_free

    @property
    def carried(self) -> float:
        """Where later rounds start from (same clock): alone, `next_free`; taking turns, the subscription's next
        permit at this task's rate (the last permit's slot + interval / tasks), so that a later round uses the
        slots this one left; with no permit given, what the cap was given."""
        return self._carried

    def set_rate(self, rate_per_s: float) -> None:
        self._interval_s = 1.0 / rate_per_s

    def wait(self, now: float) -> float:
        """Seconds until a permit may be given (0.0: now): its spacing, then its turn."""
        spacing_s = max(0.0, self._next_free - now)
        if self._turns is None:
            return spacing_s
        return spacing_s + self._turns.wait(now + spacing_s, self._used)

    def try_acquire(self, now: float) -> float:
        """Take a permit and return 0.0, or return the seconds to wait before one is free (nothing taken)."""
        wait_s = self.wait(now)
        if wait_s > 0:
            return wait_s
        turns = self._turns
        if turns is None:
            self._next_free = now + self._interval_s
            self._carried = self._next_free
            return 0.0
        self._next_free = max(self._next_free, now - turns.cycle_s) + self._interval_s
        self._used = turns.slot(now)
        self._carried = turns.start(self._used) + self._interval_s / turns.tasks
        return 0.0


class FlowController:
    """Adaptive sending rate for one task, never above `max_rate_per_s` (the task's share of `rate`).

    It goes on with the window `state` carries (its elapsed part and counts); a window that ran out between
    rounds closes at once, before the task's first attempt."""

    def __init__(self, max_rate_per_s: float, settings: FlowSettings, state: FlowState, now: float) -> None:
        self.max_rate_per_s = max_rate_per_s
        self.settings = settings
        self.mode = state.mode
        initial = state.rate_per_s if state.rate_per_s is not None else max_rate_per_s
        self._rate = min(max(initial, self._floor()), max_rate_per_s)
        window = state.window
        self._window_number = window.number
        self._window_start = now - window.elapsed_ms / 1000
        self._ignore_before = float("-inf")
        self._successes = window.successes
        self._failures = window.failures
        self.adjust(now)

    @property
    def rate_per_s(self) -> float:
        """The rate attempts may be sent at now."""
        if self.mode is FlowMode.HEARTBEAT:
            return 1.0 / self.settings.heartbeat_interval_s
        if self.mode is FlowMode.SLOW:
            return min(self.settings.slow_rate_per_s, self.max_rate_per_s)
        return self._rate

    def concurrency(self, inflight: int) -> int:
        """How many requests may be open at once: one while probing in HEARTBEAT mode."""
        return 1 if self.mode is FlowMode.HEARTBEAT else inflight

    def state(self, now: float, permit_in_ms: int = 0) -> FlowState:
        """What later rounds go on from, at `now` (its open window `now - start` old; the next permit
        `permit_in_ms` milliseconds after `now`)."""
        window = FlowWindow(self._window_number, max(0, round((now - self._window_start) * 1000)), self._successes,
                            self._failures)
        return FlowState(self.mode, self.rate_per_s if self.mode is FlowMode.NORMAL else self._floor(), 0, window,
                         permit_in_ms)

    def record(self, slows: bool, started_at: float) -> None:
        """Count one finished attempt that started at `started_at` (ignored if it began before the last slow-down)."""
        if started_at < self._ignore_before:
            return
        if slows:
            self._failures += 1
        else:
            self._successes += 1

    def adjust(self, now: float) -> bool:
        """Close the window if it is over and move the rate; True when the rate or mode changed."""
        if now - self._window_start < self.settings.adjust_interval_s:
            return False
        successes, failures = self._successes, self._failures
        self._window_start, self._successes, self._failures = now, 0, 0
        self._window_number += 1
        if successes + failures == 0:
            return False
        before = (self.mode, self._rate)
        adjust = {FlowMode.NORMAL: self._adjust_normal, FlowMode.SLOW: self._adjust_slow,
                  FlowMode.HEARTBEAT: self._adjust_heartbeat}[self.mode]
        adjust(successes, failures)
        if (self.mode.severity, -self._rate) > (before[0].severity, -before[1]):
            self._ignore_before = now  # slowed down: earlier attempts' results belong to the old window
        return (self.mode, self._rate) != before

    def _floor(self) -> float:
        return min(self.settings.slow_rate_per_s, self.max_rate_per_s)

    def _adjust_normal(self, successes: int, failures: int) -> None:
        settings = self.settings
        failure_ratio = failures / (successes + failures)
        if failures > successes:
            self.mode = FlowMode.SLOW
            self._rate = self._floor()
        elif failure_ratio > settings.slowdown_tolerance:
            self._rate = max(self._floor(), self._rate * (1 - settings.convergence))
        elif failure_ratio <= settings.speedup_tolerance:
            self._rate = self._rate + (self.max_rate_per_s - self._rate) * settings.convergence
            if self._rate > 0.99 * self.max_rate_per_s:
                self._rate = self.max_rate_per_s

    def _adjust_slow(self, successes: int, failures: int) -> None:
        if failures > successes:
            self.mode = FlowMode.HEARTBEAT
        elif failures == 0:
            self.mode = FlowMode.NORMAL
            self._rate = self._floor()

    def _adjust_heartbeat(self, successes: int, failures: int) -> None:
        if failures == 0:
            self.mode = FlowMode.SLOW
