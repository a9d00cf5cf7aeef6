"""OAuth token requests over HTTPS: a real token endpoint (oauthlib's server classes) on 127.0.0.1 serving TLS
with a test CA made at test time and asking for a client certificate, a subscriber that checks the bearer token,
and the task's delivery loop (no Spark) on both transports, its plan built from a conf directory as the job builds
it: the provider's `tls` (or herald.yaml's delivery.tls under it) is what the token request trusts and shows.
Without the test CA the token request fails as a retryable TLS failure that says so; no secret reaches a log."""

from __future__ import annotations

import itertools
import json
import logging
import textwrap
import time

import pytest

from herald.config import load_config
from herald.delivery.flow import FlowSettings
from herald.delivery.input import InputBatch
from herald.delivery.message import Record, message_id
from herald.delivery.oauth import TOKENS
from herald.delivery.plan import TaskPlan
from herald.delivery.sender import TaskSender
from herald.delivery.transport import open_transport
from herald.engine.round.planner import lane_plan
from herald.engine.round.state import SubscriptionState
from tests.support.oauth_server import TokenEndpoint
from tests.support.subscriber import Received, Reply, ScriptedSubscriber
from tests.support.tls_certs import TestPki

PASSPHRASE = "token endpoint key passphrase"
CLIENT_SECRET = "client-s3cret-value"

_offsets = itertools.count()


@pytest.fixture(params=["curl", "requests"])
def transport_kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"), key_password=PASSPHRASE)


@pytest.fixture(autouse=True)
def fresh_tokens(monkeypatch):
    """Each test asks the token endpoint itself (the process's token cache starts empty)."""
    monkeypatch.setenv("CLIENT_SECRET", CLIENT_SECRET)
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    TOKENS.clear()
    yield
    TOKENS.clear()


def conf_for(root, pki: TestPki, token_url: str, hook_url: str, provider_tls: str = "", delivery_tls: str = ""):
    """herald.yaml with the provider `auth` (its `tls` if given) and one subscription of g.t using it."""
    conf = root / "conf"
    (conf / "certs").mkdir(parents=True)
    for path in pki.directory.glob("*.pem"):
        (conf / "certs" / path.name).write_bytes(path.read_bytes())
    (conf / "topics").mkdir()
    (conf / "subscriptions").mkdir()
    (conf / "herald.yaml").write_text(textwrap.dedent(f"""
        kafka: {{bootstrapServers: 127.0.0.1:9092}}
        storage: {{path: ../state}}
        {f"delivery: {{tls: {delivery_tls}}}" if delivery_tls else ""}
        oauthProviders:
          - name: auth
            tokenEndpoint: {token_url}
            clientId: herald
            clientSecret: ${{env:CLIENT_SECRET}}
            tokenRequestInitialDelay: 100
            tokenRequestMaxDelay: 400
            requestTimeout: 2000
            socketTimeout: 2000
            {f"tls: {provider_tls}" if provider_tls else ""}
        """))
    (conf / "topics" / "t.yaml").write_text("name: g.t\n")
    (conf / "subscriptions" / "hook.yaml").write_text(textwrap.dedent(f"""
        topicName: g.t
        name: hook
        endpoint: {hook_url}
        oAuthPolicy: {{grantType: clientCredentials, providerName: auth}}
        subscriptionPolicy: {{messageTtl: 2, messageBackoff: 100}}
        """))
    return conf


def deliver(kind: str, conf, count: int):
    """The job's lane plan for g.t.hook, one task delivering `count` records with it (retries stay in the task)."""
    config = load_config(conf)
    plan = lane_plan(SubscriptionState(config.subscription("g.t.hook")), FlowSettings(), parked=0,
                     providers={provider.name: provider for provider in config.settings.oauthProviders})
    records = []
    for i in range(count):
        offset = next(_offsets)
        records.append(Record(partition=0, offset=offset, timestamp_ms=int(time.time() * 1000),
                              message_id=message_id("g.t", 0, offset, None), body=json.dumps({"i": i}).encode()))
    task = TaskPlan(topic="g.t", lanes={0: plan}, budget_s=60, park_after_s=60, transport=kind)
    report = TaskSender(task, open_transport(kind, 16)).run([InputBatch([(r, (0,)) for r in records])])
    return plan, report.lanes[0]


