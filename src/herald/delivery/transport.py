"""The HTTP transport: POSTs one body with `requests` over keep-alive connections.

This is the only place that sees requests/urllib3 exceptions; they become `TransportFailure`s here.
Redirects are never followed (a 3xx is an answer to classify). Timeouts:

- request_timeout_s is a total for the attempt: the connect and the wait for the answer's head are bounded
  by it, and the body is read only while it has not passed.
- socket_timeout_s (0 = none) is an idle limit: no single read may wait longer.

Connection pools are per worker thread and are created after unpickling, so an `HttpTransport` crosses the
driver/executor boundary as plain configuration.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests
import urllib3
from requests.adapters import HTTPAdapter

from herald import __version__
from herald.delivery.outcome import FailureKind, TransportFailure

_MAX_BODY_BYTES = 64 * 1024  # answer bodies are read (to keep the connection reusable) up to this size


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    retry_after: str | None


class HttpTransport:
    """POST bodies to a URL; one keep-alive connection pool per calling thread.

    Requests go straight to requests' HTTPAdapter (no Session: no redirects, cookies, proxies or netrc taken
    from the environment), built from a request prepared once per URL and copied per attempt.
    """

    def __init__(self, request_timeout_s: float, socket_timeout_s: float = 0.0) -> None:
        self.request_timeout_s = request_timeout_s
        self.socket_timeout_s = socket_timeout_s
        self._local = threading.local()
        self._adapters: list[HTTPAdapter] = []
        self._templates: dict[str, requests.PreparedRequest] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"request_timeout_s": self.request_timeout_s, "socket_timeout_s": self.socket_timeout_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _adapter(self) -> HTTPAdapter:
        adapter = getattr(self._local, "adapter", None)
        if adapter is None:
            adapter = HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0)
            self._local.adapter = adapter
            with self._lock:
                self._adapters.append(adapter)
        return adapter

    def _prepared(self, url: str, body: bytes, headers: dict[str, str]) -> requests.PreparedRequest:
        template = self._templates.get(url)
        if template is None:
            template = requests.Request("POST", url, headers={"User-Agent": f"Herald/{__version__}"}).prepare()
            self._templates[url] = template
        request = template.copy()
        request.headers.update(headers)
        request.headers["Content-Length"] = str(len(body))
        request.body = body
        return request

    def _read_timeout_s(self, remaining_s: float) -> float:
        if self.socket_timeout_s > 0:
            return max(0.001, min(self.socket_timeout_s, remaining_s))
        return max(0.001, remaining_s)

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> HttpAnswer | TransportFailure:
        """Send one attempt; return the answer's status and Retry-After, or the failure."""
        started = time.monotonic()
        deadline = started + self.request_timeout_s
        try:
            response = self._adapter().send(
                self._prepared(url, body, headers),
                stream=True,
                timeout=(self.request_timeout_s, self._read_timeout_s(self.request_timeout_s)),
            )
        except requests.exceptions.Timeout as error:
            return self._timeout(started, error)
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            return TransportFailure(FailureKind.CONNECTION, f"Connection error: {_describe(error)}")
        try:
            failure = self._drain(response, deadline, started)
        finally:
            response.close()
        if failure is not None:
            return failure
        return HttpAnswer(response.status_code, response.headers.get("Retry-After"))

    def _drain(self, response: requests.Response, deadline: float, started: float) -> TransportFailure | None:
        """Read the answer's body within the total timeout (so the connection can be reused)."""
        received = 0
        try:
            while received <= _MAX_BODY_BYTES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return self._timeout(started, None)
                sock = _socket_of(response)
                if sock is not None:
                    sock.settimeout(self._read_timeout_s(remaining))
                chunk = response.raw.read1(16 * 1024)  # returns after one receive, so the deadline is checked often
                if not chunk:
                    return None
                received += len(chunk)
            return None
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            if isinstance(error, (urllib3.exceptions.ReadTimeoutError, TimeoutError)):
                return self._timeout(started, error)
            return TransportFailure(FailureKind.CONNECTION, f"Connection error: {_describe(error)}")

    def _timeout(self, started: float, error: BaseException | None) -> TransportFailure:
        elapsed_ms = (time.monotonic() - started) * 1000
        idle = self.socket_timeout_s > 0 and elapsed_ms < self.request_timeout_s * 1000 * 0.95
        kind = f"idle for {self.socket_timeout_s * 1000:.0f} ms" if idle else f"{self.request_timeout_s * 1000:.0f} ms"
        return TransportFailure(FailureKind.TIMEOUT, f"Timeout: no complete answer, {kind} elapsed")

    def close(self) -> None:
        with self._lock:
            adapters, self._adapters = self._adapters, []
        for adapter in adapters:
            adapter.close()


def _socket_of(response: requests.Response):
    connection = getattr(response.raw, "_connection", None) or getattr(response.raw, "connection", None)
    return getattr(connection, "sock", None)


def _describe(error: BaseException) -> str:
    """A short, credential-free description of a transport error."""
    from herald.endpoint import mask_secrets

    root: BaseException = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    name = type(root).__name__
    text = str(root).split("(Caused by")[0].strip()
    return mask_secrets(f"{name}: {text}" if text else name)
