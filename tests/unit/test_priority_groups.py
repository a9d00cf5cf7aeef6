"""Priority groups for a job (herald.engine.endpoints.priority_groups) over a real delta-rs advisories table, and their
configuration: pins recorded before use, taken up after a restart, given up by `herald unpin`."""

from __future__ import annotations

from herald.config import load_config
from herald.engine.endpoints.pin_group import PinNews
from herald.engine.endpoints.priority_groups import HELD, Priority, last_advisories, recorded_state, unpin
from herald.storage import open_store
from tests.support.config_files import SUBSCRIPTION, problems_of, write_conf

PINNED_SUBSCRIPTION = """
topicName: shop.orders
name: billing
endpoints: [http://primary.example/orders, "http://ops:s3cret@standby.example/orders"]
priority: {policy: pinned, timeoutMs: 1000}
"""
T0 = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> int:
        return self.ms


def setup(tmp_path, subscription=PINNED_SUBSCRIPTION):
    config = load_config(write_conf(tmp_path, subscriptions={"billing": subscription}))
    store = open_store("deltalake", str(tmp_path / "state"))
    return config, store


def board(store, clock, run="run-1") -> Priority:
    return Priority(store, run, clock)


def pinned_job(tmp_path):
    """(config, store, the pinned subscription, a clock, a job's Priority not configured yet)."""
    config, store = setup(tmp_path)
    clock = Clock()
    return config, store, config.subscription("shop.orders.billing"), clock, board(store, clock)


def test_validate_refuses_priority_with_one_endpoint_or_broadcast_naming_the_key(tmp_path):
    one = SUBSCRIPTION + "priority: {policy: pinned}\n"
    assert any("priority" in p and "at least two" in p for p in problems_of(write_conf(tmp_path / "a", subscriptions={
        "billing": one})))
    broadcast = PINNED_SUBSCRIPTION + "mode: BROADCAST\n"
    assert any("priority" in p and "BROADCAST" in p for p in problems_of(write_conf(tmp_path / "b", subscriptions={
        "billing": broadcast})))
    assert any("timeoutMs" in p for p in problems_of(write_conf(tmp_path / "c", subscriptions={
        "billing": PINNED_SUBSCRIPTION.replace("timeoutMs: 1000", "timeoutMs: 10")})))


def test_the_first_pin_is_recorded_before_a_round_gets_it_and_survives_a_restart(tmp_path):
    config, store, billing, clock, first = pinned_job(tmp_path)
    seen = []
    first.listeners.append(seen.append)
    first.configure(config.subscriptions)
    recorded = last_advisories(store)["shop.orders.billing"]["pinned"]
    assert (recorded.endpoint, recorded.reason) == ("http://primary.example/orders", "start")
    pin = first.lease(billing)
    assert pin.index == 0 and pin.pin_id == recorded.pin_id
    assert [a.type for a in seen] == ["pinned"]
    plain = load_config(write_conf(tmp_path / "plain", subscriptions={"plain": SUBSCRIPTION.replace(
        "name: billing", "name: plain")})).subscription("shop.orders.plain")
    assert first.lease(plain) is None, "not pinned: no pin, no group"
    unpinned_edit = load_config(write_conf(tmp_path / "edit")).subscription("shop.orders.billing")
    assert first.lease(unpinned_edit) == HELD, "a version the groups do not know yet (a live edit) waits"
    # kill -9: nothing released; a new job takes the same pin up
    clock.ms += 5000
    second = board(store, clock, run="run-2")
    second.configure(config.subscriptions)
    again = second.lease(billing)
    assert (again.index, again.pin_id) == (0, pin.pin_id)


def test_a_timeout_switches_once_the_rounds_end_and_the_password_never_reaches_the_table(tmp_path):
    config, store, billing, clock, priority = pinned_job(tmp_path)
    woken = []
    priority.wakers.append(lambda: woken.append(True))
    priority.configure(config.subscriptions)
    woken.clear()  # the first pin
    stream, retries = priority.lease(billing), priority.lease(billing)
    clock.ms += 1500
    priority.release("shop.orders.billing", stream, PinNews(None, T0 + 100))
    assert priority.holds("shop.orders.billing") and priority.lease(billing) == HELD
    assert recorded_state(store, "shop.orders.billing")["unpinned"]["reason"] == "timeout"
    assert not woken, "the retry round still sends to the old pin"
    priority.release("shop.orders.billing", retries, None)
    assert woken
    state = recorded_state(store, "shop.orders.billing")
    assert state["endpoint"] == "http://ops:*****@standby.example/orders" and state["unpinned"] is None
    assert state["pin_reason"] == "timeout" and state["pin_id"] != stream.pin_id
    assert priority.lease(billing).index == 1
    table = store.read("advisories")
    assert "s3cret" not in str(table.to_pylist())
    assert sorted(table.column("type").to_pylist()) == ["pinned", "pinned", "unpinned"]


