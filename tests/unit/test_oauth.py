"""OAuth 2 (Hermes' "OAuth"): the token cache's spacing of token requests on a fake clock, the lane's 401 and
token-failure paths on the fake transport, and the configuration's checks. Against a real token endpoint:
tests/integration/test_oauth_e2e.py."""

from __future__ import annotations

import json

import pytest

from herald.config import ConfigError, load_config
from herald.delivery.oauth import TokenCache, TokenError, TokenSource, Wait
from herald.delivery.transport import HttpAnswer
from tests.support.config_files import SETTINGS, SUBSCRIPTION, write_conf
from tests.support.delivery import batch, lane, lane_report, record, retry_policy, run
from tests.support.fake_transport import FakeClock

SOURCE = TokenSource(provider="p", token_endpoint="http://127.0.0.1:9/token", client_id="herald",
                     client_secret="s3cret-client", grant_type="clientCredentials", initial_delay_s=1.0,
                     max_delay_s=4.0)


class Issuer:
    """Stands in for the token endpoint: token-1, token-2, ...; fails while `down`."""

    def __init__(self) -> None:
        self.requests: list[float] = []
        self.down = False
        self.clock: FakeClock | None = None

    def __call__(self, source: TokenSource) -> str:
        self.requests.append(self.clock.monotonic() if self.clock else 0.0)
        if self.down:
            raise TokenError(f"OAuth token request to provider {source.provider} failed with status code:503")
        return f"token-{len(self.requests)}"


def test_token_requests_are_spaced_by_a_growing_delay_that_a_2xx_resets():
    issuer = Issuer()
    tokens = TokenCache(issuer)
    assert tokens.token(SOURCE, 0.0) == "token-1"
    assert tokens.token(SOURCE, 0.1) == "token-1", "cached"
    tokens.invalidate(SOURCE, "token-1")
    with pytest.raises(Wait) as wait:
        tokens.token(SOURCE, 0.5)
    assert wait.value.at == 1.0, "the initial delay after the first request"
    assert tokens.token(SOURCE, 1.0) == "token-2"
    tokens.invalidate(SOURCE, "token-2")
    with pytest.raises(Wait) as wait:
        tokens.token(SOURCE, 2.0)
    assert wait.value.at == 3.0, "doubled: 2 s after the second request"
    assert tokens.token(SOURCE, 3.0) == "token-3"
    tokens.invalidate(SOURCE, "token-3")
    assert pytest.raises(Wait, tokens.token, SOURCE, 3.5).value.at == 7.0, "4 s, the max"
    assert tokens.token(SOURCE, 7.0) == "token-4"
    tokens.invalidate(SOURCE, "token-4")
    assert pytest.raises(Wait, tokens.token, SOURCE, 7.5).value.at == 11.0, "stays at the max"
    assert tokens.token(SOURCE, 11.0) == "token-5"
    tokens.delivered(SOURCE)  # a 2xx: spacing starts over
    tokens.invalidate(SOURCE, "token-5")
    assert pytest.raises(Wait, tokens.token, SOURCE, 11.2).value.at == 15.0, "the running spacing still holds"
    assert tokens.token(SOURCE, 15.0) == "token-6"
    tokens.invalidate(SOURCE, "token-6")
    assert pytest.raises(Wait, tokens.token, SOURCE, 15.5).value.at == 16.0, "back to the initial delay"


def test_an_old_token_refused_late_does_not_drop_a_newer_one():
    tokens = TokenCache(Issuer())
    assert tokens.token(SOURCE, 0.0) == "token-1"
    tokens.invalidate(SOURCE, "token-1")
    assert tokens.token(SOURCE, 5.0) == "token-2"
    tokens.invalidate(SOURCE, "token-1")
    assert tokens.token(SOURCE, 5.1) == "token-2"


def bearer(sent) -> str | None:
    return sent.header("Authorization")


def test_a_401_gets_a_new_token_and_is_retried_whatever_retry_client_errors_says():
    clock = FakeClock()
    issuer = Issuer()
    issuer.clock = clock
    tokens = TokenCache(issuer)

    def respond(request, attempt):
        headers = dict(line.split(": ", 1) for line in request.header_lines)
        return HttpAnswer(200 if headers["Authorization"] == "Bearer token-2" else 401), 0.01

    plan = lane(oauth=SOURCE, retry=retry_policy(message_ttl_s=60, backoff_s=0.1, retry_client_errors=False))
    report, transport, _ = run({0: plan}, [batch([(record(0, 0), (0,))])], respond, clock=clock, tokens=tokens,
                               park_after_s=10)
    assert [bearer(s) for s in transport.sent] == ["Bearer token-1", "Bearer token-2"]
    assert transport.sent[1].started - transport.sent[0].started >= 1.0, "the token request waited its delay"
    assert [s.header("Hermes-Retry-Count") for s in transport.sent] == ["0", "1"]
    assert lane_report(report).counters.delivered == 1 and lane_report(report).counters.codes_4xx == 1


