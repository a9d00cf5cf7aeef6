"""A fake clock and a transport that answers on it: the delivery loop's timing tests run without real waiting.

    clock = FakeClock()
    transport = FakeTransport(clock, lambda request, attempt: (HttpAnswer(200), 0.01))
    TaskSender(plan, transport, clock=clock.monotonic, wall_clock_ms=clock.wall_ms, sleep=clock.sleep)

`respond(request, attempt)` returns (HttpAnswer or TransportFailure, latency in seconds); `attempt` is the
0-based attempt of that message id (or batch id). Every request is recorded with the fake time it started and ended
(the time its answer would have come), and, when the loop aborted it, when (`aborted`): its answer then never
comes out of `poll`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass

from herald.delivery.transport import HttpAnswer, HttpRequest, Transport
from tests.support.clock import FakeClock


@dataclass
class Sent:
    request: HttpRequest
    started: float
    ended: float
    result: object
    aborted: float | None = None

    def header(self, name: str) -> str | None:
        for line in self.request.header_lines:
            key, _, value = line.partition(": ")
            if key == name:
                return value
        return None

    @property
    def message_id(self) -> str | None:
        return self.header("Hermes-Message-Id")

    @property
    def batch_id(self) -> str | None:
        return self.header("Hermes-Batch-Id")


class FakeTransport(Transport):
    def __init__(self, clock: FakeClock, respond, max_open: int = 64) -> None:
        self.clock = clock
        self.respond = respond
        self.max_open = max_open
        self.sent: list[Sent] = []
        self.peak_open = 0
        self._finishing: list = []  # heap (end, seq, token, sent)
        self._sequence = itertools.count()
        self._attempts: dict[str, int] = defaultdict(int)
        self.closed = False

    def start(self, request: HttpRequest, token) -> None:
        assert len(self._finishing) < self.max_open, "more attempts open than max_open"
        unsent = Sent(request, 0, 0, None)
        key = f"{request.url}|{unsent.message_id or unsent.batch_id}"
        result, latency_s = self.respond(request, self._attempts[key])
        self._attempts[key] += 1
        sent = Sent(request, self.clock.now, self.clock.now + latency_s, result)
        self.sent.append(sent)
        heapq.heappush(self._finishing, (sent.ended, next(self._sequence), token, sent))
        self.peak_open = max(self.peak_open, len(self._finishing))

    def poll(self, timeout_s: float):
        if not self._finishing:
            return []
        first = self._finishing[0][0]
        if first > self.clock.now:
            self.clock.now = min(first, self.clock.now + timeout_s)
        done = []
        while self._finishing and self._finishing[0][0] <= self.clock.now:
            _, _, token, sent = heapq.heappop(self._finishing)
            done.append((token, sent.result))
        return done

    def abort(self, token):
        from herald.delivery.transport import aborted_failure

        for at, entry in enumerate(self._finishing):
            if entry[2] == token:
                sent = entry[3]
                del self._finishing[at]
                heapq.heapify(self._finishing)
                sent.aborted = self.clock.now
                return aborted_failure(self.clock.now - sent.started)
        return None

    @property
    def open(self) -> int:
        return len(self._finishing)

    def close(self) -> None:
        self.closed = True
        self._finishing.clear()


def ok(latency_s: float = 0.01):
    return lambda request, attempt: (HttpAnswer(200), latency_s)
