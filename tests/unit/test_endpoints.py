"""Endpoint lists (ANYCAST round-robin, each endpoint with its own credentials) and endpoint templates, in the
config and in the task's loop (fake clock and transport)."""

from __future__ import annotations

import base64
import json

import pytest

from herald.config import ConfigError, load_config
from herald.delivery.plan import Target
from herald.delivery.policy import EndedBy
from herald.delivery.transport import HttpAnswer
from herald.endpoint import Endpoint, MissingField, fill, placeholders
from tests.support.config_files import SUBSCRIPTION, write_conf
from tests.support.delivery import batch, lane, lane_report, record, run

LIST = SUBSCRIPTION.replace("endpoint: http://127.0.0.1:8080/orders",
                            "endpoints: ['http://a:pw-one@127.0.0.1:8080/a', 'http://127.0.0.1:8081/b/{order.id}']")


def problems(tmp_path, text: str) -> list:
    with pytest.raises(ConfigError) as caught:
        load_config(write_conf(tmp_path, subscriptions={"billing": text}))
    return caught.value.problems


def test_an_endpoint_list_loads_and_stays_masked(tmp_path):
    subscription = load_config(write_conf(tmp_path, subscriptions={"billing": LIST})).subscription(
        "shop.orders.billing")
    assert [t.url for t in subscription.targets] == ["http://127.0.0.1:8080/a", "http://127.0.0.1:8081/b/{order.id}"]
    assert "pw-one" not in repr(subscription) and "a:*****@127.0.0.1:8080/a" in repr(subscription)


def test_exactly_one_of_endpoint_and_endpoints(tmp_path):
    both = LIST + "endpoint: http://127.0.0.1:9/\n"
    (problem,) = problems(tmp_path / "1", both)
    assert problem.file.endswith("billing.yaml") and "either endpoint" in problem.message
    neither = SUBSCRIPTION.replace("endpoint: http://127.0.0.1:8080/orders\n", "")
    (problem,) = problems(tmp_path / "2", neither)
    assert "either endpoint" in problem.message


def test_each_url_of_a_list_is_checked_by_index_with_its_password_masked(tmp_path):
    bad = LIST.replace("http://127.0.0.1:8081/b/{order.id}", "ftp://u:pw-two@x/{order..id}")
    (problem,) = problems(tmp_path, bad)
    assert problem.key == "endpoints[1]" and "pw-two" not in str(problem)
    bad = LIST.replace("http://127.0.0.1:8081/b/{order.id}", "http://127.0.0.1/{order..id}")
    (problem,) = problems(tmp_path / "2", bad)
    assert problem.key == "endpoints[1]" and "{order..id}" in problem.message


def test_placeholders_and_filling():
    assert placeholders("http://h/o/{order.id}/i/{items[1].sku}?c={country}") == ("order.id", "items[1].sku", "country")
    document = {"order": {"id": 7}, "items": [{"sku": "a"}, {"sku": "x/y z"}], "country": "PL"}
    assert fill("http://h/o/{order.id}/i/{items[1].sku}?c={country}", document) == "http://h/o/7/i/x%2Fy%20z?c=PL"
    for missing in ({"order": {}}, {"order": {"id": None}}, {"order": {"id": {"n": 1}}}, {"order": []}):
        with pytest.raises(MissingField, match=r"\{order.id\}"):
            fill("http://h/{order.id}", missing)
    for bad in ("http://h/{}", "http://h/{a b}", "http://h/{a", "http://{host}/x"):
        with pytest.raises(ValueError):
            Endpoint.parse(bad)


def urls_of(transport) -> list[tuple[int, str]]:
    return [(json.loads(s.request.body)["o"], s.request.url) for s in transport.sent]


def test_anycast_spreads_first_attempts_round_robin_and_a_retry_goes_to_the_next_endpoint():
    targets = (Target("http://a/"), Target("http://b/"), Target("http://c/"))

    def respond(request, attempt):
        retry_count = int(dict(line.split(": ", 1) for line in request.header_lines)["Hermes-Retry-Count"])
        failing = json.loads(request.body)["o"] == 1 and retry_count < 2
        return HttpAnswer(500 if failing else 200), 0.01

    _, transport, _ = run({0: lane(targets=targets, inflight=1)}, [batch([(record(0, o), (0,)) for o in range(4)])],
                          respond, park_after_s=5)
    # first attempts take turns (a, b, c, a); a retry goes to the endpoint after the one that failed it
    assert urls_of(transport) == [(0, "http://a/"), (1, "http://b/"), (1, "http://c/"), (1, "http://a/"),
                                  (2, "http://c/"), (3, "http://a/")]


def test_each_target_carries_its_own_authorization():
    auth = "Authorization: Basic " + base64.b64encode(b"u:p").decode()
    targets = (Target("http://a/", auth), Target("http://b/"))
    _, transport, _ = run({0: lane(targets=targets, inflight=1)}, [batch([(record(0, o), (0,)) for o in range(2)])],
                          lambda r, a: (HttpAnswer(200), 0.01))
    a, b = transport.sent
    assert a.request.url == "http://a/" and a.header("Authorization") == auth.split(": ", 1)[1]
    assert b.request.url == "http://b/" and b.header("Authorization") is None


def test_a_template_is_filled_per_message_and_a_message_without_the_field_is_discarded_unsent():
    rows = [(record(0, 0, {"order": {"id": "A-1"}, "o": 0}), (0,)), (record(0, 1, {"o": 1}), (0,)),
            (record(0, 2, {"order": {"id": 5}, "o": 2}), (0,))]
    report, transport, _ = run({0: lane(targets=(Target("http://orders/{order.id}/events"),))}, [batch(rows)],
                               lambda r, a: (HttpAnswer(200), 0.01))
    assert sorted(urls_of(transport)) == [(0, "http://orders/A-1/events"), (2, "http://orders/5/events")]
    (discarded,) = lane_report(report).discarded
    assert (discarded.offset, discarded.ended_by, discarded.attempts) == (1, EndedBy.TEMPLATE, 0)
    assert discarded.reason == "Endpoint template placeholder {order.id}: the message has no such field"
    assert lane_report(report).counters.delivered == 2 and lane_report(report).counters.discarded == 1