def test_herald_unpin_offline_and_while_running(tmp_path):
    config, store = setup(tmp_path)
    billing = config.subscription("shop.orders.billing")
    clock = Clock()
    assert unpin(store, "shop.orders.billing", "ops", clock.ms)[0] is None, "nothing pinned yet"
    priority = board(store, clock)
    priority.configure(config.subscriptions)
    pinned = priority.lease(billing)
    clock.ms += 10
    advisory, _ = unpin(store, "shop.orders.billing", "ops", clock.ms)
    assert (advisory.reason, advisory.pin_id) == ("admin", pinned.pin_id)
    assert unpin(store, "shop.orders.billing", "ops", clock.ms)[0] is None, "unpinned once"
    priority.poll()  # the running job's look (every configPollMs)
    assert priority.holds("shop.orders.billing"), "its round still runs: no switch yet"
    priority.release("shop.orders.billing", pinned, PinNews(T0 + 5, None))
    state = recorded_state(store, "shop.orders.billing")
    assert state["endpoint"].startswith("http://ops:*****@standby") and state["pin_reason"] == "admin"
    # offline: no job runs; the next one switches at start
    unpin(store, "shop.orders.billing", "ops", clock.ms + 20)
    clock.ms += 30
    restarted = board(store, clock, run="run-2")
    restarted.configure(config.subscriptions)
    assert restarted.lease(billing).index == 0, "wrapped round to the first endpoint"


def test_a_pin_given_up_after_an_unpin_stamped_by_a_clock_ahead_is_recorded_after_it(tmp_path):
    """`herald unpin` ran on a host whose clock is a minute ahead: the job's next pin is stamped after that unpin,
    and when the job gives that pin up in turn (its endpoint edited away), the unpin and the pin after it must be
    stamped later still, or the table's newest rows would say the removed endpoint is still pinned."""
    config, store, billing, clock, priority = pinned_job(tmp_path)
    priority.configure(config.subscriptions)
    pinned = priority.lease(billing)
    unpin(store, "shop.orders.billing", "ops", clock.ms + 60_000)  # the operator's clock, a minute ahead
    priority.poll()
    priority.release("shop.orders.billing", pinned, None)
    assert recorded_state(store, "shop.orders.billing")["endpoint"].startswith("http://ops:*****@standby")
    edited = load_config(write_conf(tmp_path / "edited", subscriptions={"billing": PINNED_SUBSCRIPTION.replace(
        "http://ops:s3cret@standby.example/orders", "http://third.example/orders")}))
    clock.ms += 5
    priority.configure(edited.subscriptions)
    state = recorded_state(store, "shop.orders.billing")
    assert (state["endpoint"], state["pin_reason"], state["unpinned"]) == (
        "http://primary.example/orders", "endpoint removed", None), state


def test_an_edit_that_removes_the_pinned_endpoint_moves_the_pin(tmp_path):
    config, store, billing, clock, priority = pinned_job(tmp_path)
    priority.configure(config.subscriptions)
    edited = load_config(write_conf(tmp_path / "edited", subscriptions={"billing": PINNED_SUBSCRIPTION.replace(
        "http://primary.example/orders", "http://third.example/orders")}))
    clock.ms += 5
    priority.configure(edited.subscriptions)
    state = recorded_state(store, "shop.orders.billing")
    assert state["endpoint"] == "http://third.example/orders" and state["pin_reason"] == "endpoint removed"
    assert priority.lease(billing) == HELD, "a round planned with the old version sits out"
    assert priority.lease(edited.subscription("shop.orders.billing")).index == 0
    priority.configure([])  # suspended: forgotten, its pin stays recorded
    assert priority.pins() == {}


