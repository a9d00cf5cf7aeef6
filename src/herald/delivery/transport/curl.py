"""The curl transport: libcurl's multi interface through pycurl, one thread for every open attempt.

One `CurlMulti` drives every attempt of the transport; easy handles are created on demand (never more than
`max_open`) and reused, kept idle per endpoint (scheme, host, port) and TLS settings so that a handle usually
goes back to the URL, timeouts and TLS options it already has and only the headers and body are set per
attempt. Connections are kept alive in the multi handle's cache, at most `max_open` of them; libcurl reuses
one only for an attempt with the same TLS options (CA file, client certificate).

Options of every attempt: POST, HTTP/1.1, no redirects, no `Expect: 100-continue`, no `Content-Type` added by
libcurl, no proxy (not even from the environment), no .netrc, no cookies, `User-Agent: Herald/<version>`,
no signals; for https the peer and its host name verified (SSL_VERIFYPEER, SSL_VERIFYHOST) against the
request's `tls.ca_bundle` or certifi's CA bundle (CAINFO), and its client certificate (SSLCERT, SSLKEY,
KEYPASSWD) when it has one. pycurl cannot unset a client certificate: a handle that had one is reset before it
serves an attempt without it. The answer's head is written into a buffer and searched for
Retry-After only; the body is counted and dropped (`MAX_ANSWER_BODY_BYTES` at most: a longer answer stops the
transfer, its connection is closed, and its status is still returned).

Timeouts (docs/design.md §4): `request_timeout_s` is libcurl's total timeout (TIMEOUT_MS). `socket_timeout_s` is
watched here, not by libcurl: every `_IDLE_CHECK_S` `poll` looks at the bytes each watched attempt has moved
(request, answer head, answer body) and aborts one that has moved none for that long once its request began
to go out (so the connect is bounded by the total only, as in the requests transport). Measured on 127.0.0.1:
an attempt whose server stops sending is cut 0.00-0.06 s after `socket_timeout_s`. libcurl's own low-speed
check (LOW_SPEED_LIMIT 1 byte/s for LOW_SPEED_TIME s) is not used: it averages over the last ~5 s including
the bytes sent, so with LOW_SPEED_TIME 1 s it fired 1.0 s after the last byte for an empty body, 4.0 s for a
3-byte body and 7.0 s for a 200-byte or larger one (libcurl 8.23).

`abort` removes an attempt's easy handle from the multi handle: libcurl stops the transfer and closes its
connection (an HTTP/1.1 answer not read to its end leaves it unusable), so nothing of that answer can reach
another attempt; the handle goes back to the idle ones.

Waiting uses select(2) (`CurlMulti.select`), which sees descriptors below FD_SETSIZE (1024) only: one wait
never lasts longer than libcurl's next timer nor `_MAX_WAIT_S`, so transfers on higher descriptors still
progress, that much later.

pycurl errors become `TransportFailure`s here and nowhere else: TLS ones (`_TLS_ERRORS`, `_TLS_IF_SAID`)
`tls_failure`s.
"""

from __future__ import annotations

import io
import time
from collections.abc import Hashable
from urllib.parse import urlsplit

import certifi
import pycurl

from herald import __version__
from herald.delivery.outcome import TransportFailure
from herald.delivery.tls import TlsSettings
from herald.delivery.transport import (
    MAX_ANSWER_BODY_BYTES,
    HttpAnswer,
    HttpRequest,
    Transport,
    aborted_failure,
    connection_failure,
    timeout_failure,
    tls_failure,
)

_MAX_WAIT_S = 0.05
"""Longest single wait in `poll`, seconds (see the module docstring: descriptors above FD_SETSIZE)."""

_IDLE_CHECK_S = 0.05
"""Seconds between two looks at the attempts that have an idle limit (`socket_timeout_s`)."""

