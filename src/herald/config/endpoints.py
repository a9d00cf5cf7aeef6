"""Where a subscription's messages go, beyond one URL: endpoint entries with overflow conditions, endpoints found
by discovery, and the priority policy that chooses among them (docs/design.md §6; NATS priority groups, NSQ's
lookupd polling). Units as in the YAML: milliseconds.
"""

from __future__ import annotations

import string
from typing import Annotated, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag, field_validator

from herald.config.base import Strict
from herald.endpoint import Endpoint, mask_secrets

TEMPLATE_FIELDS = ("address", "port")


def checked_url(value: str) -> str:
    """An endpoint URL, checked (placeholders included); the error masks its password."""
    Endpoint.parse(value)
    return value


Url = Annotated[str, AfterValidator(checked_url)]


class EndpointEntry(Strict):
    """An endpoint with conditions (priority overflow): it is served only while the subscription's pending
    messages reach `minPending` or its in-flight requests reach `minInflight` (either suffices)."""

    url: Url
    minPending: Annotated[int, Field(ge=1)] | None = None
    minInflight: Annotated[int, Field(ge=1)] | None = None

    @property
    def conditional(self) -> bool:
        return self.minPending is not None or self.minInflight is not None


class Discovery(Strict):
    """Endpoints found by polling lookup services (NSQ lookupd): each URL is asked every `pollIntervalMs`
    (jittered by up to `jitter` x the interval); an answer is a JSON list of endpoint URLs, or lookupd's
    `producers` (`broadcast_address`, `http_port`) made into URLs by the `endpoint` template. `timeoutMs`: how
    long one lookup request may take."""

    urls: Annotated[list[Url], Field(min_length=1, max_length=20)]
    pollIntervalMs: Annotated[int, Field(ge=1000, le=86_400_000)] = 60_000
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.3
    endpoint: str | None = None
    timeoutMs: Annotated[int, Field(ge=100, le=60_000)] = 5_000

    @field_validator("endpoint")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as error:
            raise ValueError(f"not a template: {error}") from None
        unknown = names - set(TEMPLATE_FIELDS)
        if unknown:
            raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; a template may use {{address}} and {{port}}")
        checked_url(value.format(address="host.example", port=80))
        return value

    def __repr__(self) -> str:  # lookups and the template may hold passwords: never shown
        return (f"Discovery(urls={[mask_secrets(url) for url in self.urls]!r}, pollIntervalMs={self.pollIntervalMs}, "
                f"jitter={self.jitter}, endpoint={mask_secrets(self.endpoint or '')!r}, timeoutMs={self.timeoutMs})")

    __str__ = __repr__

    def fill(self, address: str, port: int) -> str:
        """An endpoint URL from a lookupd producer (needs `endpoint`)."""
        return self.endpoint.format(address=address, port=port)


class DiscoveredEndpoints(Strict):
    discovery: Discovery


class Priority(Strict):
    """Which of a subscription's endpoints gets its traffic.

    policy pinned: every attempt goes to ONE endpoint, the pinned one (first in the list at the very start),
    with a `Herald-Pin-Id` header; it keeps the pin until it has accepted nothing (no 2xx) for `timeoutMs`
    milliseconds while it had messages to take, or an operator unpins it (`herald unpin`); then the next
    endpoint in list order is pinned, once the old one's requests have ended.
    policy overflow: the endpoints without conditions always come first; one with `minPending` / `minInflight`
    is served only while the subscription's backlog or in-flight requests reach them.
    """

    policy: Literal["pinned", "overflow"]
    timeoutMs: Annotated[int, Field(ge=1000, le=86_400_000)] = 120_000


UNION_TAGS = ("url", "entry", "list", "discovered")
"""The tags of the unions below: a problem's key leaves them out (`endpoints[1].minPending`, not
`endpoints.list[1].entry.minPending`)."""

EndpointItem = Annotated[Annotated[Url, Tag("url")] | Annotated[EndpointEntry, Tag("entry")],
                         Discriminator(lambda value: "url" if isinstance(value, str) else "entry")]
EndpointList = Annotated[list[EndpointItem], Field(min_length=1, max_length=100)]
Endpoints = Annotated[Annotated[EndpointList, Tag("list")] | Annotated[DiscoveredEndpoints, Tag("discovered")],
                      Discriminator(lambda value: "list" if isinstance(value, list) else "discovered")]