def checking(issuer: TokenEndpoint):
    def respond(request: Received) -> Reply:
        header = request.headers.get("Authorization", "")
        return Reply(200 if header.startswith("Bearer ") and issuer.valid(header[7:]) else 401)

    return respond


MUTUAL = ("{caBundle: certs/ca.pem, clientCert: certs/client.pem, clientKey: certs/client-key.pem, "
          "clientKeyPassword: '${env:KEY_PASSWORD}'}")


@pytest.mark.parametrize("where", ["provider", "delivery"])
def test_the_token_is_fetched_over_mutual_tls_with_the_configured_ca_and_client_certificate(
        transport_kind, pki, tmp_path, caplog, where):
    """The token endpoint's certificate is signed by the test CA and it asks for a client certificate: the
    provider's tls (or herald.yaml's delivery.tls, which it falls back to) names both."""
    caplog.set_level(logging.DEBUG)
    with TokenEndpoint({"herald": CLIENT_SECRET}, tls=pki.server_context(require_client_cert=True)) as issuer:
        assert issuer.url.startswith("https://127.0.0.1:")
        with ScriptedSubscriber(checking(issuer)) as sub:  # plain HTTP: delivery.tls does not matter to it
            settings = {"provider_tls": MUTUAL} if where == "provider" else {"delivery_tls": MUTUAL}
            plan, lane = deliver(transport_kind, conf_for(tmp_path, pki, issuer.url, sub.url + "/hook", **settings), 3)
    assert lane.counters.delivered == 3 and lane.discarded == []
    assert sorted(r.json()["i"] for r in sub.requests) == [0, 1, 2]
    assert len(issuer.requests) == 1 and issuer.client_cns == ["herald-client"], "one token, over mutual TLS"
    assert issuer.tls_errors == []
    for text in (caplog.text, repr(plan), repr(plan.oauth), repr(lane)):
        assert PASSPHRASE not in text and CLIENT_SECRET not in text


def test_without_the_ca_the_token_request_fails_as_a_retryable_tls_failure(transport_kind, pki, tmp_path, caplog):
    """No tls for the provider: certifi's CAs do not know the test CA. Each attempt that needs the token asks
    again (spaced) until messageTtl; the reason says it was the token request and what TLS said; nothing
    reaches the subscriber."""
    caplog.set_level(logging.DEBUG)
    with TokenEndpoint({"herald": CLIENT_SECRET}, tls=pki.server_context()) as issuer:
        with ScriptedSubscriber(checking(issuer)) as sub:
            plan, lane = deliver(transport_kind, conf_for(tmp_path, pki, issuer.url, sub.url + "/hook"), 1)
    assert sub.requests == [] and issuer.requests == []
    (discarded,) = lane.discarded
    assert discarded.reason == ("OAuth token request to provider auth failed: TLS: certificate verify failed: "
                                "unable to get local issuer certificate")
    assert discarded.ended_by == "messageTtl" and discarded.attempts >= 2, "retried until its TTL"
    assert len(issuer.tls_errors) >= 2, "each retry asked the token endpoint again"
    for text in (caplog.text, repr(plan), repr(lane)):
        assert PASSPHRASE not in text and CLIENT_SECRET not in text


def test_another_ca_for_the_provider_overrides_herald_yamls(transport_kind, pki, tmp_path):
    """delivery.tls trusts the test CA, the provider's own caBundle another one: the provider's is used."""
    with TokenEndpoint({"herald": CLIENT_SECRET}, tls=pki.server_context()) as issuer:
        with ScriptedSubscriber(checking(issuer)) as sub:
            conf = conf_for(tmp_path, pki, issuer.url, sub.url + "/hook", provider_tls="{caBundle: certs/other-ca.pem}",
                            delivery_tls="{caBundle: certs/ca.pem}")
            _, lane = deliver(transport_kind, conf, 1)
    (discarded,) = lane.discarded
    assert discarded.reason.startswith("OAuth token request to provider auth failed: TLS: certificate verify failed")
    assert sub.requests == []