_HEADER_LINES = ("Expect:", "Content-Type:")
"""libcurl's own headers switched off: `Expect: 100-continue` on large bodies, and the form Content-Type it
adds when the attempt's header lines carry none (a Content-Type among them is still sent)."""

_DEFAULT_PORTS = {"http": 80, "https": 443}

Endpoint = tuple[str, str, int]
"""(scheme, host, port)"""

Pool = tuple[str, str, int, TlsSettings | None]
"""(scheme, host, port, TLS settings): the handles idle for such attempts"""

_TLS_ERRORS = frozenset((
    pycurl.E_SSL_CONNECT_ERROR, pycurl.E_PEER_FAILED_VERIFICATION, pycurl.E_SSL_CERTPROBLEM, pycurl.E_SSL_CIPHER,
    pycurl.E_SSL_CACERT_BADFILE, pycurl.E_SSL_ISSUER_ERROR, pycurl.E_SSL_CRL_BADFILE,
    pycurl.E_SSL_PINNEDPUBKEYNOTMATCH, pycurl.E_SSL_INVALIDCERTSTATUS, pycurl.E_SSL_SHUTDOWN_FAILED,
    pycurl.E_USE_SSL_FAILED, getattr(pycurl, "E_SSL_CLIENTCERT", 98)))
"""libcurl's error codes of a failed TLS handshake or TLS setup"""

_TLS_IF_SAID = frozenset((pycurl.E_RECV_ERROR, pycurl.E_SEND_ERROR, pycurl.E_BAD_FUNCTION_ARGUMENT))
_TLS_WORDS = ("SSL", "certificate", "private key")
"""Errors that are TLS ones when their text says so: OpenSSL's alert after the handshake (TLS 1.3 refuses a
client certificate so), and libcurl 8's code for a client key it cannot load (a wrong passphrase)."""


class _Handle(pycurl.Curl):
    """An easy handle and what its current attempt needs back.

    url, timeout_ms, tls: what is set on the handle, so that only what changes is set again.
    head: the answer's head, as received. token, request: the attempt under way (None when idle).
    started: when the attempt under way started (monotonic seconds).
    moved, moved_at: for an attempt with an idle limit, the bytes it had moved at the last look, and since when
        (monotonic seconds).
    """

    __slots__ = ("pool", "url", "timeout_ms", "tls", "head", "token", "request", "started", "moved", "moved_at")


