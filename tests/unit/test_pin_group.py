"""The pin's state machine (herald.engine.endpoints.pin_group): who is pinned, when the pin is lost, and what comes
next."""

from herald.engine.endpoints.pin_group import (
    ADMIN,
    ENDPOINT_REMOVED,
    PINNED,
    START,
    TIMEOUT,
    UNPINNED,
    Advisory,
    PinGroup,
    PinNews,
)

ENDPOINTS = ("http://primary/orders", "http://standby/orders", "http://third/orders")
T0 = 1_800_000_000_000


def started(timeout_ms=120_000, endpoints=ENDPOINTS) -> PinGroup:
    group = PinGroup("g.t.s", endpoints, timeout_ms)
    assert group.restore(None, None, T0) is None
    group.take(group.next_pin(T0))
    return group


def test_the_first_start_pins_the_first_endpoint_and_nothing_is_sent_before():
    group = PinGroup("g.t.s", ENDPOINTS, 120_000)
    group.restore(None, None, T0)
    assert group.lease() is None and group.due()
    pinned = group.next_pin(T0)
    assert (pinned.type, pinned.endpoint, pinned.reason) == (PINNED, ENDPOINTS[0], START)
    assert group.lease() is None, "next_pin changes nothing until it is recorded and taken"
    group.take(pinned)
    pin = group.lease()
    assert (pin.index, pin.pin_id, pin.refused_since_ms) == (0, pinned.pin_id, None)
    assert len(pinned.pin_id) == 22


def test_a_restart_keeps_the_same_endpoint_and_pin_id():
    before = Advisory(PINNED, "g.t.s", ENDPOINTS[1], "pin-1", TIMEOUT, T0)
    group = PinGroup("g.t.s", ENDPOINTS, 120_000)
    assert group.restore(before, None, T0 + 5000) is None
    assert not group.due()
    pin = group.lease()
    assert (pin.index, pin.pin_id) == (1, "pin-1") and group.since_ms == T0


def test_a_restart_after_an_unpin_pins_the_next_endpoint_with_the_unpins_reason_wrapping_round():
    pinned = Advisory(PINNED, "g.t.s", ENDPOINTS[2], "pin-1", START, T0)
    unpinned = Advisory(UNPINNED, "g.t.s", ENDPOINTS[2], "pin-1", ADMIN, T0 + 10)
    group = PinGroup("g.t.s", ENDPOINTS, 120_000)
    assert group.restore(pinned, unpinned, T0 + 20) is None, "the unpin is recorded already"
    assert group.lease() is None and group.due()
    nxt = group.next_pin(T0 + 20)
    assert (nxt.endpoint, nxt.reason) == (ENDPOINTS[0], ADMIN) and nxt.pin_id != "pin-1"


def test_a_pinned_endpoint_removed_while_no_job_ran_is_unpinned_and_recorded():
    pinned = Advisory(PINNED, "g.t.s", "http://gone/orders", "pin-1", START, T0)
    group = PinGroup("g.t.s", ENDPOINTS, 120_000)
    advisory = group.restore(pinned, None, T0 + 1)
    assert (advisory.type, advisory.endpoint, advisory.reason) == (UNPINNED, "http://gone/orders", ENDPOINT_REMOVED)
    nxt = group.next_pin(T0 + 1)
    assert (nxt.endpoint, nxt.reason) == (ENDPOINTS[0], ENDPOINT_REMOVED)


def test_the_pin_times_out_after_timeout_ms_of_refusals_and_switches_once_its_rounds_ended():
    group = started(timeout_ms=1000)
    stream, retries = group.lease(), group.lease()
    assert group.release(stream, PinNews(None, T0 + 100), T0 + 1099) is None, "refused for 999 ms only"
    stream = group.lease()
    unpinned = group.release(stream, PinNews(None, T0 + 500), T0 + 1100)
    assert (unpinned.type, unpinned.reason, unpinned.endpoint) == (UNPINNED, TIMEOUT, ENDPOINTS[0])
    assert group.lease() is None, "no new round sends to a pin being given up"
    assert not group.due(), "the retry round still sends to the old endpoint"
    assert group.release(retries, None, T0 + 1200) is None
    assert group.due()
    nxt = group.next_pin(T0 + 1200)
    assert (nxt.endpoint, nxt.reason) == (ENDPOINTS[1], TIMEOUT)
    group.take(nxt)
    pin = group.lease()
    assert pin.index == 1 and pin.refused_since_ms is None


def test_a_2xx_restarts_the_clock_and_an_idle_endpoint_never_times_out():
    group = started(timeout_ms=1000)
    pin = group.lease()
    group.release(pin, PinNews(accepted_ms=T0 + 900, refused_since_ms=T0 + 100), T0 + 1000)
    assert group.refused_since_ms == T0 + 900, "refused only since its last 2xx"
    pin = group.lease()
    assert pin.refused_since_ms == T0 + 900
    assert group.release(pin, PinNews(T0 + 1500, None), T0 + 1600) is None
    assert group.refused_since_ms is None
    pin = group.lease()
    assert group.release(pin, None, T0 + 60_000) is None, "no messages to take: no timeout"
    assert group.lease() is not None


