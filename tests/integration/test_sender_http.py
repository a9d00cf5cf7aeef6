"""The task's delivery loop against real HTTP servers on 127.0.0.1 (no Spark: fast and precise), on both
transports (pycurl's multi interface and the requests fallback).

Each message body scripts the subscriber's answers to its attempts (see tests/support/subscriber.py).
"""

from __future__ import annotations

import base64
import email.utils
import itertools
import json
import time

import pytest

from herald.delivery.flow import FlowSettings
from herald.delivery.headers import static_headers
from herald.delivery.input import InputBatch
from herald.delivery.message import Record, message_id
from herald.delivery.plan import LanePlan, TaskPlan
from herald.delivery.policy import EndedBy
from herald.delivery.sender import TaskSender
from herald.delivery.transport import open_transport
from tests.support.delivery import lane_plan, retry_policy
from tests.support.subscriber import Reply, ScriptedSubscriber

_offsets = itertools.count()


@pytest.fixture(params=["curl", "requests"])
def transport_kind(request) -> str:
    return request.param


def record(document: dict, message: str | None = None) -> Record:
    offset = next(_offsets)
    return Record(partition=0, offset=offset, timestamp_ms=int(time.time() * 1000),
                  message_id=message or message_id("g.t", 0, offset, None), body=json.dumps(document).encode())


def plan_for(url: str, **overrides) -> LanePlan:
    retry = overrides.pop("retry", retry_policy(message_ttl_s=5, backoff_s=0.05))
    headers = overrides.pop("headers", static_headers("application/json", "g.t", "s", False))
    values = dict(header_lines=tuple(f"{k}: {v}" for k, v in headers.items()),
                  retry=retry, inflight=4, rate_per_s=1000.0, request_timeout_s=1.0,
                  flow_settings=FlowSettings(adjust_interval_s=30))
    values.update(overrides)
    return lane_plan(url, **values)


def deliver(kind: str, plan: LanePlan, records: list[Record]):
    """One task with one lane; retries go on in the task (nothing is parked within a minute)."""
    task = TaskPlan(topic="g.t", lanes={0: plan}, budget_s=60, park_after_s=60,
                    transport=kind)
    report = TaskSender(task, open_transport(kind, 64)).run([InputBatch([(r, (0,)) for r in records])])
    return report.lanes[0]


def attempts_by_message(sub: ScriptedSubscriber) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for request in sorted(sub.requests, key=lambda r: r.at):
        grouped.setdefault(request.json()["i"], []).append(request)
    return grouped


CLASSIFICATION_ROWS = [
    # (name, replies, retry_client_errors, expected: delivered?, attempts)
    ("2xx", [[201]], False, True, 1),
    ("3xx retried", [[302, {"Location": "http://127.0.0.1:1/"}], [200]], False, True, 2),
    ("5xx retried", [[500], [502], [200]], False, True, 3),
    ("503 no Retry-After retried", [[503], [200]], False, True, 2),
    ("503 Retry-After retried", [[503, {"Retry-After": "1"}], [200]], False, True, 2),
    ("429 discarded", [[429], [200]], False, False, 1),
    ("429 retried with retryClientErrors", [[429], [200]], True, True, 2),
    ("429 Retry-After with retryClientErrors", [[429, {"Retry-After": "1"}], [200]], True, True, 2),
    ("4xx discarded", [[400], [200]], False, False, 1),
    ("4xx retried with retryClientErrors", [[404], [200]], True, True, 2),
]


@pytest.mark.parametrize("retry_client_errors", [False, True])
def test_classification_rows_over_http(transport_kind, retry_client_errors):
    rows = [row for row in CLASSIFICATION_ROWS if row[2] == retry_client_errors]
    with ScriptedSubscriber() as sub:
        retry = retry_policy(message_ttl_s=10, backoff_s=0.05, retry_client_errors=retry_client_errors)
        records = [record({"i": name, "replies": replies}) for name, replies, *_ in rows]
        report = deliver(transport_kind, plan_for(sub.url, retry=retry), records)
    seen = attempts_by_message(sub)
    for name, _, _, _delivered, attempts in rows:
        assert len(seen[name]) == attempts, name
    discarded = {json.loads(item.message)["i"]: item for item in report.discarded}
    assert set(discarded) == {name for name, _, _, delivered, _ in rows if not delivered}
    for item in discarded.values():
        assert item.reason.startswith("Message sending failed with status code:4") and item.attempts == 1
        assert item.ended_by == EndedBy.STATUS
    assert report.counters.delivered + report.counters.discarded == len(rows)


def test_retry_after_delays_the_next_attempt_and_the_retry_count_header_counts(transport_kind):
    with ScriptedSubscriber() as sub:
        deliver(transport_kind, plan_for(sub.url), [record({"i": 1, "replies": [[503, {"Retry-After": "1"}], [200]]})])
    first, second = attempts_by_message(sub)[1]
    assert second.at - first.at >= 0.95
    assert (first.headers["Hermes-Retry-Count"], second.headers["Hermes-Retry-Count"]) == ("0", "1")
    assert first.message_id == second.message_id


