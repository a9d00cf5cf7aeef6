"""The requests transport: requests' HTTPAdapter on a bounded pool of threads, where pycurl cannot load.

Each worker thread has its own keep-alive connection pool (one connection per endpoint and TLS settings it talks
to); the pool has at most `min(max_open, MAX_THREADS)` threads, whatever the number of subscriptions. Attempts are
queued to the threads and their results come back through a queue that `poll` reads.

Requests go straight to an HTTPAdapter (no Session): no redirects, cookies, proxies or .netrc taken from the
environment. Timeouts (docs/design.md §4):

- `request_timeout_s` is a total: the connect and the wait for the answer's head are bounded by it, and the
  body is read only while it has not passed;
- `socket_timeout_s` (0 = none) is an idle limit: no single read waits longer (to the millisecond).

https: each attempt passes its TLS settings (`verify=` its CA bundle or requests' default, certifi's; `cert=`
its client certificate and key, and the key's passphrase, which requests has no parameter for, through
`_Adapter`); urllib3 keeps a connection pool per endpoint and TLS settings, so a connection is reused only by
attempts with the same ones.

`abort` cannot stop a thread: it marks the attempt aborted, so that `poll` drops its result whenever it comes,
and shuts its socket down (`_Attempt`), which ends the thread's wait at once and makes the connection unusable:
urllib3 never hands it to a later request (it drops a connection that is closed or has unread bytes), and a
thread's connections serve only that thread's attempts, one at a time. An attempt aborted while its TCP connect
is still under way (no socket yet) holds its thread until that connect's timeout; its result is dropped all the
same.

This is the only place that sees requests/urllib3 exceptions; they become `TransportFailure`s here (`_failure`:
an SSL error a `tls_failure`).
"""

from __future__ import annotations

import queue
import socket
import ssl
import threading
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from herald import __version__
from herald.delivery.outcome import FailureKind, TransportFailure
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

MAX_THREADS = 32
"""Most worker threads of one transport."""

_READ_CHUNK_BYTES = 16 * 1024

_CURRENT = threading.local()
"""`attempt`: the `_Attempt` the worker thread is sending now (None between attempts)."""


class _Attempt:
    """One attempt on a worker thread, and what `abort` needs to end it: the connection it is sent on (set when
    the thread connects or sends, cleared when it is done, under `lock`)."""

    __slots__ = ("token", "request", "started", "aborted", "connection", "lock")

    def __init__(self, token: Hashable, request: HttpRequest) -> None:
        self.token = token
        self.request = request
        self.started = time.monotonic()
        self.aborted = False
        self.connection: HTTPConnection | None = None
        self.lock = threading.Lock()

    def attach(self, connection: HTTPConnection) -> None:
        """(worker thread) The attempt goes out on `connection`; raises if it was aborted already."""
        with self.lock:
            if self.aborted:
                raise ConnectionAbortedError("attempt aborted")
            self.connection = connection

    def detach(self) -> None:
        """(worker thread) The attempt is done: its connection may serve the thread's next attempt."""
        with self.lock:
            self.connection = None

    def abort(self) -> None:
        """(delivery loop) Mark it aborted and shut its socket down: the thread's read ends at once and the
        connection can carry nothing more. Under the lock, so never the socket of the thread's next attempt."""
        with self.lock:
            self.aborted = True
            sock = getattr(self.connection, "sock", None)
            if sock is not None:
                # socket.socket's own shutdown: an SSLSocket's drops its TLS state under the reading thread
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass


