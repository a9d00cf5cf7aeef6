"""A per-process cache of idle confluent-kafka consumers, so consecutive tasks of one Python worker share one.

Spark reuses its Python workers between tasks (``spark.python.worker.reuse``, true by default), so a worker that
read an offset range in one micro-batch reads its next range with the same consumer: broker connections (TCP,
TLS, SASL), metadata and the group coordinator are already there. Each read leases a consumer::

    lease = CONSUMERS.lease(client_config, "herald-source", capacity=4)   # KafkaException: invalid config
    with lease as consumer:
        consumer.assign([TopicPartition(topic, partition, start)])
        ...

When the block ends normally the consumer is unassigned (so it fetches nothing while idle) and kept for the next
lease with the same key: the client properties and the group id prefix. When the block raises (a read error, or
a reader abandoned part-way) the consumer is closed, never reused. At most `capacity` consumers stay idle in a
process (the least recently used is closed first; 0 keeps none), and one idle for longer than `IDLE_TIMEOUT_S`
seconds is closed instead of reused. A forked child forgets its parent's consumers (librdkafka's threads do
not survive a fork).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from herald.source.kafka_offsets import consumer_config

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 300.0
"""Seconds an idle consumer may wait for its next lease (Spark's spark.kafka.consumer.cache.timeout, 5 min)."""

_Key = tuple[tuple[tuple[str, str], ...], str]


def range_consumer_config(client_config: Mapping[str, str], group_id_prefix: str) -> dict[str, object]:
    """The config of a consumer that reads assigned offset ranges: partition-EOF events on, and an error
    (not a silent jump) when an assigned offset is out of range. A broker closing an idle consumer's connection
    (``connections.max.idle.ms``) is not logged unless `client_config` sets ``log.connection.close``."""
    config = consumer_config(client_config, group_id_prefix)
    config.update({"enable.partition.eof": True, "auto.offset.reset": "error"})
    config.setdefault("log.connection.close", False)
    return config


@dataclass(frozen=True)
class CacheStats:
    """Counts since the process started (or forked): consumers `created`, leases served by an idle one (`reused`),
    consumers `closed` (errored, evicted, expired or not kept), and how many are `idle` now."""

    created: int
    reused: int
    closed: int
    idle: int


_INHERITED: list = []
"""Consumers a forked child inherited from its parent: never used, never freed (see _forget_after_fork)."""


class ConsumerCache:
    """Idle consumers by key, least recently used first; thread-safe. `clock` gives seconds (monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: list[tuple[_Key, object, float]] = []  # (key, consumer, idle since), oldest first
        self._created = self._reused = self._closed = 0

    def lease(self, client_config: Mapping[str, str], group_id_prefix: str, capacity: int) -> Lease:
        """A consumer for `client_config` (librdkafka names) and `group_id_prefix`: an idle one, else a new one.

        `capacity` (>= 0) bounds the idle consumers kept when this lease ends. Raises confluent-kafka's
        KafkaException when a new consumer cannot be created (an invalid config).
        """
        key: _Key = (tuple(sorted((str(k), str(v)) for k, v in client_config.items())), group_id_prefix)
        now = self._clock()
        expired: list[object] = []
        consumer = None
        with self._lock:
            for item in list(self._idle):
                if now - item[2] > IDLE_TIMEOUT_S:
                    self._idle.remove(item)
                    expired.append(item[1])
            for item in reversed(self._idle):  # the most recently used one: its connections are the freshest
                if item[0] == key:
                    self._idle.remove(item)
                    consumer = item[1]
                    self._reused += 1
                    break
        self._close_all(expired)
        if consumer is None:
            from confluent_kafka import Consumer

            consumer = Consumer(range_consumer_config(client_config, group_id_prefix))
            with self._lock:
                self._created += 1
        return Lease(self, key, consumer, capacity)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._created, self._reused, self._closed, len(self._idle))

    def clear(self) -> None:
        """Close every idle consumer."""
        with self._lock:
            idle, self._idle = self._idle, []
        self._close_all([consumer for _, consumer, _ in idle])

    def _give_back(self, key: _Key, consumer, capacity: int) -> None:
        """Keep a consumer whose lease ended normally, unassigned, evicting beyond `capacity`."""
        try:
            consumer.unassign()
        except Exception:  # noqa: BLE001 - a consumer that cannot unassign is not reused
            log.debug("could not unassign a consumer; closing it", exc_info=True)
            self._close_all([consumer])
            return
        with self._lock:
            self._idle.append((key, consumer, self._clock()))
            evicted = [item[1] for item in self._idle[: max(0, len(self._idle) - capacity)]]
            del self._idle[: len(evicted)]
        self._close_all(evicted)

    def _close_all(self, consumers: list) -> None:
        for consumer in consumers:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the consumer is dropped either way
                log.debug("error closing a Kafka consumer", exc_info=True)
        if consumers:
            with self._lock:
                self._closed += len(consumers)

    def _forget_after_fork(self) -> None:
        """In a forked child: forget the parent's consumers, whose threads did not come along. They are kept
        referenced, never freed: librdkafka's destructor waits for those threads and would hang the child."""
        self._lock = threading.Lock()
        _INHERITED.extend(consumer for _, consumer, _ in self._idle)
        self._idle = []
        self._created = self._reused = self._closed = 0


class Lease:
    """One consumer lent by a `ConsumerCache`: a context manager that gives it back (ended normally) or closes it
    (ended by an exception, GeneratorExit included)."""

    def __init__(self, cache: ConsumerCache, key: _Key, consumer, capacity: int) -> None:
        self._cache = cache
        self._key = key
        self._capacity = capacity
        self.consumer = consumer

    def __enter__(self):
        return self.consumer

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc_type is None:
            self._cache._give_back(self._key, self.consumer, self._capacity)
        else:
            self._cache._close_all([self.consumer])
        return False


CONSUMERS = ConsumerCache()
"""This process's cache, used by `herald.source.fetch.read_offset_range`."""

os.register_at_fork(after_in_child=CONSUMERS._forget_after_fork)
