"""The delivery loop's one clock value: an `Instant`, both of the task's clocks read together.

The loop (`herald.delivery.sender`) reads its injectable monotonic clock (seconds) and its wall clock (epoch
milliseconds) once per turn, and once per answer, into an `Instant`, and hands that one value to its lanes
and their assemblies. Inside the loop every time kept or compared is monotonic seconds (due times, first
reads, deadlines, rate permits, batch windows); epoch milliseconds appear only at the edges: the rows a task
reports, the retry states it carries or parks (`herald.delivery.message.RetryState`), a Retry-After date and a
signature's timestamp. `to_ms` and `from_ms` move a moment across that edge, relative to this reading.
"""

from __future__ import annotations

import time


class Instant:
    """One reading of the task's clocks. `s`: monotonic seconds (the loop's injected `clock`); `ms`: the same
    moment on the wall clock, epoch milliseconds (int). A value: nothing changes it once built, nothing keeps
    it (units keep `s`). Slotted rather than a frozen dataclass: the loop builds about two per message."""

    __slots__ = ("s", "ms")

    def __init__(self, s: float, ms: int) -> None:
        self.s = s
        self.ms = ms

    def to_ms(self, at: float) -> int:
        """The moment `at` (monotonic seconds) on the wall clock (epoch ms, rounded to the millisecond)."""
        return self.ms + round((at - self.s) * 1000)

    def from_ms(self, at_ms: int) -> float:
        """The moment `at_ms` (epoch ms) on the monotonic clock (seconds)."""
        return self.s + (at_ms - self.ms) / 1000

    def __repr__(self) -> str:
        return f"Instant(s={self.s!r}, ms={self.ms!r})"


def wall_clock_ms() -> int:
    """The wall clock in whole epoch milliseconds (the loop's default `wall_clock_ms`)."""
    return int(time.time() * 1000)
