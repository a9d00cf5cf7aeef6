"""BROADCAST in the task's loop (fake clock and transport): every message to every endpoint, each endpoint
with its own attempts, backoff and Retry-After; one undelivered row per endpoint that did not get it; a
message's unfinished endpoints parked and continued with their own progress."""

from __future__ import annotations

import json

import pyarrow as pa

from herald.delivery.plan import Target
from herald.delivery.report import TaskReport
from herald.delivery.transport import HttpAnswer
from tests.support.delivery import batch, lane, lane_report, record, retry_policy, run
from tests.support.fake_transport import FakeClock

A, B = Target("http://a/", shown="http://a/"), Target("http://b/", shown="http://u:*****@b/")


def header(sent, name: str) -> str:
    return dict(line.split(": ", 1) for line in sent.request.header_lines)[name]


def per_url(script: dict[str, list]):
    """Answers per endpoint by the Hermes-Retry-Count of the attempt (the last repeats); 10 ms each."""

    def respond(request, attempt):
        replies = script.get(request.url, [200])
        reply = replies[min(int(header_of(request, "Hermes-Retry-Count")), len(replies) - 1)]
        return (reply if isinstance(reply, HttpAnswer) else HttpAnswer(reply)), 0.01

    return respond


def header_of(request, name: str) -> str:
    return dict(line.split(": ", 1) for line in request.header_lines)[name]


def test_one_endpoint_200_and_one_500_500_200_gives_1_and_3_requests_then_delivered():
    report, transport, _ = run({0: lane(targets=(A, B), broadcast=True)}, [batch([(record(0, 0), (0,))])],
                               per_url({"http://b/": [500, 500, 200]}), park_after_s=5)
    to_a = [s for s in transport.sent if s.request.url == "http://a/"]
    to_b = [s for s in transport.sent if s.request.url == "http://b/"]
    assert len(to_a) == 1 and len(to_b) == 3
    assert [header(s, "Hermes-Retry-Count") for s in to_b] == ["0", "1", "2"], "counted per endpoint"
    assert {s.message_id for s in transport.sent} == {to_a[0].message_id}
    counters = lane_report(report).counters
    assert (counters.delivered, counters.discarded, counters.attempts) == (1, 0, 4)


def test_a_400_on_one_endpoint_gives_one_undelivered_row_naming_it_and_the_other_still_gets_it():
    report, transport, _ = run({0: lane(targets=(A, B), broadcast=True)},
                               [batch([(record(0, o), (0,)) for o in range(2)])], per_url({"http://b/": [400]}))
    assert sorted(json.loads(s.request.body)["o"] for s in transport.sent if s.request.url == "http://a/") == [0, 1]
    discarded = lane_report(report).discarded
    assert [(d.offset, d.endpoint, d.http_status) for d in discarded] == [(0, "http://u:*****@b/", 400),
                                                                         (1, "http://u:*****@b/", 400)]
    counters = lane_report(report).counters
    assert (counters.delivered, counters.discarded) == (0, 2), "a message some endpoint missed is not delivered"


def test_retry_after_on_one_endpoint_does_not_hold_the_other():
    respond = per_url({"http://b/": [HttpAnswer(503, retry_after="3"), 200]})
    _, transport, _ = run({0: lane(targets=(A, B), broadcast=True)}, [batch([(record(0, o), (0,)) for o in range(3)])],
                          respond, park_after_s=10)
    a_times = [s.started for s in transport.sent if s.request.url == "http://a/"]
    b_retries = [s.started for s in transport.sent if s.request.url == "http://b/" and
                 header(s, "Hermes-Retry-Count") == "1"]
    assert len(a_times) == 3 and max(a_times) - min(a_times) < 1, "a is served at once"
    assert len(b_retries) == 3 and min(b_retries) - min(a_times) >= 3, "b waits its own Retry-After"


