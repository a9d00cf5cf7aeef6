"""HTTPS delivery against real TLS servers on 127.0.0.1 with a test CA made at test time (tests/support/tls_certs.py),
through the task's delivery loop (no Spark), on both transports: verification on by default, a CA bundle, mutual
TLS, a TLS failure retried and then undelivered with a reason that says what was wrong, herald.yaml's settings
under a subscription's own, and no passphrase anywhere it could be read."""

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
from herald.delivery.plan import LanePlan, TaskPlan
from herald.delivery.policy import EndedBy
from herald.delivery.sender import TaskSender
from herald.delivery.tls import TlsSettings
from herald.delivery.transport import HttpRequest, open_transport
from herald.engine.round.planner import lane_plan
from herald.engine.round.state import SubscriptionState
from tests.support.delivery import lane_plan as default_lane_plan
from tests.support.delivery import retry_policy
from tests.support.subscriber import ScriptedSubscriber
from tests.support.tls_certs import TestPki

PASSPHRASE = "correct horse battery staple"
UNTRUSTED = "TLS: certificate verify failed: unable to get local issuer certificate"
REFUSED = "TLS: tlsv13 alert certificate required"

_offsets = itertools.count()


@pytest.fixture(params=["curl", "requests"])
def transport_kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"), key_password=PASSPHRASE)


def trusting(pki: TestPki, client: bool = False) -> TlsSettings:
    """The test CA trusted; with `client`, the client certificate and its encrypted key shown."""
    if not client:
        return TlsSettings(ca_bundle=str(pki.ca))
    return TlsSettings(ca_bundle=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key),
                       client_key_password=PASSPHRASE)


def record(document: dict) -> Record:
    offset = next(_offsets)
    return Record(partition=0, offset=offset, timestamp_ms=int(time.time() * 1000),
                  message_id=message_id("g.t", 0, offset, None), body=json.dumps(document).encode())


def plan_for(url: str, tls: TlsSettings | None, **overrides) -> LanePlan:
    values = dict(retry=retry_policy(message_ttl_s=5, backoff_s=0.05), inflight=4, rate_per_s=1000.0,
                  request_timeout_s=2.0, flow_settings=FlowSettings(adjust_interval_s=30), tls=tls)
    values.update(overrides)
    return default_lane_plan(url, **values)


def deliver(kind: str, lanes: dict[int, LanePlan], records: list[Record], max_open: int = 64):
    """One task delivering every record to every lane; retries go on in the task (nothing is parked)."""
    task = TaskPlan(topic="g.t", lanes=lanes, budget_s=60, park_after_s=60, transport=kind)
    report = TaskSender(task, open_transport(kind, max_open)).run(
        [InputBatch([(r, tuple(lanes)) for r in records])])
    return report.lanes


def test_a_certificate_the_ca_bundle_trusts_is_delivered_over_reused_connections(transport_kind, pki):
    with ScriptedSubscriber(tls=pki.server_context()) as sub:
        assert sub.url.startswith("https://127.0.0.1:")
        lanes = deliver(transport_kind, {0: plan_for(sub.url + "/hook", trusting(pki), inflight=1)},
                        [record({"i": n}) for n in range(5)], max_open=1)
    assert lanes[0].counters.delivered == 5 and not lanes[0].discarded
    assert sorted(r.json()["i"] for r in sub.requests) == list(range(5))
    assert len({r.client_port for r in sub.requests}) == 1, "one TLS connection, kept alive"
    assert sub.tls_errors == []


def test_localhost_is_verified_by_its_name_too(transport_kind, pki):
    with ScriptedSubscriber(tls=pki.server_context()) as sub:
        url = sub.url.replace("127.0.0.1", "localhost")
        lanes = deliver(transport_kind, {0: plan_for(url, trusting(pki))}, [record({"i": 1})])
    assert lanes[0].counters.delivered == 1


@pytest.mark.parametrize("trusted", ["default CAs", "another CA"])
def test_an_untrusted_certificate_is_retried_then_undelivered_with_a_tls_reason(transport_kind, pki, trusted):
    tls = None if trusted == "default CAs" else TlsSettings(ca_bundle=str(pki.other_ca))
    # A TTL of 30 backoffs: three attempts fit even when a loaded machine makes each handshake take ~1 s (with
    # 0.6 s, two attempts of 0.3 s were all there was room for). The test still ends by the TTL.
    with ScriptedSubscriber(tls=pki.server_context()) as sub:
        lanes = deliver(transport_kind, {0: plan_for(sub.url, tls, retry=retry_policy(message_ttl_s=3,
                                                                                     backoff_s=0.1))},
                        [record({"i": 1})])
    assert sub.requests == [], "nothing reached a server whose certificate did not verify"
    (item,) = lanes[0].discarded
    assert item.reason == UNTRUSTED
    assert item.ended_by == EndedBy.TTL and item.attempts >= 3, "a TLS failure is retried, as a connection one is"
    assert lanes[0].counters.other_errors == item.attempts and lanes[0].counters.delivered == 0