class CurlTransport(Transport):
    """Attempts over one pycurl `CurlMulti`, at most `max_open` at once, without threads."""

    def __init__(self, max_open: int = 256) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, not {max_open}")
        self.max_open = max_open
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, max_open)
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_open)
        self._handles: list[_Handle] = []
        self._idle: dict[Pool, list[_Handle]] = {}
        self._endpoints: dict[str, Endpoint] = {}  # url -> endpoint
        self._watched: dict[_Handle, None] = {}  # open attempts with an idle limit
        self._open_handles: dict[Hashable, _Handle] = {}  # token -> the handle of its open attempt
        self._next_idle_check = 0.0
        self._open = 0

    @property
    def open(self) -> int:
        return self._open

    def start(self, request: HttpRequest, token: Hashable) -> None:
        url = request.url
        endpoint = self._endpoints.get(url) or self._endpoint(url)
        handle = self._take((*endpoint, request.tls))
        if handle.tls != request.tls:
            _set_tls(handle, request.tls)
        if handle.url != url:
            handle.setopt(pycurl.URL, url)
            handle.url = url
        timeout_ms = max(1, round(request.request_timeout_s * 1000))
        if handle.timeout_ms != timeout_ms:
            handle.setopt(pycurl.TIMEOUT_MS, timeout_ms)
            handle.timeout_ms = timeout_ms
        handle.setopt(pycurl.HTTPHEADER, _HEADER_LINES + request.header_lines)
        handle.setopt(pycurl.POSTFIELDS, request.body)
        handle.head.seek(0)
        handle.head.truncate()
        handle.token = token
        handle.request = request
        handle.started = time.monotonic()
        if 0 < request.socket_timeout_s < request.request_timeout_s:
            handle.moved_at = handle.started
            handle.moved = 0
            self._watched[handle] = None
        self._multi.add_handle(handle)
        self._open_handles[token] = handle
        self._open += 1

    def abort(self, token: Hashable) -> TransportFailure | None:
        handle = self._open_handles.get(token)
        if handle is None:
            return None
        failure = aborted_failure(time.monotonic() - handle.started)
        self._release(handle)  # removing an unfinished transfer closes its connection
        return failure

    def poll(self, timeout_s: float) -> list[tuple[Hashable, HttpAnswer | TransportFailure]]:
        finished: list[tuple[Hashable, HttpAnswer | TransportFailure]] = []
        if not self._open:
            return finished
        multi = self._multi
        deadline = None
        while True:
            multi.perform()
            self._collect(finished)
            if self._watched:
                self._check_idle(finished)
            if finished or timeout_s <= 0:
                return finished
            now = time.monotonic()
            if deadline is None:
                deadline = now + timeout_s
            elif now >= deadline:
                return finished
            wait_s = min(deadline - now, _MAX_WAIT_S)
            curl_ms = multi.timeout()
            if curl_ms >= 0:
                wait_s = min(wait_s, curl_ms / 1000)
            if multi.select(wait_s) == 0 and not any(multi.fdset()):
                time.sleep(wait_s)  # nothing select(2) can watch: it returned at once

    def close(self) -> None:
        for handle in self._handles:
            if handle.token is not None:
                self._multi.remove_handle(handle)  # aborts the transfer
            handle.close()
        self._handles.clear()
        self._idle.clear()
        self._watched.clear()
        self._open_handles.clear()
        self._open = 0
        self._multi.close()

    # -- handles ----------------------------------------------------------------------------------------------
    def _endpoint(self, url: str) -> Endpoint:
        parts = urlsplit(url)
        endpoint = (parts.scheme, parts.hostname or "", parts.port or _DEFAULT_PORTS.get(parts.scheme, 0))
        self._endpoints[url] = endpoint
        return endpoint

    def _take(self, pool: Pool) -> _Handle:
        """An idle handle of `pool`, else a new one while there are fewer than max_open, else any idle one."""
        idle = self._idle.get(pool)
        if idle:
            return idle.pop()
        if len(self._handles) < self.max_open:
            handle = _new_handle()
            self._handles.append(handle)
        else:
            handle = next((handles.pop() for handles in self._idle.values() if handles), None)
            if handle is None:
                raise RuntimeError(f"transport full: {self._open} attempts open, max_open {self.max_open}")
        handle.pool = pool
        return handle

    def _collect(self, finished: list) -> None:
        """Move what libcurl has finished into `finished` and put the handles back."""
        multi = self._multi
        while True:
            queued, done, failed = multi.info_read()
            for handle in done:
                finished.append((handle.token, _answer(handle)))
                self._release(handle)
            for handle, code, message in failed:
                finished.append((handle.token, _failure(handle, code, message)))
                self._release(handle)
            if not queued:
                return

    def _check_idle(self, finished: list) -> None:
        """Abort the watched attempts that have moved no byte for their `socket_timeout_s`, once their request
        began to go out; at most every `_IDLE_CHECK_S`."""
        now = time.monotonic()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + _IDLE_CHECK_S
        for handle in list(self._watched):
            moved = handle.getinfo(pycurl.REQUEST_SIZE) + handle.getinfo(pycurl.HEADER_SIZE) + handle.getinfo(
                pycurl.SIZE_DOWNLOAD_T)
            if moved != handle.moved or not moved:
                handle.moved, handle.moved_at = moved, now
            elif now - handle.moved_at >= handle.request.socket_timeout_s:
                finished.append((handle.token, timeout_failure(handle.request, now - handle.started)))
                self._release(handle)  # removing an unfinished transfer closes its connection

    def _release(self, handle: _Handle) -> None:
        self._multi.remove_handle(handle)
        if self._watched:
            self._watched.pop(handle, None)
        del self._open_handles[handle.token]
        handle.token = handle.request = None
        self._open -= 1
        idle = self._idle.get(handle.pool)
        if idle is None:
            self._idle[handle.pool] = [handle]
        else:
            idle.append(handle)


