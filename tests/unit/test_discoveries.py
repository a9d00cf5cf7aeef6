"""Discovery (herald.engine.endpoints.lookups, herald.engine.endpoints.discoveries), on a fake clock with a fake HTTP
GET: answers made into URLs, the set as the union of each lookup's last good answer, the poll schedule, holds and
wake-ups, the recorded set, and the priority group following the set."""

from __future__ import annotations

import json
import random

import pytest

from herald.config import load_config
from herald.config.endpoints import Discovery
from herald.engine.endpoints.discoveries import FAILED, OK, Discoveries, recorded_endpoints
from herald.engine.endpoints.lookups import EndpointSet, PollSchedule, parse_answer
from herald.engine.endpoints.priority_groups import HELD, Priority
from herald.storage import open_store
from tests.support.clock import FakeClock
from tests.support.config_files import write_conf

LOOKUP_1, LOOKUP_2 = "http://lookup-1:4161/lookup?topic=orders", "http://ops:s3cret@lookup-2:4161/lookup?topic=orders"
TEMPLATE = "http://{address}:{port}/orders"
DISCOVERY = Discovery(urls=[LOOKUP_1, LOOKUP_2], endpoint=TEMPLATE)


def producers(*nodes: tuple[str, int], wrapped: bool = False) -> bytes:
    data = {"channels": [], "producers": [{"broadcast_address": address, "http_port": port, "tcp_port": 4150,
                                           "hostname": address, "version": "1.3.0"} for address, port in nodes]}
    return json.dumps({"status_code": 200, "status_txt": "OK", "data": data} if wrapped else data).encode()


# -- answers ---------------------------------------------------------------------------------------------------
def test_an_answer_is_a_list_of_urls_or_lookupds_producers_made_into_urls_by_the_template():
    assert parse_answer(b'["http://a:1/x", "http://b:2/y", "http://a:1/x"]', DISCOVERY) == ("http://a:1/x",
                                                                                          "http://b:2/y")
    assert parse_answer(producers(("10.0.0.1", 4151), ("node-2", 4152)), DISCOVERY) == (
        "http://10.0.0.1:4151/orders", "http://node-2:4152/orders")
    assert parse_answer(producers(("n", 1), wrapped=True), DISCOVERY) == ("http://n:1/orders",), "lookupd < 1.0"
    assert parse_answer(producers(("fd00::1", 4151)), DISCOVERY) == ("http://[fd00::1]:4151/orders",)
    assert parse_answer(b"[]", DISCOVERY) == () and parse_answer(producers(), DISCOVERY) == ()


@pytest.mark.parametrize("body, why", [
    (b"<html>", "not JSON"), (b'{"message": "TOPIC_NOT_FOUND"}', "neither"), (b"[1]", "not a URL string"),
    (b'["ftp://a/x"]', "not an http"), (b'{"producers": [{"broadcast_address": "a"}]}', "http_port"),
    (b'{"producers": [{"broadcast_address": "a", "http_port": "80"}]}', "http_port")])
def test_garbage_is_refused_with_why(body, why):
    with pytest.raises(ValueError, match=why):
        parse_answer(body, DISCOVERY)


def test_producers_need_the_template():
    with pytest.raises(ValueError, match="endpoints.discovery.endpoint"):
        parse_answer(producers(("n", 1)), Discovery(urls=[LOOKUP_1]))


# -- the set ---------------------------------------------------------------------------------------------------
def test_the_set_is_the_union_of_each_lookups_last_good_answer_and_an_outage_keeps_it():
    endpoints = EndpointSet([LOOKUP_1, LOOKUP_2])
    change = endpoints.answer(LOOKUP_1, ("http://b/x", "http://a/x"))
    assert change.added == ("http://a/x", "http://b/x") and endpoints.endpoints == ("http://a/x", "http://b/x")
    change = endpoints.answer(LOOKUP_2, ("http://a/x", "http://c/x"))
    assert change.added == ("http://c/x",) and not change.removed, "keyed by URL: a is named by both"
    assert endpoints.named_by("http://a/x") == [LOOKUP_1, LOOKUP_2]
    endpoints.failed(LOOKUP_1, "timeout")
    endpoints.failed(LOOKUP_2, "HTTP 500")
    assert endpoints.endpoints == ("http://a/x", "http://b/x", "http://c/x"), "every lookup failing keeps the set"
    assert endpoints.answer(LOOKUP_1, ("http://a/x",)).removed == ("http://b/x",)
    assert endpoints.endpoints == ("http://a/x", "http://c/x"), "lookup 2's last good answer still counts"
    assert endpoints.answer(LOOKUP_1, ()) is None, "a is still named by lookup 2: no change"
    change = endpoints.answer(LOOKUP_2, ())
    assert endpoints.endpoints == () and change.removed == ("http://a/x", "http://c/x"), "all empty: empty"