def test_a_failing_token_endpoint_is_a_retryable_failure_that_ends_in_undelivered_with_its_reason():
    clock = FakeClock()
    issuer = Issuer()
    issuer.clock, issuer.down = clock, True
    plan = lane(oauth=SOURCE, retry=retry_policy(message_ttl_s=3, backoff_s=0.5))
    report, transport, _ = run({0: plan}, [batch([(record(0, 0), (0,))])], lambda r, a: (HttpAnswer(200), 0.01),
                               clock=clock, tokens=TokenCache(issuer), park_after_s=10)
    assert transport.sent == [], "nothing reaches the subscriber without a token"
    (discarded,) = lane_report(report).discarded
    assert discarded.reason == "OAuth token request to provider p failed with status code:503"
    assert discarded.ended_by == "messageTtl" and discarded.attempts >= 2
    gaps = [b - a for a, b in zip(issuer.requests, issuer.requests[1:])]
    assert gaps and all(gap >= 1.0 - 1e-9 for gap in gaps), "token requests stay spaced while they fail"
    assert lane_report(report).counters.other_errors == discarded.attempts


PROVIDERS = SETTINGS + """
oauthProviders:
  - name: auth
    tokenEndpoint: http://127.0.0.1:9/token
    clientId: herald
    clientSecret: ${env:CLIENT_SECRET}
"""


def problems(tmp_path, settings: str, subscription: str) -> list:
    with pytest.raises(ConfigError) as caught:
        load_config(write_conf(tmp_path, settings=settings, subscriptions={"billing": subscription}))
    return caught.value.problems


def test_validate_names_an_unknown_provider_missing_credentials_and_basic_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("CLIENT_SECRET", "client-s3cret")
    unknown = SUBSCRIPTION + "oAuthPolicy: {grantType: clientCredentials, providerName: nope}\n"
    (problem,) = problems(tmp_path / "1", PROVIDERS, unknown)
    assert problem.key == "oAuthPolicy.providerName" and "defined: auth" in problem.message
    bare = SUBSCRIPTION + "oAuthPolicy: {grantType: password, providerName: auth, username: ann}\n"
    (problem,) = problems(tmp_path / "2", PROVIDERS, bare)
    assert problem.key == "oAuthPolicy" and "needs username and password" in problem.message
    basic = SUBSCRIPTION.replace("http://127.0.0.1", "http://ann:pw@127.0.0.1") + \
        "oAuthPolicy: {grantType: clientCredentials, providerName: auth}\n"
    (problem,) = problems(tmp_path / "3", PROVIDERS, basic)
    assert "exclude each other" in problem.message and "pw@" not in str(problem)


def test_secrets_are_never_shown(tmp_path, monkeypatch, capsys):
    from herald.cli import main
    from herald.engine.round.planner import token_source

    monkeypatch.setenv("CLIENT_SECRET", "client-s3cret")
    monkeypatch.setenv("OWNER_PASSWORD", "owner-s3cret")
    policy = SUBSCRIPTION + ("oAuthPolicy: {grantType: password, providerName: auth, username: ann, "
                             "password: '${env:OWNER_PASSWORD}', scope: hooks}\n")
    conf = write_conf(tmp_path, settings=PROVIDERS, subscriptions={"billing": policy})
    config = load_config(conf)
    subscription = config.subscription("shop.orders.billing")
    source = token_source(subscription, {p.name: p for p in config.settings.oauthProviders})
    assert (source.client_secret, source.password, source.scope) == ("client-s3cret", "owner-s3cret", "hooks")
    assert source.form() == {"grant_type": "password", "username": "ann", "password": "owner-s3cret",
                             "scope": "hooks"}
    for shown in (repr(source), repr(subscription), repr(config.settings), str(subscription.model_dump())):
        assert "s3cret" not in shown
    assert main(["oauth", "providers", "--conf", str(conf), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == [{"name": "auth", "tokenEndpoint": "http://127.0.0.1:9/token", "clientId": "herald",
                       "clientSecret": "******", "tokenRequestInitialDelay": 1000, "tokenRequestMaxDelay": 30000,
                       "requestTimeout": 1000, "socketTimeout": 500, "tls": None}]
    assert main(["oauth", "providers", "--conf", str(conf)]) == 0
    text = capsys.readouterr().out
    assert "******" in text and "s3cret" not in text
