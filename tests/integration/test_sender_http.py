"""The delivery loop of one task against real HTTP servers on 127.0.0.1 (no Spark: fast and precise).

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
from herald.delivery.message import Record
from herald.delivery.plan import DeliveryPlan
from herald.delivery.policy import RetryPolicy
from herald.delivery.sender import PartitionSender
from tests.support.subscriber import Reply, ScriptedSubscriber

_offsets = itertools.count()


def record(document: dict, **fields) -> Record:
    return Record(topic="g.t", partition=0, offset=next(_offsets), timestamp_ms=int(time.time() * 1000),
                  value=json.dumps(document).encode(), **fields)


def plan_for(url: str, **overrides) -> DeliveryPlan:
    retry = overrides.pop("retry", RetryPolicy(message_ttl_s=5, backoff_s=0.05))
    values = dict(subscription_id="g.t.s", url=url, headers=static_headers("application/json", "g.t", "s", False),
                  retry=retry, inflight=4, rate_per_s=1000.0, request_timeout_s=1.0)
    values.update(overrides)
    return DeliveryPlan(**values)


def deliver(plan: DeliveryPlan, records: list[Record]):
    return PartitionSender(plan).run(records)


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
def test_classification_rows_over_http(retry_client_errors):
    rows = [row for row in CLASSIFICATION_ROWS if row[2] == retry_client_errors]
    with ScriptedSubscriber() as sub:
        retry = RetryPolicy(message_ttl_s=10, backoff_s=0.05, retry_client_errors=retry_client_errors)
        records = [record({"i": name, "replies": replies}) for name, replies, *_ in rows]
        report = deliver(plan_for(sub.url, retry=retry), records)
    seen = attempts_by_message(sub)
    for name, _, _, delivered, attempts in rows:
        assert len(seen[name]) == attempts, name
    discarded = {json.loads(item.message)["i"]: item for item in report.discarded}
    assert set(discarded) == {name for name, _, _, delivered, _ in rows if not delivered}
    for item in discarded.values():
        assert item.reason.startswith("Message sending failed with status code: 4") and item.attempts == 1
    assert report.counters.delivered + report.counters.discarded == len(rows)


def test_retry_after_delays_the_next_attempt_and_the_retry_count_header_counts():
    with ScriptedSubscriber() as sub:
        deliver(plan_for(sub.url), [record({"i": 1, "replies": [[503, {"Retry-After": "1"}], [200]]})])
    first, second = attempts_by_message(sub)[1]
    assert second.at - first.at >= 0.95
    assert (first.headers["Hermes-Retry-Count"], second.headers["Hermes-Retry-Count"]) == ("0", "1")
    assert first.message_id == second.message_id


def test_retry_after_as_http_date():
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    with ScriptedSubscriber() as sub:
        deliver(plan_for(sub.url), [record({"i": 1, "replies": [[503, {"Retry-After": when}], [200]]})])
    first, second = attempts_by_message(sub)[1]
    assert second.at - first.at >= 0.9  # HTTP-dates have whole-second resolution


def test_constant_backoff_gaps():
    with ScriptedSubscriber() as sub:
        deliver(plan_for(sub.url, retry=RetryPolicy(message_ttl_s=10, backoff_s=0.2)),
                [record({"i": 1, "replies": [[500], [500], [500], [200]]})])
    times = [request.at for request in attempts_by_message(sub)[1]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) == 3 and all(0.18 <= gap < 0.6 for gap in gaps), gaps


def test_exponential_backoff_gaps_grow_and_are_capped():
    retry = RetryPolicy(message_ttl_s=10, backoff_s=0.1, backoff_multiplier=3, max_backoff_s=0.5)
    with ScriptedSubscriber() as sub:
        deliver(plan_for(sub.url, retry=retry), [record({"i": 1, "replies": [[500]] * 4 + [[200]]})])
    times = [request.at for request in attempts_by_message(sub)[1]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # expected 0.1, 0.3, 0.5 (capped from 0.9), 0.5
    assert gaps[0] < gaps[1] < gaps[2], gaps
    assert 0.45 <= gaps[2] < 0.8 and 0.45 <= gaps[3] < 0.8, gaps


def test_ttl_discards_with_an_undelivered_row():
    retry = RetryPolicy(message_ttl_s=0.6, backoff_s=0.1)
    with ScriptedSubscriber() as sub:
        report = deliver(plan_for(sub.url, retry=retry), [record({"i": 1, "replies": [[503]]})])
    assert report.counters.delivered == 0 and len(report.discarded) == 1
    item = report.discarded[0]
    assert item.reason.startswith("Total timeout elapsed") and item.http_status == 503
    assert 4 <= item.attempts <= 8  # one every 0.1 s within 0.6 s
    assert len(sub.requests) == item.attempts


def test_max_attempts_discards():
    with ScriptedSubscriber() as sub:
        report = deliver(plan_for(sub.url, retry=RetryPolicy(message_ttl_s=10, backoff_s=0.01, max_attempts=3)),
                         [record({"i": 1, "replies": [[500]]})])
    assert len(sub.requests) == 3 and report.discarded[0].reason.startswith("Max attempts reached (3)")


def test_request_timeout_is_a_timeout_and_retried():
    with ScriptedSubscriber() as sub:
        report = deliver(plan_for(sub.url, request_timeout_s=0.3),
                         [record({"i": 1, "replies": [{"delay_ms": 800}, [200]]})])
    assert report.counters.timeouts == 1 and report.counters.delivered == 1


def test_request_timeout_is_a_total_even_while_bytes_keep_coming():
    body = "x" * 20  # 20 bytes, 100 ms apart: 2 s in all, each gap well under the idle limit
    with ScriptedSubscriber() as sub:
        started = time.monotonic()
        report = deliver(plan_for(sub.url, request_timeout_s=0.5, socket_timeout_s=0.4,
                                  retry=RetryPolicy(message_ttl_s=10, backoff_s=0.01, max_attempts=1)),
                         [record({"i": 1, "replies": [{"trickle_ms": 100, "body": body}]})])
        gave_up_after_s = time.monotonic() - started
    assert report.counters.timeouts == 1 and report.counters.discarded == 1
    assert gave_up_after_s < 1.5  # the body needs 2 s: the attempt was cut at its 0.5 s total, not at the end


def test_socket_timeout_is_an_idle_limit():
    with ScriptedSubscriber() as sub:
        report = deliver(plan_for(sub.url, request_timeout_s=5.0, socket_timeout_s=0.2,
                                  retry=RetryPolicy(message_ttl_s=10, backoff_s=0.01, max_attempts=1)),
                         [record({"i": 1, "replies": [{"stall_body_ms": 1000}]})])
    assert report.counters.timeouts == 1
    assert "idle" in report.discarded[0].reason


def test_connection_refused_is_an_other_error():
    with ScriptedSubscriber() as sub:
        dead_url = sub.url
    report = deliver(plan_for(dead_url, retry=RetryPolicy(message_ttl_s=10, backoff_s=0.01, max_attempts=2)),
                     [record({"i": 1})])
    assert report.counters.other_errors == 2 and "Connection error" in report.discarded[0].reason


def test_redirects_are_never_followed():
    with ScriptedSubscriber() as target, ScriptedSubscriber() as sub:
        replies = [[301, {"Location": target.url + "/elsewhere"}], [200]]
        deliver(plan_for(sub.url), [record({"i": 1, "replies": replies})])
    assert len(target.requests) == 0 and len(sub.requests) == 2


def test_concurrency_never_exceeds_inflight():
    with ScriptedSubscriber(lambda request: Reply(delay_ms=50)) as sub:
        report = deliver(plan_for(sub.url, inflight=3), [record({"i": n}) for n in range(30)])
    assert report.counters.delivered == 30
    assert sub.peak_concurrency == 3


def test_inflight_counts_messages_waiting_for_a_retry():
    """inflight 1: a retrying message holds back the next one (partition order, as Hermes promises)."""
    with ScriptedSubscriber() as sub:
        records = [record({"i": 1, "replies": [[500], [500], [200]]}), record({"i": 2}), record({"i": 3})]
        deliver(plan_for(sub.url, inflight=1), records)
    order = [request.json()["i"] for request in sorted(sub.requests, key=lambda r: r.at)]
    assert order == [1, 1, 1, 2, 3]


def test_rate_cap():
    with ScriptedSubscriber() as sub:
        deliver(plan_for(sub.url, inflight=10, rate_per_s=20.0), [record({"i": n}) for n in range(30)])
    times = sorted(request.at for request in sub.requests)
    busiest_second = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest_second <= 21  # 20/s, plus one for scheduling jitter at the window's edge
    assert times[-1] - times[0] >= 1.3  # 30 messages at 20/s take about 1.45 s


def test_sending_delay_counts_from_publish_time():
    with ScriptedSubscriber() as sub:
        published = record({"i": 1})
        started = time.monotonic()
        deliver(plan_for(sub.url, sending_delay_s=0.5), [published])
    assert sub.requests[0].at - started >= 0.4


def test_headers_and_basic_auth_on_every_attempt():
    headers = static_headers("application/json", "g.t", "s", True, (("X-Custom", "v1"),),
                             "Basic " + base64.b64encode(b"user:pa55").decode())
    with ScriptedSubscriber() as sub:
        deliver(plan_for(sub.url, headers=headers),
                [record({"i": 1, "replies": [[500], [200]]}, headers=(("id", b"msg-42"),))])
    for request in sub.requests:
        assert request.headers["Hermes-Message-Id"] == "msg-42"
        assert request.headers["Hermes-Topic-Name"] == "g.t"
        assert request.headers["Hermes-Subscription-Name"] == "s"
        assert request.headers["X-Custom"] == "v1"
        assert request.headers["Content-Type"] == "application/json"
        assert base64.b64decode(request.headers["Authorization"].split()[1]) == b"user:pa55"


def test_filtered_records_are_counted_not_sent_but_advance_the_position():
    with ScriptedSubscriber() as sub:
        records = [record({"i": 1}), record({"i": 2}, matched=False), record({"i": 3})]
        report = deliver(plan_for(sub.url), records)
    assert len(sub.requests) == 2 and report.counters.filtered == 1 and report.counters.read == 3
    assert report.positions[("g.t", 0)] == records[-1].offset + 1


def test_a_failing_subscriber_is_slowed_to_heartbeat_probes():
    settings = FlowSettings(adjust_interval_s=0.2, slow_rate_per_s=5.0, heartbeat_interval_s=0.5)
    with ScriptedSubscriber(lambda request: Reply(status=500)) as sub:
        report = deliver(plan_for(sub.url, inflight=8, flow_settings=settings,
                                  retry=RetryPolicy(message_ttl_s=3, backoff_s=0.01)),
                         [record({"i": n}) for n in range(8)])
    assert report.flow_state.mode.value == "HEARTBEAT"
    times = sorted(request.at for request in sub.requests)
    late = [t for t in times if t > times[0] + 1.5]  # after the controller has settled
    gaps = [b - a for a, b in zip(late, late[1:])]
    assert late and all(gap >= 0.45 for gap in gaps), gaps
    assert report.counters.discarded == 8