def test_an_edit_dropping_a_lookup_drops_its_answer():
    endpoints = EndpointSet([LOOKUP_1, LOOKUP_2])
    endpoints.answer(LOOKUP_1, ("http://a/x",))
    endpoints.answer(LOOKUP_2, ("http://b/x",))
    assert endpoints.forget([LOOKUP_1]).removed == ("http://b/x",)


# -- the schedule ----------------------------------------------------------------------------------------------
def test_a_lookup_is_looked_up_at_once_then_polled_every_interval_jittered():
    clock = FakeClock()
    discovery = Discovery(urls=[LOOKUP_1], pollIntervalMs=60_000, jitter=0.3)
    schedule = PollSchedule(discovery, clock.now, random.Random(7))
    assert schedule.due(clock.now) == [LOOKUP_1], "the first look: at once"
    firsts, laters = [], []
    for _ in range(200):
        firsts.append(PollSchedule(discovery, clock.now, schedule.rng).polled(LOOKUP_1, clock.now) - clock.now)
    now = clock.now
    for _ in range(200):
        due = schedule.polled(LOOKUP_1, now)
        laters.append(due - now)
        now = due
    laters = laters[1:]  # the first is the first poll's own delay
    assert all(60 <= d <= 60 * 1.3 for d in firsts) and max(firsts) - min(firsts) > 10, \
        "the first poll: the interval plus a random part of jitter x interval"
    assert all(60 * 0.85 <= d <= 60 * 1.15 for d in laters) and max(laters) - min(laters) > 10, \
        "every later poll: the interval, +-jitter/2"
    assert PollSchedule(Discovery(urls=[LOOKUP_1], jitter=0), 0, random.Random()).polled(LOOKUP_1, 0) == 60


# -- the job's sets --------------------------------------------------------------------------------------------
class FakeLookups:
    """Answers per lookup URL: bytes, or an exception to raise."""

    def __init__(self) -> None:
        self.answers: dict[str, bytes | Exception] = {}
        self.asked: list[tuple[str, float]] = []

    def __call__(self, url: str, timeout_s: float) -> bytes:
        self.asked.append((url, timeout_s))
        answer = self.answers.get(url, ConnectionError("connection refused"))
        if isinstance(answer, Exception):
            raise answer
        return answer


DISCOVERING = f"""
topicName: shop.orders
name: billing
endpoints:
  discovery: {{urls: ["{LOOKUP_1}", "{LOOKUP_2}"], pollIntervalMs: 10000, jitter: 0.2, endpoint: "{TEMPLATE}",
               timeoutMs: 800}}
"""


def job(tmp_path, subscription=DISCOVERING, with_store=True):
    config = load_config(write_conf(tmp_path, subscriptions={"billing": subscription}))
    clock, lookups = FakeClock(), FakeLookups()
    store = open_store("deltalake", str(tmp_path / "state")) if with_store else None
    discoveries = Discoveries(lookups, clock, clock.wall_ms, random.Random(1), workers=0, store=store)
    return config, clock, lookups, discoveries