def _new_handle() -> _Handle:
    handle = _Handle()
    handle.token = handle.request = None
    handle.head = io.BytesIO()
    _configure(handle)
    return handle


def _configure(handle: _Handle) -> None:
    """The options every attempt has (`start` sets the URL, timeout, headers, body and client certificate)."""
    handle.url = handle.timeout_ms = handle.tls = None
    handle.setopt(pycurl.HEADERFUNCTION, handle.head.write)
    handle.setopt(pycurl.WRITEFUNCTION, len)  # the body is dropped: "all bytes taken", without a Python frame
    handle.setopt(pycurl.MAXFILESIZE, MAX_ANSWER_BODY_BYTES)
    handle.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
    handle.setopt(pycurl.FOLLOWLOCATION, 0)
    handle.setopt(pycurl.PROXY, "")  # "" disables proxies, even those named by environment variables
    handle.setopt(pycurl.NETRC, pycurl.NETRC_IGNORED)
    handle.setopt(pycurl.NOSIGNAL, 1)
    handle.setopt(pycurl.USERAGENT, f"Herald/{__version__}")
    handle.setopt(pycurl.SSL_VERIFYPEER, 1)
    handle.setopt(pycurl.SSL_VERIFYHOST, 2)
    handle.setopt(pycurl.CAINFO, certifi.where())


def _set_tls(handle: _Handle, tls: TlsSettings | None) -> None:
    """Set the handle's CA file and client certificate to `tls`'s (None: certifi's CAs, no certificate)."""
    old = handle.tls
    if old is not None and old.client_cert is not None and (
            tls is None or (old.client_cert, old.client_key, old.client_key_password)
            != (tls.client_cert, tls.client_key, tls.client_key_password)):
        handle.reset()  # SSLCERT, SSLKEY and KEYPASSWD cannot be unset one by one
        _configure(handle)
    handle.setopt(pycurl.CAINFO, tls.ca_bundle if tls is not None and tls.ca_bundle else certifi.where())
    if tls is not None and tls.client_cert is not None:
        handle.setopt(pycurl.SSLCERT, tls.client_cert)
        handle.setopt(pycurl.SSLKEY, tls.client_key or tls.client_cert)
        handle.setopt(pycurl.KEYPASSWD, tls.client_key_password or "")  # "": OpenSSL never prompts on a terminal
    handle.tls = tls


def _answer(handle: _Handle) -> HttpAnswer:
    return HttpAnswer(handle.getinfo(pycurl.RESPONSE_CODE), _retry_after(handle.head.getvalue()))


def _failure(handle: _Handle, code: int, message: str) -> HttpAnswer | TransportFailure:
    if code == pycurl.E_FILESIZE_EXCEEDED:  # the answer is complete enough: its head is in
        return _answer(handle)
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return timeout_failure(handle.request, handle.getinfo(pycurl.TOTAL_TIME))
    if code in _TLS_ERRORS or (code in _TLS_IF_SAID and any(word in message for word in _TLS_WORDS)):
        return tls_failure(message)
    return connection_failure(message or f"curl error {code}")


def _retry_after(head: bytes) -> str | None:
    """The Retry-After value in a received head (the last one, should interim answers precede the final)."""
    at = head.lower().rfind(b"\nretry-after:")
    if at < 0:
        return None
    end = head.find(b"\n", at + 1)
    return head[at + 13 : end].strip().decode("latin-1")