OVERFLOW = """
topicName: shop.orders
name: billing
endpoints:
  - http://us-east.example/orders
  - {url: http://us-west.example/orders, minPending: 1000, minInflight: 50}
priority: {policy: overflow}
"""
DISCOVERED = """
topicName: shop.orders
name: billing
endpoints:
  discovery:
    urls: ["http://lookup-1.example:4161/lookup?topic=orders"]
    endpoint: "http://{address}:{port}/orders"
"""


def test_overflow_and_discovery_forms_load_and_their_mistakes_name_the_key(tmp_path):
    config = load_config(write_conf(tmp_path / "ok", subscriptions={"billing": OVERFLOW, "found": DISCOVERED.replace(
        "name: billing", "name: found")}))
    entries = config.subscription("shop.orders.billing").endpoint_entries
    assert [(e.url, e.minPending, e.minInflight) for e in entries] == [
        ("http://us-east.example/orders", None, None), ("http://us-west.example/orders", 1000, 50)]
    found = config.subscription("shop.orders.found")
    assert found.endpoint_urls == [] and found.discovery.fill("10.0.0.7", 4151) == "http://10.0.0.7:4151/orders"
    assert (found.discovery.pollIntervalMs, found.discovery.jitter) == (60_000, 0.3)

    def problems(name: str, text: str) -> list[str]:
        return problems_of(write_conf(tmp_path / name, subscriptions={"billing": text}))

    no_policy = OVERFLOW.replace("priority: {policy: overflow}\n", "")
    assert any("endpoints[1].minPending" in p and "overflow" in p for p in problems("a", no_policy))
    pinned = OVERFLOW.replace("policy: overflow", "policy: pinned")
    assert any("endpoints[1].minPending" in p for p in problems("b", pinned))
    all_conditional = OVERFLOW.replace("- http://us-east.example/orders", "- {url: http://e.example/o, minPending: 5}")
    assert any("priority" in p and "without conditions" in p for p in problems("c", all_conditional))
    assert any("endpoints.discovery.urls" in p for p in problems("d", DISCOVERED.replace(
        "urls: [\"http://lookup-1.example:4161/lookup?topic=orders\"]", "urls: []")))
    assert any("endpoints.discovery.endpoint" in p and "host" in p for p in problems("e", DISCOVERED.replace(
        "{address}", "{host}")))
    assert any("endpoints[0].minPending" in p and ">= 1" in p for p in problems("f", OVERFLOW.replace(
        "- http://us-east.example/orders", "- {url: http://e.example/o, minPending: 0}")))


def test_live_edits_and_reactivation_keep_the_lease_count_and_never_send_to_an_endpoint_it_does_not_know(tmp_path):
    config, store = setup(tmp_path, PINNED_SUBSCRIPTION.replace(
        "endpoints: [", "endpoints: [http://zero.example/orders, "))
    billing = config.subscription("shop.orders.billing")
    clock = Clock()
    priority = board(store, clock)
    priority.configure(config.subscriptions)
    old_round = priority.lease(billing)
    assert old_round.index == 0
    # suspended, then activated again while old_round still runs: the same group goes on
    priority.configure([])
    assert priority.lease(billing) == HELD and priority.pins() == {}
    priority.configure(config.subscriptions)
    new_round = priority.lease(billing)
    priority.release("shop.orders.billing", old_round, None)
    unpin(store, "shop.orders.billing", "ops", clock.ms + 1)
    priority.poll()
    assert priority.holds("shop.orders.billing")
    assert recorded_state(store, "shop.orders.billing")["unpinned"] is not None
    assert recorded_state(store, "shop.orders.billing")["endpoint"] == "http://zero.example/orders", \
        "no switch while new_round still sends to the old pin"
    priority.release("shop.orders.billing", new_round, None)
    assert recorded_state(store, "shop.orders.billing")["endpoint"] == "http://primary.example/orders"
    # an edit reorders the endpoints: a round planned before the groups know it sits out, none is misdirected
    reordered = load_config(write_conf(tmp_path / "reordered", subscriptions={"billing": PINNED_SUBSCRIPTION.replace(
        'endpoints: [http://primary.example/orders, "http://ops:s3cret@standby.example/orders"]',
        'endpoints: ["http://ops:s3cret@standby.example/orders", http://primary.example/orders, '
        'http://zero.example/orders]')}))
    edited = reordered.subscription("shop.orders.billing")
    assert priority.lease(edited) == HELD
    priority.configure(reordered.subscriptions)
    pin = priority.lease(edited)
    assert edited.endpoint_urls[pin.index] == "http://primary.example/orders", "the same endpoint, its new place"