def test_the_job_holds_a_subscription_until_an_endpoint_is_discovered_then_wakes_delivery(tmp_path, caplog):
    caplog.set_level("INFO", logger="herald.engine.endpoints.discoveries")
    config, clock, lookups, discoveries = job(tmp_path)
    (subscription,) = config.subscriptions
    woken, polls = [], []
    discoveries.wakers.append(lambda: woken.append(clock.now))
    discoveries.polled.append(lambda sid, result: polls.append(result))
    discoveries.configure(config.subscriptions)
    assert discoveries.holds(subscription.id) and discoveries.endpoints_of(subscription) == []
    lookups.answers[LOOKUP_1] = producers()
    wait_s = discoveries.step()
    assert sorted(url for url, _ in lookups.asked) == sorted([LOOKUP_1, LOOKUP_2])
    assert {timeout for _, timeout in lookups.asked} == {0.8}, "timeoutMs, in seconds"
    assert polls == [OK, FAILED] and discoveries.holds(subscription.id) and not woken
    assert discoveries.answered(subscription.id), "an empty answer is an answer"
    assert 10 <= wait_s <= 12.01
    assert "ops:*****@lookup-2" in caplog.text and "s3cret" not in caplog.text, "failures logged, masked"
    lookups.answers[LOOKUP_2] = producers(("n2", 80))
    clock.sleep(12.01)  # both are due again (10 s + up to 20 %)
    discoveries.step()
    assert not discoveries.holds(subscription.id) and woken == [clock.now], "filled again: woken once"
    assert [e.url for e in discoveries.endpoints_of(subscription)] == ["http://n2:80/orders"]
    assert discoveries.known("http://n2:80/orders") is not None
    recorded = recorded_endpoints(discoveries.store, subscription.id)
    assert recorded["endpoints"] == [{"endpoint": "http://n2:80/orders",
                                      "lookups": ["http://ops:*****@lookup-2:4161/lookup?topic=orders"]}]
    assert "added http://n2:80/orders" in caplog.text


def test_a_lookup_outage_keeps_the_set_and_an_empty_answer_from_all_empties_it(tmp_path):
    config, clock, lookups, discoveries = job(tmp_path)
    (subscription,) = config.subscriptions
    lookups.answers = {LOOKUP_1: b'["http://a:1/x"]', LOOKUP_2: b'["http://b:1/x"]'}
    discoveries.configure(config.subscriptions)
    discoveries.step()
    assert len(discoveries.endpoints_of(subscription)) == 2
    lookups.answers = {LOOKUP_1: b"garbage", LOOKUP_2: TimeoutError("read timed out")}
    for _ in range(5):
        clock.sleep(discoveries.step())
    assert len(discoveries.endpoints_of(subscription)) == 2 and not discoveries.holds(subscription.id)
    state = discoveries.state(subscription.id)
    assert set(state["failing"]) == {LOOKUP_1, "http://ops:*****@lookup-2:4161/lookup?topic=orders"}
    lookups.answers = {LOOKUP_1: b"[]", LOOKUP_2: b"garbage"}
    clock.sleep(discoveries.step())
    discoveries.step()
    assert [e.url for e in discoveries.endpoints_of(subscription)] == ["http://b:1/x"], "lookup 2 keeps its answer"
    lookups.answers = {LOOKUP_1: b"[]", LOOKUP_2: b"[]"}
    clock.sleep(30)
    discoveries.step()
    assert discoveries.endpoints_of(subscription) == [] and discoveries.holds(subscription.id)
    assert recorded_endpoints(discoveries.store, subscription.id)["endpoints"] == [], "the empty set is recorded"


def test_a_subscription_no_longer_active_forgets_its_set_and_configured_ones_are_not_held(tmp_path):
    config, clock, lookups, discoveries = job(tmp_path, with_store=False)
    (subscription,) = config.subscriptions
    lookups.answers = {LOOKUP_1: b'["http://a:1/x"]'}
    discoveries.configure(config.subscriptions)
    discoveries.step()
    discoveries.configure([])
    assert not discoveries.discovered(subscription.id) and not discoveries.holds(subscription.id)
    assert discoveries.step() == 60.0, "nothing to poll"


