"""One lane on its own (herald.delivery.lane), driven by hand as the task's loop drives it: rows taken and
admitted, attempts started (`dispatch` hands each request to `start`), answers given (`answer`), and the end
(`settle`). No loop, no transport; times are `Instant`s (monotonic s, epoch ms) the test moves."""

from __future__ import annotations

import random

from herald.delivery.clock import Instant
from herald.delivery.lane import Lane
from herald.delivery.policy import EndedBy
from herald.delivery.transport import HttpAnswer
from tests.support.delivery import lane, record, retry_policy


def at(seconds: float) -> Instant:
    return Instant(seconds, 1_800_000_000_000 + round(seconds * 1000))


class Attempts:
    """What `dispatch` started: (request, token) pairs, answered by `answer`."""

    def __init__(self, lane_under_test: Lane) -> None:
        self.lane = lane_under_test
        self.open: list[tuple] = []

    def start(self, request, token) -> None:
        self.open.append((request, token))

    def dispatch(self, now: Instant, room: int = 100) -> tuple[float | None, int]:
        return self.lane.dispatch(now, room, self.start)

    def answer(self, status: int, now: Instant, retry_after: str | None = None) -> None:
        """Answer the oldest open attempt."""
        _, (owner, unit, started_at) = self.open.pop(0)
        owner.answer(unit, started_at, HttpAnswer(status, retry_after), now)


def lane_with(rows: int, **plan) -> tuple[Lane, Attempts]:
    subject = Lane(0, lane(**plan), at(0), random.Random(7))
    for offset in range(rows):
        assert subject.take(record(0, offset), at(0))
    return subject, Attempts(subject)


def header(request, name: str) -> str:
    return next(line.split(": ", 1)[1] for line in request.header_lines if line.startswith(name + ":"))


def test_a_lane_admits_within_its_inflight_share_and_admits_more_as_messages_end():
    subject, attempts = lane_with(4, inflight=2)
    assert [r.offset for r in subject.admit(at(0))] == [0, 1]
    attempts.dispatch(at(0))
    attempts.dispatch(at(0.01))  # the rate cap spaces the two
    assert attempts.dispatch(at(0.02)) == (None, 0), "nothing more can start until an answer comes"
    assert len(attempts.open) == 2
    attempts.answer(200, at(0.1))
    assert subject.counters.delivered == 1
    assert [r.offset for r in subject.admit(at(0.1))] == [2]
    assert attempts.dispatch(at(0.1))[1] == 1


def test_a_failed_attempt_waits_for_its_backoff_and_its_retry_says_so():
    subject, attempts = lane_with(1, retry=retry_policy(message_ttl_s=60, backoff_s=1.0))
    subject.admit(at(0))
    attempts.dispatch(at(0))
    first = attempts.open[0][0]
    assert header(first, "Hermes-Retry-Count") == "0"
    attempts.answer(503, at(0.2))
    wake_at, started = attempts.dispatch(at(0.2))
    assert started == 0 and wake_at is not None and wake_at > 0.2, "not before its backoff"
    assert attempts.dispatch(at(wake_at))[1] == 1
    retry = attempts.open[0][0]
    assert header(retry, "Hermes-Retry-Count") == "1"
    assert retry.body == first.body and header(retry, "Hermes-Message-Id") == header(first, "Hermes-Message-Id")


def test_retry_after_sets_the_retrys_due_time():
    subject, attempts = lane_with(1, retry=retry_policy(message_ttl_s=60, backoff_s=0.1))
    subject.admit(at(0))
    attempts.dispatch(at(0))
    attempts.answer(503, at(0.1), retry_after="5")
    wake_at, started = attempts.dispatch(at(1.0))
    assert started == 0 and wake_at is not None and wake_at >= 5.1


def test_a_client_error_is_discarded_with_its_status_and_reason():
    subject, attempts = lane_with(1)
    subject.admit(at(0))
    attempts.dispatch(at(0))
    attempts.answer(400, at(0.1))
    (discarded,) = subject.report.discarded
    assert (discarded.offset, discarded.http_status, discarded.ended_by) == (0, 400, EndedBy.STATUS)
    assert discarded.attempts == 1 and subject.counters.delivered == 0 and subject.finished


def test_a_retry_that_cannot_start_within_the_ttl_is_discarded():
    subject, attempts = lane_with(1, retry=retry_policy(message_ttl_s=2, backoff_s=0.5))
    subject.admit(at(0))
    attempts.dispatch(at(0))
    attempts.answer(500, at(1.9))  # its backoff ends past the TTL (2 s from the first read)
    assert attempts.dispatch(at(1.9)) == (None, 0)
    (discarded,) = subject.report.discarded
    assert discarded.ended_by == EndedBy.TTL and discarded.http_status == 500


def test_settling_stops_the_position_at_the_first_message_never_attempted_and_parks_an_unordered_retry():
    subject, attempts = lane_with(3, inflight=1)
    subject.admit(at(0))
    attempts.dispatch(at(0))
    attempts.answer(503, at(0.1))
    subject.settle(at(0.2), {0: 3}, input_done=True)
    assert subject.report.stops == {0: 1}, "offsets 1 and 2 were never attempted"
    assert [item.record.offset for item in subject.report.parked] == [0]
    assert subject.report.parked[0].state.attempts == 1 and subject.counters.parked == 1
    assert subject.report.carried == []


def test_settling_an_ordered_lane_carries_its_retry_and_stops_there():
    subject, attempts = lane_with(3, inflight=1, ordered=True)
    subject.admit(at(0))
    attempts.dispatch(at(0))
    attempts.answer(503, at(0.1))
    subject.settle(at(0.2), {0: 3}, input_done=True)
    assert subject.report.stops == {0: 0}, "an ordered subscription never passes its retry"
    assert [(item.offset, item.state.attempts) for item in subject.report.carried] == [(0, 1)]
    assert subject.report.parked == []


def test_a_row_below_the_rounds_start_is_not_taken():
    subject = Lane(0, lane(starts={0: 5}), at(0), random.Random(7))
    assert not subject.take(record(0, 4), at(0))
    assert subject.take(record(0, 5), at(0))
    assert subject.counters.matched == 1