def test_another_hosts_certificate_is_refused(transport_kind, pki):
    with ScriptedSubscriber(tls=pki.server_context(wrong_host=True)) as sub:
        lanes = deliver(transport_kind, {0: plan_for(sub.url, trusting(pki), retry=retry_policy(
            message_ttl_s=10, backoff_s=0.01, max_attempts=2))}, [record({"i": 1})])
    assert sub.requests == []
    (item,) = lanes[0].discarded
    assert item.reason == "TLS: certificate verify failed: certificate is not valid for '127.0.0.1'"
    assert item.attempts == 2


def test_mutual_tls_delivers_with_the_client_certificate_only(transport_kind, pki):
    retry = retry_policy(message_ttl_s=10, backoff_s=0.01, max_attempts=2)
    with ScriptedSubscriber(tls=pki.server_context(require_client_cert=True)) as sub:
        lanes = deliver(transport_kind, {0: plan_for(sub.url + "/with", trusting(pki, client=True), retry=retry),
                                         1: plan_for(sub.url + "/without", trusting(pki), retry=retry)},
                        [record({"i": n}) for n in range(3)])
    assert lanes[0].counters.delivered == 3 and not lanes[0].discarded
    assert {r.path for r in sub.requests} == {"/with"}, "no attempt without the certificate got through"
    assert {r.client_cert_cn for r in sub.requests} == {"herald-client"}
    assert lanes[1].counters.delivered == 0 and len(lanes[1].discarded) == 3
    for item in lanes[1].discarded:
        assert item.attempts == 2 and item.ended_by == EndedBy.MAX_ATTEMPTS
        assert item.reason == REFUSED, item.reason
    assert any("certificate" in error for error in sub.tls_errors)


def test_one_transport_never_lends_a_connection_to_other_tls_settings(transport_kind, pki):
    """Attempts with and without the client certificate, and with and without the CA, alternate on one
    transport with one slot (curl: one easy handle, set again or reset for each change): each gets what its own
    settings give, never a connection opened with another's; a connection is kept for the same settings."""
    transport = open_transport(transport_kind, 1)
    sequence = [trusting(pki, client=True), trusting(pki), trusting(pki, client=True), trusting(pki, client=True),
                None, trusting(pki, client=True)]
    results = []
    try:
        with ScriptedSubscriber(tls=pki.server_context(require_client_cert=True)) as sub:
            for n, tls in enumerate(sequence):
                transport.start(HttpRequest(f"{sub.url}/{n}", (), b"{}", 2.0, tls=tls), n)
                while transport.open:
                    results += [result for _, result in transport.poll(0.5)]
    finally:
        transport.close()
    assert [getattr(result, "status", None) for result in results] == [200, None, 200, 200, None, 200]
    assert results[1].detail == REFUSED and results[4].detail == UNTRUSTED.replace(
        "unable to get local issuer certificate", "self-signed certificate in certificate chain")
    assert [r.path for r in sub.requests] == ["/0", "/2", "/3", "/5"]
    assert sub.requests[1].client_port == sub.requests[2].client_port, "kept alive for the same settings"


def test_a_wrong_passphrase_is_a_tls_failure(transport_kind, pki):
    tls = TlsSettings(ca_bundle=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key),
                      client_key_password="not it")
    with ScriptedSubscriber(tls=pki.server_context(require_client_cert=True)) as sub:
        lanes = deliver(transport_kind, {0: plan_for(sub.url, tls, retry=retry_policy(
            message_ttl_s=10, backoff_s=0.01, max_attempts=1))}, [record({"i": 1})])
    (item,) = lanes[0].discarded
    assert item.reason.startswith("TLS: ") and "not it" not in item.reason
    assert sub.requests == []