def test_retry_after_as_http_date(transport_kind):
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    with ScriptedSubscriber() as sub:
        deliver(transport_kind, plan_for(sub.url), [record({"i": 1, "replies": [[503, {"Retry-After": when}], [200]]})])
    first, second = attempts_by_message(sub)[1]
    assert second.at - first.at >= 0.9  # HTTP-dates have whole-second resolution


def test_constant_backoff_gaps(transport_kind):
    with ScriptedSubscriber() as sub:
        deliver(transport_kind, plan_for(sub.url, retry=retry_policy(message_ttl_s=10, backoff_s=0.2)),
                [record({"i": 1, "replies": [[500], [500], [500], [200]]})])
    times = [request.at for request in attempts_by_message(sub)[1]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) == 3 and all(gap >= 0.18 for gap in gaps), gaps


def test_exponential_backoff_gaps_grow_and_are_capped(transport_kind):
    retry = retry_policy(message_ttl_s=10, backoff_s=0.1, backoff_multiplier=3, max_backoff_s=0.5)
    with ScriptedSubscriber() as sub:
        deliver(transport_kind, plan_for(sub.url, retry=retry), [record({"i": 1, "replies": [[500]] * 4 + [[200]]})])
    times = [request.at for request in attempts_by_message(sub)[1]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # expected 0.1, 0.3, 0.5 (capped from 0.9), 0.5
    assert gaps[0] < gaps[1] < gaps[2], gaps
    assert gaps[2] >= 0.45 and gaps[3] >= 0.45, gaps


def test_ttl_discards_with_the_last_reason(transport_kind):
    retry = retry_policy(message_ttl_s=0.6, backoff_s=0.1)
    with ScriptedSubscriber() as sub:
        report = deliver(transport_kind, plan_for(sub.url, retry=retry), [record({"i": 1, "replies": [[503]]})])
    assert report.counters.delivered == 0 and len(report.discarded) == 1
    item = report.discarded[0]
    assert item.reason == "Message sending failed with status code:503" and item.http_status == 503
    assert item.ended_by == EndedBy.TTL
    assert 4 <= item.attempts <= 8  # one every 0.1 s within 0.6 s
    assert len(sub.requests) == item.attempts


def test_max_attempts_discards(transport_kind):
    with ScriptedSubscriber() as sub:
        report = deliver(transport_kind, plan_for(sub.url, retry=retry_policy(message_ttl_s=10, backoff_s=0.01,
                                                                              max_attempts=3)),
                         [record({"i": 1, "replies": [[500]]})])
    assert len(sub.requests) == 3 and report.discarded[0].ended_by == EndedBy.MAX_ATTEMPTS


def test_request_timeout_is_a_timeout_and_retried(transport_kind):
    with ScriptedSubscriber() as sub:
        report = deliver(transport_kind, plan_for(sub.url, request_timeout_s=0.3),
                         [record({"i": 1, "replies": [{"delay_ms": 800}, [200]]})])
    assert report.counters.timeouts == 1 and report.counters.delivered == 1


def test_request_timeout_is_a_total_even_while_bytes_keep_coming(transport_kind):
    body = "x" * 30  # 30 bytes, 100 ms apart: 3 s in all, each gap well under the idle limit
    with ScriptedSubscriber() as sub:
        started = time.monotonic()
        report = deliver(transport_kind, plan_for(sub.url, request_timeout_s=0.5, socket_timeout_s=2.0,
                                  retry=retry_policy(message_ttl_s=10, backoff_s=0.01, max_attempts=1)),
                         [record({"i": 1, "replies": [{"trickle_ms": 100, "body": body}]})])
        gave_up_after_s = time.monotonic() - started
    assert report.counters.timeouts == 1 and report.counters.discarded == 1
    assert gave_up_after_s < 2.5  # the body needs 3 s: the attempt was cut at its 0.5 s total, not at the end


def test_socket_timeout_is_an_idle_limit(transport_kind):
    with ScriptedSubscriber() as sub:
        report = deliver(transport_kind, plan_for(sub.url, request_timeout_s=8.0, socket_timeout_s=1.0,
                                                  retry=retry_policy(message_ttl_s=10, backoff_s=0.01, max_attempts=1)),
                         [record({"i": 1, "replies": [{"stall_body_ms": 4000}]})])
    assert report.counters.timeouts == 1
    assert "idle" in report.discarded[0].reason


def test_connection_refused_is_an_other_error(transport_kind):
    with ScriptedSubscriber() as sub:
        dead_url = sub.url
    report = deliver(transport_kind, plan_for(dead_url, retry=retry_policy(message_ttl_s=10, backoff_s=0.01,
                                                                           max_attempts=2)),
                     [record({"i": 1})])
    assert report.counters.other_errors == 2 and "Connection error" in report.discarded[0].reason


def test_redirects_are_never_followed(transport_kind):
    with ScriptedSubscriber() as target, ScriptedSubscriber() as sub:
        replies = [[301, {"Location": target.url + "/elsewhere"}], [200]]
        deliver(transport_kind, plan_for(sub.url), [record({"i": 1, "replies": replies})])
    assert len(target.requests) == 0 and len(sub.requests) == 2


def test_concurrency_never_exceeds_inflight(transport_kind):
    with ScriptedSubscriber(lambda request: Reply(delay_ms=50)) as sub:
        report = deliver(transport_kind, plan_for(sub.url, inflight=3), [record({"i": n}) for n in range(30)])
    assert report.counters.delivered == 30
    assert sub.peak_concurrency == 3


def test_inflight_counts_messages_waiting_for_a_retry(transport_kind):
    """inflight 1: a retrying message holds back the next one (partition order, as Hermes promises)."""
    with ScriptedSubscriber() as sub:
        records = [record({"i": 1, "replies": [[500], [500], [200]]}), record({"i": 2}), record({"i": 3})]
        deliver(transport_kind, plan_for(sub.url, inflight=1, ordered=True), records)
    order = [request.json()["i"] for request in sorted(sub.requests, key=lambda r: r.at)]
    assert order == [1, 1, 1, 2, 3]


def test_rate_cap(transport_kind):
    with ScriptedSubscriber() as sub:
        deliver(transport_kind, plan_for(sub.url, inflight=10, rate_per_s=20.0), [record({"i": n}) for n in range(30)])
    times = sorted(request.at for request in sub.requests)
    busiest_second = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest_second <= 21  # 20/s, plus one for scheduling jitter at the window's edge
    assert times[-1] - times[0] >= 1.3  # 30 messages at 20/s take about 1.45 s


def test_sending_delay_counts_from_publish_time(transport_kind):
    with ScriptedSubscriber() as sub:
        published = record({"i": 1})
        started = time.monotonic()
        deliver(transport_kind, plan_for(sub.url, sending_delay_s=0.5), [published])
    assert sub.requests[0].at - started >= 0.4


def test_headers_and_basic_auth_on_every_attempt(transport_kind):
    headers = static_headers("application/json", "g.t", "s", True, (("X-Custom", "v1"),),
                             "Basic " + base64.b64encode(b"user:pa55").decode())
    with ScriptedSubscriber() as sub:
        deliver(transport_kind, plan_for(sub.url, headers=headers),
                [record({"i": 1, "replies": [[500], [200]]}, message="msg-42")])
    for request in sub.requests:
        assert request.headers["Hermes-Message-Id"] == "msg-42"
        assert request.headers["Hermes-Topic-Name"] == "g.t"
        assert request.headers["Hermes-Subscription-Name"] == "s"
        assert request.headers["X-Custom"] == "v1"
        assert request.headers["Content-Type"] == "application/json"
        assert base64.b64decode(request.headers["Authorization"].split()[1]) == b"user:pa55"


def test_a_failing_subscriber_is_slowed_to_heartbeat_probes(transport_kind):
    settings = FlowSettings(adjust_interval_s=0.2, slow_rate_per_s=5.0, heartbeat_interval_s=0.5)
    with ScriptedSubscriber(lambda request: Reply(status=500)) as sub:
        report = deliver(transport_kind, plan_for(sub.url, inflight=8, flow_settings=settings,
                                  retry=retry_policy(message_ttl_s=3, backoff_s=0.01)),
                         [record({"i": n}) for n in range(8)])
    assert report.flow_state.mode.value == "HEARTBEAT"
    times = sorted(request.at for request in sub.requests)
    late = [t for t in times if t > times[0] + 1.5]  # after the controller has settled
    gaps = [b - a for a, b in zip(late, late[1:])]
    assert late and all(gap >= 0.45 for gap in gaps), gaps
    assert report.counters.discarded == 8


def test_large_bodies_go_without_expect_100_continue(transport_kind):
    big = "x" * (2 * 1024 * 1024)  # libcurl would ask for 100-continue above 1 MiB
    with ScriptedSubscriber() as sub:
        report = deliver(transport_kind, plan_for(sub.url, inflight=1), [record({"i": 1, "pad": big})])
    assert report.counters.delivered == 1
    (request,) = sub.requests
    assert "Expect" not in request.headers and len(request.body) > 2 * 1024 * 1024


def test_connections_are_kept_alive_and_reused(transport_kind):
    with ScriptedSubscriber() as sub:
        report = deliver(transport_kind, plan_for(sub.url, inflight=2), [record({"i": n}) for n in range(40)])
    assert report.counters.delivered == 40
    connections = {request.client_port for request in sub.requests}
    assert len(connections) <= 4, f"{len(connections)} connections for 40 attempts at inflight 2"