def test_unfinished_endpoints_are_parked_with_their_progress_and_continue_there_only():
    clock = FakeClock()
    retry = retry_policy(message_ttl_s=600, backoff_s=2.0)
    report, _, _ = run({0: lane(targets=(A, B), broadcast=True, retry=retry, inflight=4)},
                       [batch([(record(0, 0), (0,))])], per_url({"http://b/": [500, 500, 200]}), clock=clock,
                       park_after_s=0.5)
    (parked,) = lane_report(report).parked
    assert [(t.index, t.attempts) for t in parked.state.targets] == [(1, 1)], "only b is left, after 1 attempt"
    (back,) = TaskReport.from_table(pa.Table.from_batches([report.to_arrow()]))
    assert back.lanes[0].parked[0].state == parked.state, "the targets survive the trip through Arrow"

    resume = {(0, 0): parked.state}
    clock.sleep(5)
    report, transport, _ = run({0: lane(targets=(A, B), broadcast=True, retry=retry, positional=False,
                                        resume=resume)},
                               [batch([(record(0, 0), (0,))])], per_url({"http://b/": [500, 500, 200]}), clock=clock,
                               park_after_s=10)
    assert [s.request.url for s in transport.sent] == ["http://b/", "http://b/"]
    assert [header(s, "Hermes-Retry-Count") for s in transport.sent] == ["1", "2"]
    assert lane_report(report).counters.delivered == 1 and not lane_report(report).parked


def test_a_never_attempted_broadcast_message_stops_the_position_at_the_deadline():
    def slow(request, attempt):
        return HttpAnswer(200), 2.0  # answered 0.5 s into the grace after the deadline

    report, transport, _ = run({0: lane(targets=(A, B), broadcast=True, inflight=1)},
                               [batch([(record(0, o), (0,)) for o in range(4)])], slow, deadline_s=1.5)
    result = lane_report(report)
    assert result.stops == {0: 1} and not result.parked and not result.carried
    assert len(transport.sent) == 2 and result.counters.delivered == 1


def test_a_parked_member_resumes_at_its_endpoint_by_name_when_the_set_changed_and_one_that_left_is_still_owed():
    """docs/design.md §7: the driver names the endpoints a state still owes (`named`) and finds them by name
    in the next round's targets (`placed`); an endpoint that left comes after them (`departed`), for the owed
    members only, never for a new message."""
    from herald.engine.round.planner import named, placed

    C = Target("http://c/", shown="http://c/")  # noqa: N806 - named as the module's A and B are
    clock = FakeClock()
    retry = retry_policy(message_ttl_s=600, backoff_s=2.0)
    report, _, _ = run({0: lane(targets=(A, B), broadcast=True, retry=retry, inflight=4)},
                       [batch([(record(0, 0), (0,)), (record(0, 1), (0,))])],
                       per_url({"http://b/": [500, 200], "http://a/": [500, 200]}), clock=clock, park_after_s=0.5)
    states = {item.record.offset: named(item.state, (A, B)) for item in lane_report(report).parked}
    assert [t.endpoint for t in states[0].targets] == ["http://a/", "http://u:*****@b/"]
    assert through_json(states[0]) == states[0], "the names survive the retries table's JSON"

    now = (C, B)  # the set changed: a left, c joined, b moved to index 1
    resume, departed = placed({(0, 0): states[0]}, now, former=lambda shown: None)
    assert [(t.endpoint, t.index) for t in resume[(0, 0)].targets] == [("http://a/", 2), ("http://u:*****@b/", 1)]
    assert [t.url for t in departed] == ["http://a/"]
    clock.sleep(5)
    report, transport, _ = run({0: lane(targets=now + departed, departed=1, broadcast=True, retry=retry,
                                        positional=False, resume=resume)},
                               [batch([(record(0, 0), (0,)), (record(0, 2), (0,))])], per_url({}), clock=clock,
                               park_after_s=10)
    sent = sorted((json.loads(s.request.body)["o"], s.request.url) for s in transport.sent)
    assert sent == [(0, "http://a/"), (0, "http://b/"), (2, "http://b/"), (2, "http://c/")], \
        "the parked message finishes at a and b (not c); the new one goes to the set now (not a)"
    assert lane_report(report).counters.delivered == 2


def through_json(state):
    from herald.delivery.message import RetryState

    return RetryState(state.attempts, state.first_read_ms, state.due_ms, state.backoff_s, state.last_status,
                      state.last_reason, RetryState.targets_from_json(state.targets_json()))
