"""Signed requests (Standard Webhooks): the signature checked by an independent verifier (the
`standardwebhooks` package) for JSON bodies and by hand for bytes; secrets validated and never shown."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from herald.config import ConfigError, load_config
from herald.delivery.signing import signature, signature_lines, signing_key
from herald.delivery.transport import HttpAnswer
from tests.support.config_files import SUBSCRIPTION, write_conf
from tests.support.delivery import batch, lane, record, retry_policy, run
from tests.support.fake_transport import FakeClock

RAW = "a-raw-secret-of-32-bytes-long-ok"
ENCODED = "whsec_" + base64.b64encode(b"k" * 32).decode()


def headers_of(lines: tuple[str, ...]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in lines)


def test_a_json_body_verifies_with_the_oracle_for_both_secret_forms():
    body = json.dumps({"order": 1, "text": "zażółć"}).encode()
    now_s = int(dt.datetime.now(dt.timezone.utc).timestamp())
    for secret, oracle in ((ENCODED, Webhook(ENCODED)), (RAW, Webhook(RAW.encode()))):
        headers = headers_of(signature_lines((signing_key(secret),), "msg-1", now_s, body))
        assert oracle.verify(body, headers) == json.loads(body)
        tampered = dict(headers, **{"webhook-id": "msg-2"})
        with pytest.raises(WebhookVerificationError):
            oracle.verify(body, tampered)


def test_one_signature_per_secret_each_verifies_alone_for_key_rotation():
    body = b'{"a": 1}'
    now_s = int(dt.datetime.now(dt.timezone.utc).timestamp())
    old, new = ENCODED, "whsec_" + base64.b64encode(b"n" * 40).decode()
    headers = headers_of(signature_lines((signing_key(old), signing_key(new)), "id-7", now_s, body))
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(body, headers)
    Webhook(new).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(body, headers)


def test_binary_bodies_are_signed_as_their_exact_bytes():
    body = bytes(range(256))  # Avro binary is not UTF-8: sign the bytes, never a decoded text
    key = signing_key(ENCODED)
    expected = hmac.new(b"k" * 32, b"id-9.1800000000." + body, hashlib.sha256).digest()
    assert signature(key, "id-9", 1_800_000_000, body) == "v1," + base64.b64encode(expected).decode()


@pytest.mark.parametrize("secret, why", [("short", "at least 24 bytes"), ("whsec_!!notbase64!!", "base64"),
                                         ("whsec_" + base64.b64encode(b"k" * 10).decode(), "at least 24 bytes")])
def test_bad_secrets_are_refused(secret, why):
    with pytest.raises(ValueError, match=why):
        signing_key(secret)


def test_the_config_names_a_bad_secret_by_file_and_key_and_never_shows_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", "tooshort-secret")
    signed = SUBSCRIPTION + "signing: {secrets: ['${env:HOOK_SECRET}']}\n"
    conf = write_conf(tmp_path, subscriptions={"billing": signed})
    with pytest.raises(ConfigError) as caught:
        load_config(conf)
    (problem,) = caught.value.problems
    assert problem.file.endswith("billing.yaml") and problem.key.startswith("signing.secrets")
    assert "at least 24 bytes" in problem.message and "tooshort-secret" not in str(caught.value)


def test_a_valid_secret_is_loaded_and_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", RAW)
    signed = SUBSCRIPTION + "signing: {secrets: ['${env:HOOK_SECRET}']}\n"
    conf = write_conf(tmp_path, subscriptions={"billing": signed})
    subscription = load_config(conf).subscription("shop.orders.billing")
    assert subscription.signing.keys() == (RAW.encode(),)
    for shown in (repr(subscription), str(subscription), repr(subscription.signing), str(subscription.model_dump())):
        assert RAW not in shown


def test_every_attempt_is_signed_with_its_own_timestamp_and_the_same_id():
    clock = FakeClock()
    key = signing_key(ENCODED)

    def respond(request, attempt):
        return HttpAnswer(500 if attempt == 0 else 200), 0.01

    plan = lane(signing_keys=(key,), retry=retry_policy(message_ttl_s=60, backoff_s=2.5))
    _, transport, _ = run({0: plan}, [batch([(record(0, 0), (0,))])], respond, clock=clock, park_after_s=10)
    stamps = []
    for sent in transport.sent:
        headers = headers_of(tuple(sent.request.header_lines))
        assert headers["webhook-id"] == sent.message_id
        stamp = int(headers["webhook-timestamp"])
        assert stamp == (1_800_000_000_000 + round((sent.started - 1000.0) * 1000)) // 1000, "the attempt's time"
        assert headers["webhook-signature"] == signature(key, sent.message_id, stamp, sent.request.body)
        stamps.append(stamp)
    assert len(stamps) == 2 and stamps[1] - stamps[0] >= 2, "a retry is signed again, at its own time"


def test_unsigned_subscriptions_carry_no_signature_headers():
    _, transport, _ = run({0: lane()}, [batch([(record(0, 0), (0,))])], lambda r, a: (HttpAnswer(200), 0.01))
    assert not any(line.lower().startswith("webhook-") for line in transport.sent[0].request.header_lines)
