"""HTTPS end to end: herald.yaml's delivery.tls and a subscription's own tls reach the Spark tasks (real broker,
Spark, a mutual-TLS subscriber on 127.0.0.1 with a test CA, Delta tables)."""

from __future__ import annotations

import json

import pytest

from herald import readout
from herald.config import load_config
from herald.engine.runner import Runner
from tests.support.herald_env import produce, write_conf
from tests.support.subscriber import ScriptedSubscriber
from tests.support.tls_certs import TestPki

pytestmark = [pytest.mark.spark, pytest.mark.broker]

PASSPHRASE = "e2e key passphrase"


def test_tls_settings_reach_the_tasks(broker, spark, topic_name, tmp_path, monkeypatch, caplog):
    """`trusted` delivers with herald.yaml's CA and client certificate (the subscriber requires one); `pinned`
    overrides the CA with one that did not sign the subscriber's certificate: its messages are undelivered with
    the TLS reason."""
    monkeypatch.setenv("HERALD_KEY_PASSWORD", PASSPHRASE)
    pki = TestPki.create(tmp_path / "pki", key_password=PASSPHRASE)
    broker.create_topics({topic_name: 1})
    produce(broker.bootstrap_servers, topic_name, [{"i": i} for i in range(4)])
    with ScriptedSubscriber(tls=pki.server_context(require_client_cert=True)) as sub:
        tls = {"caBundle": "certs/ca.pem", "clientCert": "certs/client.pem", "clientKey": "certs/client-key.pem",
               "clientKeyPassword": "${env:HERALD_KEY_PASSWORD}"}
        conf = write_conf(tmp_path, broker.bootstrap_servers, topic_name, {
            "trusted": {"endpoint": sub.url + "/trusted"},
            "pinned": {"endpoint": sub.url + "/pinned", "tls": {"caBundle": "certs/other-ca.pem"},
                       "subscriptionPolicy": {"messageTtl": 0}},
        }, settings={"delivery": {"tls": tls}})
        (conf / "certs").mkdir()
        for path in pki.directory.glob("*.pem"):
            (conf / "certs" / path.name).write_bytes(path.read_bytes())
        config = load_config(conf)
        assert Runner(config, spark=spark).run(once=True) == 0
    assert sorted(r.json()["i"] for r in sub.requests) == [0, 1, 2, 3]
    assert {(r.path, r.client_cert_cn) for r in sub.requests} == {("/trusted", "herald-client")}
    pinned = config.subscription(f"{topic_name}.pinned")
    rows = readout.undelivered(config, pinned, limit=10)
    assert sorted(json.loads(row["message"])["i"] for row in rows) == [0, 1, 2, 3]
    assert {row["reason"] for row in rows} == {
        "TLS: certificate verify failed: self-signed certificate in certificate chain"}
    assert PASSPHRASE not in caplog.text