def test_refusals_carry_over_rounds_until_the_timeout():
    group = started(timeout_ms=1000)
    group.release(group.lease(), PinNews(None, T0 + 100), T0 + 400)
    assert group.release(group.lease(), PinNews(None, T0 + 600), T0 + 900) is None
    assert group.refused_since_ms == T0 + 100, "the older streak still runs"
    assert group.release(group.lease(), PinNews(None, T0 + 950), T0 + 1100).reason == TIMEOUT


def test_merge_takes_the_last_2xx_and_the_oldest_running_refusal():
    assert PinNews.merge([]) is None
    merged = PinNews.merge([PinNews(T0 + 10, None), PinNews(None, T0 + 5), PinNews(T0 + 3, T0 + 8)])
    assert merged == PinNews(T0 + 10, T0 + 5)
    assert PinNews.merge([PinNews(T0 + 1, None)]) == PinNews(T0 + 1, None)


def test_unpin_names_the_pin_it_gives_up():
    group = started()
    assert group.unpin(ADMIN, T0 + 1, pin_id="another") is None
    advisory = group.unpin(ADMIN, T0 + 1, pin_id=group.pin_id)
    assert (advisory.reason, advisory.endpoint) == (ADMIN, ENDPOINTS[0])
    assert group.unpin(ADMIN, T0 + 2) is None, "given up once"
    nxt = group.next_pin(T0 + 1)
    assert nxt.at_ms > advisory.at_ms, "the new pin comes after the unpin, even in the same millisecond"


def test_an_edit_that_drops_the_pinned_endpoint_unpins_it_and_one_that_reorders_keeps_it():
    group = started()
    group.take(Advisory(PINNED, "g.t.s", ENDPOINTS[1], "pin-2", TIMEOUT, T0))
    assert group.reconfigure((ENDPOINTS[1], ENDPOINTS[0]), 5000, T0 + 1) is None
    assert group.lease().index == 0 and group.timeout_ms == 5000
    group.rounds = 0
    advisory = group.reconfigure((ENDPOINTS[0], ENDPOINTS[2]), 5000, T0 + 2)
    assert (advisory.reason, advisory.endpoint) == (ENDPOINT_REMOVED, ENDPOINTS[1])
    assert group.lease() is None
    assert group.next_pin(T0 + 3).endpoint == ENDPOINTS[0]


def test_a_round_of_an_earlier_pin_changes_nothing_of_the_new_one():
    group = started(timeout_ms=1000)
    old = group.lease()
    group.rounds = 0  # as if the group had been rebuilt while the round ran
    group.unpin(ADMIN, T0)
    group.take(group.next_pin(T0))
    assert group.release(old, PinNews(None, T0), T0 + 5000) is None
    assert group.rounds == 0 and group.refused_since_ms is None


def test_the_advisory_message_is_shaped_like_nats_consumer_group_advisories():
    from herald.engine.endpoints.advisories import advisory_message

    message = advisory_message(Advisory(UNPINNED, "g.t.s", "http://u:*****@h/o", "pin-1", TIMEOUT, T0 + 5))
    assert message["type"] == "io.herald.advisory.v1.unpinned"
    assert message["timestamp"] == "2027-01-15T08:00:00.005Z"
    assert (message["subscription"], message["endpoint"], message["pinned_id"], message["reason"]) == (
        "g.t.s", "http://u:*****@h/o", "pin-1", "timeout")
    assert len(message["id"]) == 32


def test_a_lane_tries_the_pinned_endpoint_before_it_gives_it_up_whatever_streak_it_inherits():
    from herald.delivery.pin import PinPlan, PinWatch

    watch = PinWatch(PinPlan("pin-1", timeout_ms=1000, refused_since_ms=T0))
    assert not watch.expired(T0 + 60_000) and watch.news() is None, "no answer in this task yet"
    watch.answer(False, T0 + 60_000)
    assert watch.expired(T0 + 60_000) and watch.news() == (None, T0), "the inherited streak counts once it refuses"
    fresh = PinWatch(PinPlan("pin-1", timeout_ms=1000, refused_since_ms=None))
    fresh.answer(False, T0)
    assert not fresh.expired(T0 + 999) and fresh.expired(T0 + 1000)
    fresh.answer(True, T0 + 1001)
    assert not fresh.expired(T0 + 5000) and fresh.news() == (T0 + 1001, None)
    assert PinPlan("pin-1", 1000, None).header_line == "Herald-Pin-Id: pin-1"
