"""OAuth 2 for subscriber endpoints, as Hermes does it (seeds/001, "OAuth"): client-credentials and resource-owner
password grants against a provider's token endpoint, tokens cached per executor process.

- A lane of a subscription with an `oAuthPolicy` asks `TOKENS.token(source, now)` before each attempt and sends
  `Authorization: Bearer <token>`. Without a token it requests one (a synchronous POST of at most the
  provider's requestTimeout; the delivery loop waits that long, once per token).
- A 401 from the subscriber drops the token it was sent with (`invalidate`), and the message is retried
  whatever retryClientErrors says; the retry requests a new token.
- Token requests of one token (provider, grant, user, scope) are spaced: after a request the next may start
  `delay` seconds later; the delay starts at tokenRequestInitialDelay, doubles up to tokenRequestMaxDelay, and
  goes back to the start after a 2xx from the subscriber (`delivered`). An attempt that needs a token while the
  delay runs waits for it (it is not counted as an attempt).
- A token request that fails raises `TokenError`: the attempt fails as an ordinary retryable error (counting
  against messageTtl) with a reason naming the provider; a failed TLS handshake with the token endpoint is a TLS
  failure whose reason says what was wrong, in the words of HTTPS delivery ("...: TLS: certificate verify
  failed: ...").
- Token requests verify the token endpoint's certificate against the provider's `tls` settings in force (its
  own over herald.yaml's delivery.tls: a CA bundle, a client certificate shown when the endpoint asks for one;
  `herald.config.tls`), or certifi's CAs without them.

The password grant makes one request carrying both the client's and the resource owner's credentials (RFC 6749
§4.3, client authenticated with HTTP Basic), as Hermes does. Secrets and tokens are never logged or shown.
Times are the caller's monotonic seconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import requests

from herald.delivery.outcome import FailureKind
from herald.delivery.tls import TlsSettings


@dataclass(frozen=True)
class TokenSource:
    """What a task needs to get a subscription's token (picklable; secrets never printed)."""

    provider: str
    token_endpoint: str
    client_id: str
    client_secret: str = field(repr=False)
    grant_type: str  # clientCredentials | password
    scope: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    initial_delay_s: float = 1.0
    max_delay_s: float = 30.0
    request_timeout_s: float = 1.0
    socket_timeout_s: float = 0.5
    tls: TlsSettings | None = None  # its repr masks the key's passphrase

    @property
    def key(self) -> tuple:
        return (self.provider, self.token_endpoint, self.client_id, self.grant_type, self.username, self.scope)

    def form(self) -> dict[str, str]:
        if self.grant_type == "password":
            data = {"grant_type": "password", "username": self.username or "", "password": self.password or ""}
        else:
            data = {"grant_type": "client_credentials"}
        if self.scope:
            data["scope"] = self.scope
        return data


class TokenError(Exception):
    """A token could not be had from the provider (the reason never holds a secret); `kind` is the failure the
    attempt that needed it counts as."""

    def __init__(self, reason: str, kind: FailureKind = FailureKind.CONNECTION) -> None:
        super().__init__(reason)
        self.kind = kind


class Wait(Exception):
    """No token now and the next token request may start only at `at` (monotonic seconds)."""

    def __init__(self, at: float) -> None:
        super().__init__(at)
        self.at = at


@dataclass
class _State:
    token: str | None = None
    delay_s: float | None = None  # the spacing after the next request (None: the initial delay)
    next_request_at: float = float("-inf")


def _fetch(source: TokenSource) -> str:
    """One token request; raises TokenError."""
    from herald.delivery.transport.threaded import tls_failure_of, tls_session

    session, tls = tls_session(source.tls)
    try:
        answer = session.post(source.token_endpoint, data=source.form(), auth=(source.client_id, source.client_secret),
                              headers={"Accept": "application/json"},
                              timeout=(source.request_timeout_s, source.socket_timeout_s or source.request_timeout_s),
                              **tls)
    except requests.RequestException as error:
        handshake = tls_failure_of(error)
        if handshake is not None:
            raise TokenError(f"OAuth token request to provider {source.provider} failed: {handshake.detail}",
                             FailureKind.TLS) from None
        raise TokenError(f"OAuth token request to provider {source.provider} failed: {type(error).__name__}") from None
    finally:
        session.close()
    if answer.status_code != 200:
        raise TokenError(f"OAuth token request to provider {source.provider} failed with status code:"
                         f"{answer.status_code}")
    try:
        token = answer.json()["access_token"]
    except (ValueError, KeyError, TypeError):
        raise TokenError(f"OAuth token request to provider {source.provider} gave no access_token") from None
    if not isinstance(token, str) or not token:
        raise TokenError(f"OAuth token request to provider {source.provider} gave no access_token")
    return token


class TokenCache:
    """Tokens of one process, shared by every task and lane in it. `fetch` is injectable for tests."""

    def __init__(self, fetch=_fetch) -> None:
        self._fetch = fetch
        self._states: dict[tuple, _State] = {}
        self._lock = threading.Lock()

    def token(self, source: TokenSource, now: float) -> str:
        """The cached token, or a new one. Raises Wait while the spacing delay runs, TokenError on failure."""
        with self._lock:
            state = self._states.setdefault(source.key, _State())
            if state.token is not None:
                return state.token
            if now < state.next_request_at:
                raise Wait(state.next_request_at)
            delay_s = state.delay_s if state.delay_s is not None else source.initial_delay_s
            state.next_request_at = now + delay_s
            state.delay_s = min(delay_s * 2, source.max_delay_s)
            state.token = self._fetch(source)  # TokenError propagates; the spacing holds either way
            return state.token

    def invalidate(self, source: TokenSource, token: str | None) -> None:
        """The subscriber refused `token` (401): the next attempt requests a new one."""
        with self._lock:
            state = self._states.get(source.key)
            if state is not None and (token is None or state.token == token):
                state.token = None

    def delivered(self, source: TokenSource) -> None:
        """A 2xx with the token: token requests are spaced from the initial delay again."""
        with self._lock:
            state = self._states.get(source.key)
            if state is not None:
                state.delay_s = None

    def clear(self) -> None:
        with self._lock:
            self._states.clear()


TOKENS = TokenCache()
"""The executor process's tokens (Hermes keeps them per consumer node)."""
