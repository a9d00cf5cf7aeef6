"""The senders' HTTP transport: one small, non-blocking interface with two implementations.

A task's delivery loop starts attempts and polls for finished ones; it never blocks on one request, so one
loop (one thread) serves every subscription of a task. Both implementations answer with the same types, so
classification (`herald.delivery.outcome.classify`) is the same whichever runs:

- `curl` (`herald.delivery.transport.curl`): libcurl's multi interface through pycurl. One multi handle per
  transport for every subscription, easy handles reused per endpoint, no threads. The default.
- `requests` (`herald.delivery.transport.threaded`): requests' HTTPAdapter on a bounded thread pool, for
  where pycurl cannot load.

Semantics on both (docs/design.md §4):

- `request_timeout_s` is a total for the attempt (connect, send, wait, read);
- `socket_timeout_s` (0 = none) is an idle limit while the answer is awaited and read (libcurl checks it
  to the second: see `curl`);
- `abort` ends an open attempt at once, unanswered (the delivery loop's grace at a settle ran out): its connection
  is closed, never reused, and `poll` never returns it, even when its answer arrives later, so a late answer is
  never taken for another attempt's;
- redirects are never followed (a 3xx is an answer to classify); no `Expect: 100-continue`;
- the headers are sent as given (the Authorization header carries Basic auth from the endpoint);
- the answer's `Retry-After` header is returned as text; its body is read (up to a limit) and dropped;
- proxies, cookies and .netrc from the environment are never used;
- https: the server's certificate and host name are always verified, against the request's `tls.ca_bundle` or
  certifi's CAs, and `tls`'s client certificate is shown when the server asks (`herald.delivery.tls`); a
  failed handshake is a `tls_failure`. Connections are reused only by requests with equal `tls`.

Only configuration crosses a process boundary: a transport is created in the task (`open_transport`).

Example::

    transport = open_transport("auto", max_open=64)
    transport.start(HttpRequest("http://127.0.0.1:8080/hook", ("Content-Type: application/json",), b"{}",
                                request_timeout_s=1.0), token="m-1")
    while transport.open:
        for token, result in transport.poll(timeout_s=0.5):
            ...  # result is an HttpAnswer or a TransportFailure
    transport.close()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass

from herald.delivery.outcome import FailureKind, TransportFailure
from herald.delivery.tls import TlsSettings, tls_detail
from herald.endpoint import mask_secrets

MAX_ANSWER_BODY_BYTES = 64 * 1024
"""Answer bodies are read (so the connection stays reusable) up to this size, and dropped."""


@dataclass(frozen=True)
class HttpAnswer:
    """A complete HTTP answer: its status and its Retry-After header (None when absent)."""

    status: int
    retry_after: str | None = None


@dataclass(frozen=True)
class HttpRequest:
    """One attempt: POST `body` to `url` with `header_lines` ("Name: value", exactly as sent).

    request_timeout_s: total time for the attempt, seconds.
    socket_timeout_s: longest silence while the answer is awaited or read, seconds; 0 means none.
    tls: whom an https attempt trusts and the client certificate it shows (None: certifi's CAs, none shown).
    """

    url: str
    header_lines: tuple[str, ...]
    body: bytes
    request_timeout_s: float = 1.0
    socket_timeout_s: float = 0.0
    tls: TlsSettings | None = None

    def __repr__(self) -> str:  # header lines may carry Authorization: never shown
        return f"HttpRequest({self.url!r}, {len(self.body)} bytes)"


class Transport(ABC):
    """Starts attempts without blocking and reports them when they finish.

    At most `max_open` attempts are open at once; the caller checks `open < max_open` before `start`.
    Not thread-safe: one delivery loop owns a transport.
    """

    max_open: int

    @abstractmethod
    def start(self, request: HttpRequest, token: Hashable) -> None:
        """Begin one attempt; `token` identifies it in what `poll` returns. Never raises for network errors
        (they come back from `poll` as a TransportFailure)."""

    @abstractmethod
    def poll(self, timeout_s: float) -> list[tuple[Hashable, HttpAnswer | TransportFailure]]:
        """Attempts finished since the last call; waits up to `timeout_s` seconds for at least one when none
        has finished yet (returns at once when nothing is open)."""

    @abstractmethod
    def abort(self, token: Hashable) -> TransportFailure | None:
        """End the open attempt `token` now, unanswered: it is closed with its connection, and `poll` never returns
        it. Returns what it counts as (`aborted_failure`), or None when no attempt of `token` is open. Tokens of
        open attempts are distinct."""

    @property
    @abstractmethod
    def open(self) -> int:
        """Attempts started and not yet returned by `poll` nor aborted."""

    @abstractmethod
    def close(self) -> None:
        """Abort what is open and release connections and handles (idempotent)."""


def timeout_failure(request: HttpRequest, elapsed_s: float) -> TransportFailure:
    """A timed-out attempt, `elapsed_s` seconds after it started. It is the idle limit's when the attempt ended
    well before the total (under 95% of `request_timeout_s`), the total's otherwise."""
    idle = request.socket_timeout_s > 0 and elapsed_s < request.request_timeout_s * 0.95
    limit_ms = (request.socket_timeout_s if idle else request.request_timeout_s) * 1000
    limit = f"idle for {limit_ms:.0f} ms" if idle else f"{limit_ms:.0f} ms"
    return TransportFailure(FailureKind.TIMEOUT, f"Timeout: no complete answer, {limit} elapsed")


def aborted_failure(elapsed_s: float) -> TransportFailure:
    """An attempt aborted unanswered `elapsed_s` seconds after it started (`Transport.abort`): a timeout."""
    return TransportFailure(FailureKind.TIMEOUT,
                            f"Timeout: no complete answer when its round ended, {elapsed_s * 1000:.0f} ms elapsed")


def connection_failure(detail: str) -> TransportFailure:
    """Any other failure to get an answer; `detail` is the client's short description (passwords masked)."""
    return TransportFailure(FailureKind.CONNECTION, f"Connection error: {mask_secrets(detail)}")


def tls_failure(detail: str) -> TransportFailure:
    """A failed TLS handshake (a certificate that does not verify, a client certificate refused or unreadable);
    `detail` is the client's text, said the same way on both transports (`herald.delivery.tls.tls_detail`)."""
    return TransportFailure(FailureKind.TLS, f"TLS: {mask_secrets(tls_detail(detail))}")


TRANSPORTS = ("auto", "curl", "requests")


def open_transport(kind: str = "auto", max_open: int = 256) -> Transport:
    """A transport of `kind`: 'curl', 'requests', or 'auto' (curl when pycurl loads, else requests).

    Raises ValueError for an unknown kind and RuntimeError when 'curl' is asked for and pycurl cannot load.
    """
    if kind not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {kind!r}")
    if kind in ("auto", "curl"):
        try:
            from herald.delivery.transport.curl import CurlTransport
        except ImportError as error:
            if kind == "curl":
                raise RuntimeError(f"transport 'curl' needs pycurl, which cannot load here: {error}") from error
        else:
            return CurlTransport(max_open)
    from herald.delivery.transport.threaded import ThreadedTransport

    return ThreadedTransport(max_open)
