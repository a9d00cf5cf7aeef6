"""A lane's watch on its pinned endpoint (priority `pinned`; the pin itself is the driver's,
`herald.engine.endpoints.pin_group`).

A pinned subscription's lane has one target, the pinned endpoint, and every attempt carries `Herald-Pin-Id`.
The watch notes the last 2xx and since when every answer was a refusal (anything but 2xx: an error status, a
timeout, a connection failure), continuing the driver's streak from earlier rounds. Once the endpoint has refused
for `timeout_ms`, the lane starts no more attempts (its open ones finish; the unfinished are carried or parked as
at a deadline), and the round's report tells the driver, which gives the pin up. Times are epoch ms.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PinPlan:
    """pin_id: the Herald-Pin-Id; timeout_ms: how long the endpoint may refuse while it has messages;
    refused_since_ms: since when it has refused, from earlier rounds (None: it accepts)."""

    pin_id: str
    timeout_ms: int
    refused_since_ms: int | None

    @property
    def header_line(self) -> str:
        return f"Herald-Pin-Id: {self.pin_id}"


class PinWatch:
    def __init__(self, plan: PinPlan) -> None:
        self.timeout_ms = plan.timeout_ms
        self.refused_since_ms = plan.refused_since_ms
        self.accepted_ms: int | None = None
        self.answered = False
        self._refused_here = False  # a refusal answered in this task (the streak alone may be the driver's)

    def answer(self, accepted: bool, now_ms: int) -> bool:
        """An attempt at the pinned endpoint was answered at `now_ms`: 2xx (`accepted`) or not. True when the
        pin has expired with it (the lane then starts no more attempts)."""
        self.answered = True
        if accepted:
            self.accepted_ms = now_ms
            self.refused_since_ms = None
        else:
            self._refused_here = True
            if self.refused_since_ms is None:
                self.refused_since_ms = now_ms
        return self.expired(now_ms)

    def expired(self, now_ms: int) -> bool:
        """The endpoint has refused everything for `timeout_ms`, and refused in this task too (a lane tries
        the pinned endpoint before it gives it up, whatever the streak it inherits): the pin is lost."""
        return (self._refused_here and self.refused_since_ms is not None
                and now_ms - self.refused_since_ms >= self.timeout_ms)

    def news(self) -> tuple[int | None, int | None] | None:
        """(last 2xx, refused since) for the driver, or None when nothing was answered in the task."""
        return (self.accepted_ms, self.refused_since_ms) if self.answered else None
