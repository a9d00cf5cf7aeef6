"""The per-process consumer cache of the herald_kafka source: reuse, bounds, errors, expiry and fork.

Real confluent-kafka consumers, never connected: nothing listens on their bootstrap address and none is asked for
anything but assign/unassign/close.
"""

from __future__ import annotations

import os

import pytest

from herald.source.consumers import CONSUMERS, IDLE_TIMEOUT_S, ConsumerCache
from tests.support.clock import FakeClock

CONFIG = {"bootstrap.servers": "127.0.0.1:9", "log_level": "0"}  # librdkafka: no connect-failure logs


@pytest.fixture
def cache():
    created = ConsumerCache()
    yield created
    created.clear()


def lent(cache: ConsumerCache, capacity: int = 4, config=CONFIG, prefix: str = "p"):
    """The consumer of one lease that ends normally."""
    with cache.lease(config, prefix, capacity) as consumer:
        return consumer


def test_a_consumer_is_reused_by_the_next_lease_with_the_same_key(cache):
    first = lent(cache)
    assert lent(cache) is first
    assert (cache.stats().created, cache.stats().reused, cache.stats().idle) == (1, 1, 1)


def test_client_config_and_group_prefix_are_the_key(cache):
    first = lent(cache)
    assert lent(cache, config={**CONFIG, "client.id": "other"}) is not first
    assert lent(cache, prefix="q") is not first
    assert lent(cache) is first
    assert cache.stats().created == 3


def test_idle_consumers_are_bounded_least_recently_used_first(cache):
    one, two, three = (cache.lease(CONFIG, "p", 2) for _ in range(3))
    for lease in (one, two, three):  # all three were out at once: three consumers
        with lease:
            pass
    assert (cache.stats().created, cache.stats().idle, cache.stats().closed) == (3, 2, 1)
    assert lent(cache, capacity=2) is three.consumer  # the most recently returned one serves first
    assert lent(cache, capacity=2) is three.consumer


def test_capacity_zero_keeps_nothing(cache):
    assert lent(cache, capacity=0) is not lent(cache, capacity=0)
    assert (cache.stats().created, cache.stats().closed, cache.stats().idle) == (2, 2, 0)


def test_a_consumer_whose_lease_raised_is_closed_not_reused(cache):
    with pytest.raises(RuntimeError, match="read failed"):
        with cache.lease(CONFIG, "p", 4) as failed:
            raise RuntimeError("read failed")
    assert (cache.stats().closed, cache.stats().idle) == (1, 0)
    assert lent(cache) is not failed


def test_an_abandoned_reader_closes_its_consumer(cache):
    def reader():
        with cache.lease(CONFIG, "p", 4):
            yield 1
            yield 2

    records = reader()
    assert next(records) == 1
    records.close()  # Spark stopped reading part-way (a LIMIT, a failed task): position unknown
    assert (cache.stats().closed, cache.stats().idle) == (1, 0)


def test_a_consumer_idle_too_long_is_closed_instead_of_reused():
    clock = FakeClock()
    cache = ConsumerCache(clock=clock)
    first = lent(cache)
    clock.now += IDLE_TIMEOUT_S - 1
    assert lent(cache) is first
    clock.now += IDLE_TIMEOUT_S + 1
    assert lent(cache) is not first
    assert (cache.stats().created, cache.stats().closed) == (2, 1)
    cache.clear()


def test_a_forked_child_does_not_inherit_the_parents_consumers():
    with CONSUMERS.lease(CONFIG, "fork-test", 4):
        pass
    assert CONSUMERS.stats().idle >= 1
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        os._exit(0 if CONSUMERS.stats().idle == 0 and CONSUMERS.stats().created == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert CONSUMERS.stats().idle >= 1  # the parent keeps its own
    CONSUMERS.clear()
