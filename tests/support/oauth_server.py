"""A real OAuth 2 token endpoint on 127.0.0.1 for tests, built on oauthlib's server classes (an independent
implementation of RFC 6749's client-credentials and password grants), and a token check for subscribers.

    with TokenEndpoint(clients={"herald": "secret"}, users={"ann": "pw"}) as issuer:
        issuer.url             # http://127.0.0.1:<port>/token (https://... with `tls`, a server-side SSLContext)
        issuer.client_cns      # the client certificate's common name per token request (None: none shown)
        issuer.tls_errors      # the handshakes that failed (their text), with `tls`
        issuer.requests        # (monotonic time, grant_type, username, scope) per token issued
        issuer.arrivals        # monotonic time each token request arrived (issued or refused)
        issuer.valid(token)    # issued and not revoked
        issuer.revoke_all()    # every token issued so far is refused from now on (rotation)
"""

from __future__ import annotations

import base64
import secrets
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler

from oauthlib.oauth2 import BackendApplicationServer, LegacyApplicationServer, RequestValidator

from tests.support.http_server import LocalHttpServer
from tests.support.subscriber import _client_cn, _TlsServer


class _Validator(RequestValidator):
    def __init__(self, endpoint: TokenEndpoint) -> None:
        self.endpoint = endpoint

    def client_authentication_required(self, request, *args, **kwargs):
        return True

    def authenticate_client(self, request, *args, **kwargs):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        client_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
        if self.endpoint.clients.get(client_id) != secret:
            return False
        request.client_id = client_id
        request.client = type("Client", (), {"client_id": client_id})()
        return True

    def authenticate_client_id(self, client_id, request, *args, **kwargs):
        return False

    def validate_grant_type(self, client_id, grant_type, client, request, *args, **kwargs):
        return grant_type in ("client_credentials", "password")

    def validate_user(self, username, password, client, request, *args, **kwargs):
        if self.endpoint.users.get(username) != password:
            return False
        request.user = username
        return True

    def get_default_scopes(self, client_id, request, *args, **kwargs):
        return []

    def validate_scopes(self, client_id, scopes, client, request, *args, **kwargs):
        return True

    def save_bearer_token(self, token, request, *args, **kwargs):
        with self.endpoint.lock:
            self.endpoint.issued[token["access_token"]] = getattr(request, "user", None) or request.client_id
            self.endpoint.requests.append((time.monotonic(), request.grant_type, getattr(request, "user", None),
                                           " ".join(request.scopes or [])))


class TokenEndpoint:
    def __init__(self, clients: dict[str, str], users: dict[str, str] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.clients, self.users = clients, users or {}
        self.lock = threading.Lock()
        self.issued: dict[str, str] = {}  # token -> who it was issued to
        self.revoked: set[str] = set()
        self.requests: list[tuple[float, str, str | None, str]] = []
        self.refused = 0  # token requests answered with an error
        self.arrivals: list[float] = []  # monotonic time each token request arrived
        self.client_cns: list[str | None] = []
        self.tls_errors: list[str] = []
        validator = _Validator(self)
        generator = lambda request: secrets.token_hex(8)  # noqa: E731
        servers = {"client_credentials": BackendApplicationServer(validator, token_generator=generator),
                   "password": LegacyApplicationServer(validator, token_generator=generator)}
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                arrived = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                grant = dict(pair.split("=", 1) for pair in body.split("&") if "=" in pair).get("grant_type", "")
                server = servers.get(grant, servers["client_credentials"])
                endpoint.arrivals.append(arrived)
                endpoint.client_cns.append(_client_cn(self.connection))
                headers, answer, status = server.create_token_response(
                    f"http://127.0.0.1:{self.server.server_port}/token", "POST", body, dict(self.headers))
                if status != 200:
                    with endpoint.lock:
                        endpoint.refused += 1
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                payload = answer.encode()
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = (_TlsServer if tls is not None else LocalHttpServer)(("127.0.0.1", 0), Handler)
        if tls is not None:
            self._server.tls, self._server.tls_errors = tls, self.tls_errors
        self._server.daemon_threads = True
        self.url = f"{'https' if tls is not None else 'http'}://127.0.0.1:{self._server.server_port}/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def valid(self, token: str | None) -> bool:
        with self.lock:
            return token is not None and token in self.issued and token not in self.revoked

    def revoke_all(self) -> None:
        with self.lock:
            self.revoked.update(self.issued)

    def __enter__(self) -> TokenEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
