"""Endpoints found by polling lookup services (NSQ's lookupd polling, docs/design.md §7).

A subscription with `endpoints: {discovery: {urls, pollIntervalMs, jitter, endpoint, timeoutMs}}` is delivered
to the endpoints its lookup URLs name. This module has the pure parts, clocked by their callers, and the job's
poller:

- `parse_answer`: one answer made into endpoint URLs: a JSON list of URLs, or lookupd's `{"producers": [...]}`
  (also inside lookupd's older `{"data": {...}}` wrapper), each producer's `broadcast_address` and `http_port`
  put into the `endpoint` template. Anything else is garbage (`ValueError`);
- `EndpointSet`: the union of every lookup URL's last good answer, keyed by URL. A lookup that fails keeps its
  last good answer, so an outage of every lookup keeps the set; an empty answer from all of them empties it;
- `PollSchedule`: when a lookup URL is polled next (monotonic seconds): at once when the job starts delivering
  the subscription (its first round waits for that answer, as go-nsq's consumer queries lookupd when it
  connects), then, as go-nsq's poll loop, after `pollIntervalMs` plus a random part of `jitter x
  pollIntervalMs`, then every `pollIntervalMs` jittered by up to +-jitter/2 of it, so that jobs started
  together do not poll together;
- `Discoveries` (in `herald.engine.endpoints.discoveries`): the sets of the job's subscriptions and the thread
  polling them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from herald.config.endpoints import Discovery
from herald.endpoint import Endpoint


def parse_answer(body: bytes | str, discovery: Discovery) -> tuple[str, ...]:
    """The endpoint URLs of one lookup answer (in the answer's order, without repeats). Raises ValueError, with
    why, for anything that is not a JSON list of http(s) URLs or lookupd's producers (then `discovery.endpoint`
    must be set)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"not JSON: {error}") from None
    if isinstance(data, dict) and isinstance(data.get("data"), dict) and "producers" not in data:
        data = data["data"]  # lookupd before 1.0: {"status_code": 200, "data": {"producers": [...]}}
    if isinstance(data, list):
        urls = [_url(item) for item in data]
    elif isinstance(data, dict) and isinstance(data.get("producers"), list):
        if discovery.endpoint is None:
            raise ValueError("the answer is lookupd's producers, and endpoints.discovery.endpoint (the template "
                             "that makes them URLs) is not set")
        urls = [_filled(producer, discovery) for producer in data["producers"]]
    else:
        raise ValueError("neither a JSON list of URLs nor lookupd's {\"producers\": [...]}")
    return tuple(dict.fromkeys(urls))


def _url(item) -> str:
    if not isinstance(item, str):
        raise ValueError(f"a list item is not a URL string: {type(item).__name__}")
    Endpoint.parse(item)  # raises ValueError, the URL masked
    return item


def _filled(producer, discovery: Discovery) -> str:
    if not isinstance(producer, dict):
        raise ValueError("a producer is not a JSON object")
    address, port = producer.get("broadcast_address"), producer.get("http_port")
    if not isinstance(address, str) or not address or isinstance(port, bool) or not isinstance(port, int):
        raise ValueError("a producer lacks broadcast_address (text) or http_port (a number)")
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"  # an IPv6 address in a URL
    return _url(discovery.fill(address, port))


@dataclass(frozen=True)
class Change:
    """How a set changed: endpoints added and removed (URLs as answered: never show them; see `shown`)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    before: tuple[str, ...]
    after: tuple[str, ...]

    @staticmethod
    def shown(urls: tuple[str, ...]) -> list[str]:
        return [Endpoint.parse(url).masked for url in urls]


class EndpointSet:
    """One subscription's discovered endpoints: the union of each lookup URL's last good answer, keyed by URL,
    sorted by the URL as people see it (so the order does not move with the order of answers). Not thread-safe:
    its owner locks."""

    def __init__(self, lookups: list[str]) -> None:
        self.lookups = list(lookups)
        self.answers: dict[str, tuple[str, ...]] = {}  # lookup URL -> its last good answer
        self.errors: dict[str, str] = {}  # lookup URL -> why its last poll failed (none while it answers)
        self.endpoints: tuple[str, ...] = ()

    @property
    def answered(self) -> bool:
        """Some lookup has answered at least once."""
        return bool(self.answers)

    def answer(self, lookup: str, urls: tuple[str, ...]) -> Change | None:
        """A good answer of `lookup`; the change it makes to the set, or None."""
        self.answers[lookup] = tuple(urls)
        self.errors.pop(lookup, None)
        return self._merge()

    def failed(self, lookup: str, error: str) -> None:
        """A failed poll (or garbage): the lookup keeps its last good answer."""
        self.errors[lookup] = error

    def forget(self, lookups: list[str]) -> Change | None:
        """The lookup URLs are now `lookups` (an edit): answers of those no longer listed leave the set."""
        self.lookups = list(lookups)
        for lookup in set(self.answers) - set(lookups):
            del self.answers[lookup]
        for lookup in set(self.errors) - set(lookups):
            del self.errors[lookup]
        return self._merge()

    def named_by(self, url: str) -> list[str]:
        """The lookup URLs whose last good answer names `url`."""
        return [lookup for lookup in self.lookups if url in self.answers.get(lookup, ())]

    def _merge(self) -> Change | None:
        union = {url for lookup in self.lookups for url in self.answers.get(lookup, ())}
        after = tuple(sorted(union, key=lambda url: (Endpoint.parse(url).masked, url)))
        before, self.endpoints = self.endpoints, after
        if after == before:
            return None
        return Change(tuple(u for u in after if u not in before), tuple(u for u in before if u not in after),
                      before, after)


class PollSchedule:
    """When each lookup URL of one subscription is polled next, in monotonic seconds. `rng`: the randomness of
    the jitter (a seeded `random.Random` in tests)."""

    def __init__(self, discovery: Discovery, now_s: float, rng: random.Random) -> None:
        self.interval_s = discovery.pollIntervalMs / 1000
        self.jitter = discovery.jitter
        self.rng = rng
        self.due_s: dict[str, float] = {url: now_s for url in discovery.urls}  # the first look: at once
        self.polls: dict[str, int] = {url: 0 for url in discovery.urls}

    def due(self, now_s: float) -> list[str]:
        return [url for url, due in self.due_s.items() if due <= now_s]

    def next_due_s(self) -> float | None:
        return min(self.due_s.values(), default=None)

    def polled(self, url: str, now_s: float) -> float:
        """`url` was just polled: when it is polled next (returned too)."""
        if url not in self.due_s:
            return now_s
        count = self.polls[url] = self.polls[url] + 1
        if count == 1:  # after the first look: the interval plus a random part of jitter x interval
            delay = self.interval_s * (1 + self.rng.random() * self.jitter)
        else:  # then every interval, jittered by up to +-jitter/2 of it
            delay = self.interval_s * (1 + (self.rng.random() - 0.5) * self.jitter)
        self.due_s[url] = now_s + delay
        return self.due_s[url]

    def taken(self, url: str) -> None:
        """A poll of `url` started: it is not due again until it ends (`polled`)."""
        self.due_s[url] = float("inf")