class ThreadedTransport(Transport):
    """Attempts on at most `min(max_open, MAX_THREADS)` threads; at most `max_open` open at once."""

    def __init__(self, max_open: int = 256) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, not {max_open}")
        self.max_open = max_open
        self._pool = ThreadPoolExecutor(min(max_open, MAX_THREADS), thread_name_prefix="herald-http")
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        self._local = threading.local()
        self._adapters: list[_Adapter] = []
        self._lock = threading.Lock()
        self._attempts: dict[Hashable, _Attempt] = {}  # token -> its open attempt (the delivery loop's thread)
        self._closed = False

    @property
    def open(self) -> int:
        return len(self._attempts)

    def start(self, request: HttpRequest, token: Hashable) -> None:
        if self._closed:
            raise RuntimeError("transport closed")
        attempt = _Attempt(token, request)
        self._attempts[token] = attempt
        self._pool.submit(self._run, attempt)

    def poll(self, timeout_s: float) -> list[tuple[Hashable, HttpAnswer | TransportFailure]]:
        finished: list[tuple[Hashable, HttpAnswer | TransportFailure]] = []
        deadline = time.monotonic() + timeout_s
        while self._attempts:
            try:
                if finished or timeout_s <= 0:
                    attempt, result = self._finished.get_nowait()
                else:
                    attempt, result = self._finished.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if attempt.aborted:
                continue  # its late result: dropped (`abort` counted it)
            del self._attempts[attempt.token]
            finished.append((attempt.token, result))
        return finished

    def abort(self, token: Hashable) -> TransportFailure | None:
        attempt = self._attempts.pop(token, None)
        if attempt is None:
            return None
        attempt.abort()
        return aborted_failure(time.monotonic() - attempt.started)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        for attempt in self._attempts.values():
            attempt.abort()  # frees its thread
        self._attempts.clear()
        with self._lock:
            adapters, self._adapters = self._adapters, []
        for adapter in adapters:
            adapter.close()

    # -- in the worker threads --------------------------------------------------------------------------------
    def _run(self, attempt: _Attempt) -> None:
        if attempt.aborted:
            return  # aborted while it waited for a thread: never sent
        _CURRENT.attempt = attempt
        try:
            result = self._post(attempt.request)
        except Exception as error:  # noqa: BLE001 - anything unexpected is still a failed attempt, not a lost one
            result = _failure(error)
        finally:
            _CURRENT.attempt = None
            attempt.detach()
        self._finished.put((attempt, result))

    def _adapter(self) -> _Adapter:
        adapter = getattr(self._local, "adapter", None)
        if adapter is None:
            adapter = _Adapter(pool_connections=8, pool_maxsize=1, max_retries=0)
            self._local.adapter = adapter
            with self._lock:
                self._adapters.append(adapter)
        return adapter

    def _post(self, request: HttpRequest) -> HttpAnswer | TransportFailure:
        started = time.monotonic()
        deadline = started + request.request_timeout_s
        prepared = requests.Request("POST", request.url, headers=_headers(request.header_lines)).prepare()
        prepared.body = request.body
        prepared.headers["Content-Length"] = str(len(request.body))
        adapter = self._adapter()
        tls = request.tls
        adapter.key_password = tls.client_key_password if tls is not None else None
        try:
            response = adapter.send(
                prepared,
                stream=True,
                timeout=(request.request_timeout_s, _read_timeout_s(request, request.request_timeout_s)),
                verify=_verify(tls),
                cert=_cert(tls),
            )
        except requests.exceptions.Timeout:
            return timeout_failure(request, time.monotonic() - started)
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            return _failure(error)
        try:
            failure = _drain(response, request, deadline, started)
        finally:
            response.close()
        return failure or HttpAnswer(response.status_code, response.headers.get("Retry-After"))


class _Adapter(HTTPAdapter):
    """requests' HTTPAdapter, plus the client key's passphrase of the attempt being sent (`key_password`, set
    before each `send`: one thread uses an adapter), handed to urllib3, which keys its pools by it too; its
    connections tell the thread's attempt which connection it goes out on (`_Attempt.attach`)."""

    key_password: str | None = None

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HttpPool, "https": _HttpsPool}

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, verify, cert)
        if cert is not None and self.key_password is not None:
            pool_kwargs["key_password"] = self.key_password
        return host_params, pool_kwargs


def _attach(connection: HTTPConnection) -> None:
    attempt = getattr(_CURRENT, "attempt", None)
    if attempt is not None:
        attempt.attach(connection)