def test_herald_yaml_settings_under_a_subscriptions_own(transport_kind, pki, tmp_path, monkeypatch):
    """From the conf directory to the plan and the wire: herald.yaml trusts the test CA and shows the client
    certificate (paths relative to the conf directory); `inherits` delivers with both, `overrides` replaces the
    CA only (keeping the client certificate) with one that does not sign the server's, and fails."""
    monkeypatch.setenv("TEST_KEY_PASSWORD", PASSPHRASE)
    with ScriptedSubscriber(tls=pki.server_context(require_client_cert=True)) as sub:
        conf = _conf(tmp_path, pki, sub.url)
        config = load_config(conf)
        plans = {index: lane_plan(SubscriptionState(config.subscription(f"g.t.{name}")), FlowSettings(), parked=0)
                 for index, name in enumerate(["inherits", "overrides"])}
        assert plans[0].tls == TlsSettings(str(conf / "certs/ca.pem"), str(conf / "certs/client.pem"),
                                           str(conf / "certs/client-key.pem"), PASSPHRASE)
        assert plans[1].tls == TlsSettings(str(conf / "certs/other-ca.pem"), str(conf / "certs/client.pem"),
                                           str(conf / "certs/client-key.pem"), PASSPHRASE)
        lanes = deliver(transport_kind, plans, [record({"i": n}) for n in range(2)])
    assert lanes[0].counters.delivered == 2
    assert {r.path for r in sub.requests} == {"/inherits"} and {r.client_cert_cn for r in sub.requests} == {
        "herald-client"}
    # a server that verifies clients sends the CA along with its certificate (OpenSSL builds the chain)
    assert [item.reason for item in lanes[1].discarded] == [
        "TLS: certificate verify failed: self-signed certificate in certificate chain"] * 2


def test_the_passphrase_is_never_logged_nor_shown(transport_kind, pki, tmp_path, monkeypatch, caplog, capsys):
    monkeypatch.setenv("TEST_KEY_PASSWORD", PASSPHRASE)
    caplog.set_level(logging.DEBUG)
    with ScriptedSubscriber(tls=pki.server_context(require_client_cert=True)) as sub:
        config = load_config(_conf(tmp_path, pki, sub.url))
        subscription = config.subscription("g.t.inherits")
        plan = lane_plan(SubscriptionState(subscription), FlowSettings(), parked=0)
        wrong = plan_for(sub.url, TlsSettings(str(pki.ca), str(pki.client_cert), str(pki.client_key), PASSPHRASE + "!"),
                         retry=retry_policy(message_ttl_s=10, backoff_s=0.01, max_attempts=1))
        lanes = deliver(transport_kind, {0: plan, 1: wrong}, [record({"i": 1})])
        logging.getLogger("herald").info("plan %s %r, subscription %s %r, settings %r", plan, plan, subscription,
                                         subscription, config.settings)
    assert lanes[0].counters.delivered == 1 and len(lanes[1].discarded) == 1
    shown = [caplog.text, repr(plan), str(plan), repr(plan.tls), repr(subscription.tls), repr(config.settings),
             subscription.model_dump_json(), repr(lanes), *capsys.readouterr()]
    assert "client_key_password='******'" in repr(plan.tls)
    for text in shown:
        assert PASSPHRASE not in text


def _conf(root, pki: TestPki, url: str):
    """A conf directory whose certs/ holds copies of the test PKI's files, herald.yaml trusting the test CA and
    showing the client certificate, and two subscriptions of g.t: `inherits` (no tls) and `overrides` (its own
    caBundle, the other CA)."""
    conf = root / "conf"
    (conf / "certs").mkdir(parents=True)
    for path in pki.directory.glob("*.pem"):
        (conf / "certs" / path.name).write_bytes(path.read_bytes())
    (conf / "topics").mkdir()
    (conf / "subscriptions").mkdir()
    (conf / "herald.yaml").write_text(textwrap.dedent("""
        kafka: {bootstrapServers: 127.0.0.1:9092}
        storage: {path: ../state}
        delivery:
          tls:
            caBundle: certs/ca.pem
            clientCert: certs/client.pem
            clientKey: certs/client-key.pem
            clientKeyPassword: ${env:TEST_KEY_PASSWORD}
        """))
    (conf / "topics" / "t.yaml").write_text("name: g.t\n")
    (conf / "subscriptions" / "inherits.yaml").write_text(f"topicName: g.t\nname: inherits\nendpoint: {url}/inherits\n"
                                                          "subscriptionPolicy: {maxAttempts: 1}\n")
    (conf / "subscriptions" / "overrides.yaml").write_text(
        f"topicName: g.t\nname: overrides\nendpoint: {url}/overrides\n"
                                                           "subscriptionPolicy: {maxAttempts: 1}\n"
                                                           "tls: {caBundle: certs/other-ca.pem}\n")
    return conf
