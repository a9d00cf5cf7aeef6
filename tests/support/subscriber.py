"""A real HTTP subscriber on 127.0.0.1 for tests: records every request and answers as scripted.

By default each message scripts its own answers: a JSON body with a "replies" list answers its n-th attempt
with replies[n] (the last one repeats). A reply is [status], [status, {headers}], or a dict with keys
status, headers, delay_ms (wait before answering), stall_body_ms (send the head, then wait before the body),
trickle_ms (send the body one byte at a time with this gap). Messages without a script get 200.

    with ScriptedSubscriber() as sub:
        ... deliver to sub.url ...
        sub.requests            # every request, in arrival order
        sub.peak_concurrency    # most requests open at once

With `tls` (a server-side ssl.SSLContext, see tests/support/tls_certs.py) it serves HTTPS: each connection's
handshake runs in its own thread, and the handshakes that fail are kept in `tls_errors` (their text).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.support.http_server import LocalHttpServer


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_ms: int = 0
    stall_body_ms: int = 0
    trickle_ms: int = 0
    body: bytes = b"ok"

    @classmethod
    def of(cls, spec) -> Reply:
        if isinstance(spec, dict):
            return cls(
                status=spec.get("status", 200),
                headers=spec.get("headers", {}),
                delay_ms=spec.get("delay_ms", 0),
                stall_body_ms=spec.get("stall_body_ms", 0),
                trickle_ms=spec.get("trickle_ms", 0),
                body=spec.get("body", "ok").encode(),
            )
        status, *rest = spec
        return cls(status=status, headers=rest[0] if rest else {})


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() on arrival
    path: str
    headers: dict[str, str]
    body: bytes
    attempt: int  # 0-based attempt number of this body at this path
    client_port: int = 0  # the sender's local port: one per connection
    client_cert_cn: str | None = None  # HTTPS: the common name of the client certificate shown, if any

    @property
    def message_id(self) -> str | None:
        return self.headers.get("Hermes-Message-Id")

    def json(self):
        return json.loads(self.body)


def scripted_reply(request: Received) -> Reply:
    try:
        document = json.loads(request.body)
    except ValueError:
        return Reply()
    replies = document.get("replies") if isinstance(document, dict) else None
    if not replies:
        return Reply()
    return Reply.of(replies[min(request.attempt, len(replies) - 1)])


class ScriptedSubscriber:
    def __init__(self, respond: Callable[[Received], Reply] = scripted_reply,
                 tls: ssl.SSLContext | None = None) -> None:
        self.respond = respond
        self.tls_errors: list[str] = []
        self.requests: list[Received] = []  # in arrival order
        self._ok: list[bool] = []
        self.peak_concurrency = 0
        self._open = 0
        self._attempts: dict[tuple[str, bytes], int] = defaultdict(int)
        self._lock = threading.Lock()
        self._server = (_TlsServer if tls is not None else LocalHttpServer)(("127.0.0.1", 0), self._handler_class())
        if tls is not None:
            self._server.tls, self._server.tls_errors = tls, self.tls_errors
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if isinstance(self._server, _TlsServer) else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ScriptedSubscriber:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def bodies(self) -> list[bytes]:
        with self._lock:
            return [request.body for request in self.requests]

    def delivered_ids(self, field_name: str = "i") -> set:
        """Values of `field_name` in bodies answered 2xx."""
        with self._lock:
            return {json.loads(r.body)[field_name] for r, ok in zip(self.requests, self._ok) if ok}

    def _handler_class(self):
        subscriber = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                with subscriber._lock:  # attempts are counted per endpoint path and body
                    attempt = subscriber._attempts[(self.path, body)]
                    subscriber._attempts[(self.path, body)] += 1
                    subscriber._open += 1
                    subscriber.peak_concurrency = max(subscriber.peak_concurrency, subscriber._open)
                request = Received(time.monotonic(), self.path, dict(self.headers.items()), body, attempt,
                                   self.client_address[1], _client_cn(self.connection))
                reply = subscriber.respond(request)
                with subscriber._lock:  # recorded before answering: once Herald has its answer, the test sees it
                    subscriber.requests.append(request)
                    subscriber._ok.append(200 <= reply.status < 300)
                try:
                    if reply.delay_ms:
                        time.sleep(reply.delay_ms / 1000)
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.flush()
                    if reply.stall_body_ms:
                        time.sleep(reply.stall_body_ms / 1000)
                    if reply.trickle_ms:
                        for byte in reply.body:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(reply.trickle_ms / 1000)
                    else:
                        self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with subscriber._lock:
                        subscriber._open -= 1

        return Handler


def _client_cn(connection) -> str | None:
    peer = connection.getpeercert() if isinstance(connection, ssl.SSLSocket) else None
    names = [value for rdn in (peer or {}).get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[0] if names else None


class _TlsServer(LocalHttpServer):
    """HTTPS: the accepted socket is wrapped (and its handshake run) in the connection's own thread, so a client
    that fails its handshake holds up no other."""

    tls: ssl.SSLContext
    tls_errors: list[str]

    def finish_request(self, request, client_address) -> None:
        secured = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            secured.do_handshake()
        except (ssl.SSLError, OSError) as error:
            self.tls_errors.append(str(error))
            _linger(secured)
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()


def _linger(connection: ssl.SSLSocket, limit_s: float = 2.0) -> None:
    """Close after the client does (or `limit_s`), what is sent meanwhile dropped: closing with the client's
    request unread would reset the connection, and the client might lose the alert that says why."""
    try:
        connection.settimeout(limit_s)
        while socket.socket.recv(connection, 65536):  # the raw bytes, past the failed TLS layer
            pass
    except OSError:
        pass
    finally:
        connection.close()

    def handle_error(self, request, client_address) -> None:  # an error after the handshake: the client's doing
        pass