class _HttpConnection(HTTPConnection):
    def connect(self) -> None:
        _attach(self)
        super().connect()

    def request(self, *args, **kwargs) -> None:
        _attach(self)
        super().request(*args, **kwargs)


class _HttpsConnection(HTTPSConnection):
    def connect(self) -> None:
        _attach(self)
        super().connect()

    def request(self, *args, **kwargs) -> None:
        _attach(self)
        super().request(*args, **kwargs)


class _HttpPool(HTTPConnectionPool):
    ConnectionCls = _HttpConnection


class _HttpsPool(HTTPSConnectionPool):
    ConnectionCls = _HttpsConnection


def tls_session(tls: TlsSettings | None) -> tuple[requests.Session, dict]:
    """A requests Session for a one-off request (an OAuth token request) with `tls`, and the keywords to pass to
    its request: `verify=` and `cert=` given per request, so that REQUESTS_CA_BUNDLE in the environment does not
    replace a configured caBundle; the key's passphrase through `_Adapter`. Close the session after use."""
    session = requests.Session()
    adapter = _Adapter(max_retries=0)
    adapter.key_password = tls.client_key_password if tls is not None else None
    session.mount("https://", adapter)
    return session, {"verify": _verify(tls), "cert": _cert(tls)}


def tls_failure_of(error: BaseException) -> TransportFailure | None:
    """The `tls_failure` an error of requests was caused by (a failed handshake), or None."""
    failure = _failure(error)
    return failure if failure.kind is FailureKind.TLS else None


def _verify(tls: TlsSettings | None) -> str | bool:
    """requests' `verify=`: the CA bundle's path, or True (requests' default CAs, certifi's)."""
    return tls.ca_bundle if tls is not None and tls.ca_bundle else True


def _cert(tls: TlsSettings | None) -> tuple[str, str] | str | None:
    """requests' `cert=`: (certificate, key), the certificate alone (its file holds the key), or None."""
    if tls is None or tls.client_cert is None:
        return None
    return (tls.client_cert, tls.client_key) if tls.client_key else tls.client_cert


def _headers(header_lines: tuple[str, ...]) -> dict[str, str]:
    headers = {"User-Agent": f"Herald/{__version__}"}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip()] = value.strip()
    return headers


def _read_timeout_s(request: HttpRequest, remaining_s: float) -> float:
    if request.socket_timeout_s > 0:
        return max(0.001, min(request.socket_timeout_s, remaining_s))
    return max(0.001, remaining_s)


def _drain(response: requests.Response, request: HttpRequest, deadline: float,
           started: float) -> TransportFailure | None:
    """Read the answer's body within the total timeout, so the connection can be reused."""
    received = 0
    try:
        while received <= MAX_ANSWER_BODY_BYTES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return timeout_failure(request, time.monotonic() - started)
            connection = getattr(response.raw, "_connection", None) or getattr(response.raw, "connection", None)
            sock = getattr(connection, "sock", None)
            if sock is not None:
                sock.settimeout(_read_timeout_s(request, remaining))
            chunk = response.raw.read1(_READ_CHUNK_BYTES)  # returns after one receive: the deadline is checked often
            if not chunk:
                return None
            received += len(chunk)
        return None
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
        if isinstance(error, (urllib3.exceptions.ReadTimeoutError, TimeoutError)):
            return timeout_failure(request, time.monotonic() - started)
        return _failure(error)


def _failure(error: BaseException) -> TransportFailure:
    """A failed attempt's error as a TransportFailure: a `tls_failure` when an SSL error caused it (its OpenSSL
    text), else a `connection_failure`."""
    root = _root(error)
    if isinstance(root, ssl.SSLError) or isinstance(error, requests.exceptions.SSLError):
        return tls_failure(str(root).split("(Caused by")[0])
    return connection_failure(_describe(error))


def _root(error: BaseException) -> BaseException:
    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    return root


def _describe(error: BaseException) -> str:
    """A short description of a transport error: its root cause's type and text (masked by the caller)."""
    root = _root(error)
    name = type(root).__name__
    text = str(root).split("(Caused by")[0].strip()
    return f"{name}: {text}" if text else name
