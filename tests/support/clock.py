"""One fake clock for tests of time-dependent logic: monotonic seconds that move only when told, and the wall
clock (epoch ms) that moves with them."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start_s: float = 1000.0, wall_start_ms: int = 1_800_000_000_000) -> None:
        self.now = start_s
        self._start = start_s
        self._wall_start_ms = wall_start_ms

    def __call__(self) -> float:
        """The monotonic time in seconds (for code that takes a `clock` callable)."""
        return self.now

    def monotonic(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return self._wall_start_ms + int(round((self.now - self._start) * 1000))

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