def test_an_idle_round_never_times_the_pin_out(tmp_path):
    config, store, billing, clock, priority = pinned_job(tmp_path)
    priority.configure(config.subscriptions)
    priority.release("shop.orders.billing", priority.lease(billing), PinNews(None, T0))  # a 400, say
    clock.ms += 60_000
    priority.release("shop.orders.billing", priority.lease(billing), None)  # nothing to send since
    assert not priority.holds("shop.orders.billing")
    assert recorded_state(store, "shop.orders.billing")["unpinned"] is None


def test_a_job_that_lost_its_lease_switches_no_pin(tmp_path):
    config, store, billing, clock, priority = pinned_job(tmp_path)
    priority.configure(config.subscriptions)
    before = recorded_state(store, "shop.orders.billing")
    priority.freeze()
    pin = priority.lease(billing)
    clock.ms += 5000
    priority.release("shop.orders.billing", pin, PinNews(None, T0))
    assert priority.lease(billing) == HELD, "it gives the pin up in memory (it stops sending there)"
    assert recorded_state(store, "shop.orders.billing") == before, "but records nothing"


def test_a_new_pin_is_not_throttled_by_what_the_old_one_taught_the_flow_controller(tmp_path):
    from herald.delivery.flow import FlowMode, FlowState
    from herald.engine.round.state import SubscriptionState

    config, _ = setup(tmp_path)
    state = SubscriptionState(config.subscription("shop.orders.billing"))
    state.pinned_to("pin-1")
    state.flow = FlowState(FlowMode.HEARTBEAT, 0.5, 1_800_000_060_000)  # the old pin kept failing
    state.pinned_to("pin-1")
    assert state.flow.mode is FlowMode.HEARTBEAT, "the same pin: its flow state stays"
    state.pinned_to("pin-2")
    assert state.flow == FlowState(), "a new pin starts at full speed"


def test_a_discovery_block_never_shows_its_passwords(tmp_path):
    secret = DISCOVERED.replace("http://lookup-1.example", "http://ops:pw-lookup@lookup-1.example").replace(
        "http://{address}", "http://svc:pw-endpoint@{address}")
    discovery = load_config(write_conf(tmp_path, subscriptions={"billing": secret})).subscription(
        "shop.orders.billing").discovery
    shown = repr(discovery) + str(discovery)
    assert "pw-lookup" not in shown and "pw-endpoint" not in shown and "ops:*****@lookup-1" in shown


def test_rounds_lease_while_a_pin_is_being_recorded(tmp_path):
    """Every round of every topic asks `lease` (under its topic's lock): a switch whose record is slow (storage
    down, a delta-spark commit of seconds) must not make them wait. Here the store's write blocks until the test
    lets it go; a lease from another thread returns first, and the switching subscription sits rounds out."""
    import threading

    config, store, billing, clock, priority = pinned_job(tmp_path)
    priority.configure(config.subscriptions)
    pinned = priority.lease(billing)
    writing, let_go = threading.Event(), threading.Event()
    append = store.append

    def slow_append(table, rows):
        writing.set()
        assert let_go.wait(30)
        append(table, rows)

    store.append = slow_append
    clock.ms += 1500
    releasing = threading.Thread(target=priority.release, args=(
        "shop.orders.billing", pinned, PinNews(None, T0 + 100)))  # a timeout: unpinned, then the next pin
    releasing.start()
    assert writing.wait(10), "the release records what it decided"
    leased: list = []
    asking = threading.Thread(target=lambda: leased.append((priority.lease(billing),
                                                            priority.holds("shop.orders.billing"))))
    asking.start()
    asking.join(10)
    finished_first = not asking.is_alive()
    let_go.set()
    releasing.join(30)
    asking.join(30)
    assert finished_first, "a lease waited for the table"
    assert leased == [(HELD, True)], "while its pin changes hands it sits rounds out"
    assert priority.lease(billing).index == 1, "then the next endpoint is pinned"