def test_a_pinned_group_waits_for_the_set_follows_it_and_unpins_an_endpoint_that_leaves(tmp_path):
    pinned = DISCOVERING + "priority: {policy: pinned, timeoutMs: 1000}\n"
    config, clock, lookups, discoveries = job(tmp_path, pinned)
    (subscription,) = config.subscriptions
    priority = Priority(discoveries.store, "run", clock.wall_ms, endpoints_of=lambda s: (
        tuple(e.masked for e in discoveries.endpoints_of(s)) if discoveries.answered(s.id) else None))
    discoveries.changed.append(lambda sid, change: priority.configure(config.subscriptions))
    discoveries.configure(config.subscriptions)
    priority.configure(config.subscriptions)
    assert priority.lease(subscription) == HELD and priority.holds(subscription.id), "no set yet: it waits"
    lookups.answers = {LOOKUP_1: b'["http://b:1/x", "http://a:1/x"]'}
    discoveries.step()
    pin = priority.lease(subscription)
    assert pin.endpoint == "http://a:1/x" and pin.index == 0
    priority.release(subscription.id, pin, None)
    lookups.answers = {LOOKUP_1: b'["http://b:1/x", "http://c:1/x"]'}
    clock.sleep(30)
    discoveries.step()
    pin = priority.lease(subscription)
    assert pin.endpoint == "http://b:1/x", "a left the set: unpinned, the next one pinned"
    rows = sorted(discoveries.store.read("advisories").to_pylist(), key=lambda row: row["timestamp"])
    assert [(row["type"], row["reason"], row["endpoint"]) for row in rows] == [
        ("pinned", "start", "http://a:1/x"), ("unpinned", "endpoint removed", "http://a:1/x"),
        ("pinned", "endpoint removed", "http://b:1/x")]


def test_herald_endpoints_shows_the_recorded_set_offline_passwords_masked(tmp_path, capsys):
    from herald.cli import main

    secret = DISCOVERING.replace("http://{address}", "http://svc:pw-endpoint@{address}")
    config, clock, lookups, discoveries = job(tmp_path, secret, with_store=False)
    (subscription,) = config.subscriptions
    conf = str(tmp_path / "conf")
    assert main(["endpoints", "--conf", conf, subscription.id]) == 0
    assert "no endpoint discovered yet" in capsys.readouterr().out
    discoveries.store = open_store("deltalake", config.storage_path)
    lookups.answers = {LOOKUP_1: producers(("n1", 81)), LOOKUP_2: producers(("n1", 81), ("n2", 82))}
    discoveries.configure(config.subscriptions)
    discoveries.step()
    assert main(["endpoints", "--conf", conf, subscription.id, "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    masked_2 = "http://ops:*****@lookup-2:4161/lookup?topic=orders"
    assert view["source"] == "discovery" and view["lookups"] == [LOOKUP_1, masked_2]
    assert view["endpoints"] == [{"endpoint": "http://svc:*****@n1:81/orders", "lookups": [LOOKUP_1, masked_2]},
                                 {"endpoint": "http://svc:*****@n2:82/orders", "lookups": [masked_2]}]
    assert main(["endpoints", "--conf", conf, subscription.id]) == 0
    text = capsys.readouterr().out
    assert "2 endpoint(s) discovered" in text and "n2:82" in text
    assert "pw-endpoint" not in text + json.dumps(view) and "s3cret" not in text + json.dumps(view)


def test_the_endpoints_a_job_remembers_are_bounded_the_most_recently_seen_kept(tmp_path, monkeypatch):
    """A job whose lookups name a new endpoint at every poll runs for months: it remembers the most recently
    seen `MAX_KNOWN` (their credentials, for a departed BROADCAST member), not every one ever seen."""
    from herald.engine.endpoints import discoveries as discoveries_module

    monkeypatch.setattr(discoveries_module, "MAX_KNOWN", 3)
    config, clock, lookups, discoveries = job(tmp_path, with_store=False)
    discoveries.configure(config.subscriptions)
    for n in range(6):
        lookups.answers = {LOOKUP_1: f'["http://u:pw@node-{n}:1/x"]'.encode(), LOOKUP_2: b"[]"}
        asked = len(lookups.asked)
        while not any(url == LOOKUP_1 for url, _ in lookups.asked[asked:]):
            clock.sleep(discoveries.step())
    remembered = [n for n in range(6) if discoveries.known(f"http://u:*****@node-{n}:1/x") is not None]
    assert remembered == [3, 4, 5]
    assert discoveries.known("http://u:*****@node-5:1/x").password == "pw", "with its credentials"
