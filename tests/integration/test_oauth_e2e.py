"""OAuth 2 end to end against a real token endpoint (oauthlib's server classes) on 127.0.0.1, a subscriber that
checks the bearer token, the embedded broker, Spark and Delta: both grants, a 401 then a new token, token
rotation, the spacing of token requests, a failing provider, and secrets kept out of every table."""

from __future__ import annotations

import json

import pytest

from herald.config import load_config
from herald.engine.runner import Runner
from herald.storage import DeltaRsStore
from herald.storage.tables import UNDELIVERED
from tests.support.herald_env import produce, write_conf
from tests.support.oauth_server import TokenEndpoint
from tests.support.subscriber import Received, Reply, ScriptedSubscriber

pytestmark = [pytest.mark.spark, pytest.mark.broker]

CLIENT_SECRET = "client-s3cret-value"
OWNER_PASSWORD = "owner-s3cret-value"


def oauth_conf(tmp_path, broker, topic, issuer: TokenEndpoint, policy: dict, endpoint: str,
               initial_delay_ms: int = 300, streaming: dict | None = None, **subscription):
    return write_conf(tmp_path, broker.bootstrap_servers, topic, {"hook": {
        "endpoint": endpoint, "oAuthPolicy": policy, **subscription}},
        settings={"oauthProviders": [{"name": "auth", "tokenEndpoint": issuer.url, "clientId": "herald",
                                      "clientSecret": "${env:CLIENT_SECRET}",
                                      "tokenRequestInitialDelay": initial_delay_ms, "tokenRequestMaxDelay": 5000}],
                  **({"streaming": streaming} if streaming else {})})


def checking(issuer: TokenEndpoint, refuse_first: int = 0):
    """A subscriber's answer: 200 for a valid bearer token, 401 otherwise (and for the first `refuse_first`
    distinct tokens it sees, as if they had been revoked)."""
    seen: list[str] = []

    def respond(request: Received) -> Reply:
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else None
        if token and token not in seen:
            seen.append(token)
        if token is not None and seen.index(token) < refuse_first:
            return Reply(401)
        return Reply(200 if issuer.valid(token) else 401)

    return respond


@pytest.mark.parametrize("grant", ["clientCredentials", "password"])
def test_both_grants_get_a_token_once_and_every_request_carries_it(grant, broker, spark, topic_name, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("CLIENT_SECRET", CLIENT_SECRET)
    monkeypatch.setenv("OWNER_PASSWORD", OWNER_PASSWORD)
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(6)])
    policy = {"grantType": grant, "providerName": "auth", "scope": "hooks"}
    if grant == "password":
        policy.update(username="ann", password="${env:OWNER_PASSWORD}")
    with TokenEndpoint({"herald": CLIENT_SECRET}, {"ann": OWNER_PASSWORD}) as issuer:
        with ScriptedSubscriber(checking(issuer)) as sub:
            conf = oauth_conf(tmp_path, broker, topic_name, issuer, policy, sub.url + "/hook")
            assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sorted(r.json()["i"] for r in sub.requests) == list(range(6))
    assert all(issuer.valid(r.headers["Authorization"][7:]) for r in sub.requests)
    assert len(issuer.requests) == 1, "one token, cached for every message"
    _, grant_type, user, scope = issuer.requests[0]
    assert (grant_type, user, scope) == (("password", "ann", "hooks") if grant == "password"
                                         else ("client_credentials", None, "hooks"))


def test_a_401_gets_a_new_token_with_requests_spaced_by_a_growing_delay_then_rotation(broker, spark, topic_name,
                                                                                     tmp_path, monkeypatch):
    monkeypatch.setenv("CLIENT_SECRET", CLIENT_SECRET)
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": 0}])
    policy = {"grantType": "clientCredentials", "providerName": "auth"}
    with TokenEndpoint({"herald": CLIENT_SECRET}) as issuer:
        with ScriptedSubscriber(checking(issuer, refuse_first=2)) as sub:
            conf = oauth_conf(tmp_path, broker, topic_name, issuer, policy, sub.url + "/hook",
                              subscriptionPolicy={"messageBackoff": 50, "messageTtl": 60})
            assert Runner(load_config(conf), spark=spark).run(once=True) == 0
            tokens = [r.headers["Authorization"][7:] for r in sorted(sub.requests, key=lambda r: r.at)]
            assert len(tokens) == 3 and len(set(tokens)) == 3, "each 401 brought a new token"
            assert [r.headers["Hermes-Retry-Count"] for r in sorted(sub.requests, key=lambda r: r.at)] == \
                ["0", "1", "2"]
            times = issuer.arrivals  # a request is sent at least the delay after the previous one was sent; its
            # arrival can trail its sending by a few ms of scheduling, hence the 50 ms allowance
            assert times[1] - times[0] >= 0.3 - 0.05 and times[2] - times[1] >= 0.6 - 0.05, "spaced 300, then 600 ms"

            issuer.revoke_all()  # rotation: every token issued so far stops working
            revoked = set(issuer.revoked)
            produce(broker.bootstrap_servers, topic_name, [{"i": 1}])
            assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    later = [r.headers["Authorization"][7:] for r in sorted(sub.requests, key=lambda r: r.at) if r.json()["i"] == 1]
    # a worker that still held a revoked token was refused (401) and fetched a new one; one without a token
    # fetched it at once: either way the message went out with a token issued after the rotation
    assert later[-1] not in revoked and issuer.valid(later[-1])
    assert all(token in revoked for token in later[:-1]) and len(later) <= 2


def test_a_failing_provider_ends_in_undelivered_with_its_reason_and_no_secret(broker, spark, topic_name, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("CLIENT_SECRET", CLIENT_SECRET)
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": 0}])
    policy = {"grantType": "clientCredentials", "providerName": "auth"}
    with TokenEndpoint({"herald": "another-secret"}) as issuer:  # refuses Herald's client secret
        with ScriptedSubscriber(checking(issuer)) as sub:
            conf = oauth_conf(tmp_path, broker, topic_name, issuer, policy, sub.url + "/hook",
                              subscriptionPolicy={"messageBackoff": 100, "messageTtl": 2},
                              streaming={"parkAfterMs": 10_000})  # waits stay in the task until the TTL ends it,
            # however slow the machine: a --once run would otherwise leave the message parked for the next run
            assert Runner(load_config(conf), spark=spark).run(once=True) == 0
    assert sub.requests == [], "nothing is sent without a token"
    assert issuer.refused >= 2
    rows = DeltaRsStore(str(tmp_path / "storage")).read(UNDELIVERED).to_pylist()
    (row,) = rows
    assert row["reason"] == "OAuth token request to provider auth failed with status code:401"
    tables = json.dumps([r for t in ("undelivered", "metrics", "offsets", "retries")
                         for r in DeltaRsStore(str(tmp_path / "storage")).read(t).to_pylist()], default=str)
    assert CLIENT_SECRET not in tables
