"""The delivery side's TLS pieces: the same reason for the same TLS failure whichever client reports it (texts
as libcurl 8 and Python's ssl give them), a TLS failure classified as a retryable other error, and settings
whose repr never shows the passphrase."""

from __future__ import annotations

import pickle

import pytest

from herald.delivery.outcome import Category, FailureKind, Verdict, classify
from herald.delivery.tls import TlsSettings, tls_detail
from herald.delivery.transport import HttpRequest, tls_failure


@pytest.mark.parametrize("curl, python, expected", [
    ("SSL certificate OpenSSL verify result: unable to get local issuer certificate (20)",
     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate "
     "(_ssl.c:1006)",
     "certificate verify failed: unable to get local issuer certificate"),
    ("SSL certificate problem: certificate has expired",  # libcurl 7's words
     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired (_ssl.c:1006)",
     "certificate verify failed: certificate has expired"),
    ("SSL: no alternative certificate subject name matches target IPv4 address '127.0.0.1'",
     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not valid "
     "for '127.0.0.1'. (_ssl.c:1006)",
     "certificate verify failed: certificate is not valid for '127.0.0.1'"),
    ("SSL: no alternative certificate subject name matches target host name 'hooks.example.com'",
     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is not valid for "
     "'hooks.example.com'. (_ssl.c:1006)",
     "certificate verify failed: certificate is not valid for 'hooks.example.com'"),
    ("OpenSSL SSL_read: OpenSSL/3.6.5: error:0A00045C:SSL routines::tlsv13 alert certificate required, errno 0",
     "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required (_ssl.c:2580)",
     "tlsv13 alert certificate required"),
])
def test_both_clients_words_give_one_reason(curl, python, expected):
    assert tls_detail(curl) == tls_detail(python) == expected


def test_other_texts_are_kept():
    assert tls_detail("unable to set private key file: '/x/key.pem' type PEM") == \
        "unable to set private key file: '/x/key.pem' type PEM"
    assert tls_detail("[SSL] PEM lib (_ssl.c:3926)") == \
        "cannot load the client certificate or its key (a wrong passphrase?)"


def test_a_tls_failure_is_retried_and_slows_like_a_connection_error():
    failure = tls_failure("SSL certificate OpenSSL verify result: self-signed certificate (18)")
    assert failure.kind is FailureKind.TLS
    assert failure.detail == "TLS: certificate verify failed: self-signed certificate"
    outcome = classify(failure=failure)
    assert (outcome.verdict, outcome.slows, outcome.category) == (Verdict.RETRY, True, Category.OTHER_ERROR)
    assert outcome.reason == failure.detail


def test_settings_never_show_the_passphrase():
    tls = TlsSettings("/c/ca.pem", "/c/client.pem", "/c/key.pem", "hunter2-passphrase")
    request = HttpRequest("https://127.0.0.1/x", (), b"{}", tls=tls)
    for text in (repr(tls), str(tls), repr(request), str(request)):
        assert "hunter2" not in text
    assert repr(tls) == ("TlsSettings(ca_bundle='/c/ca.pem', client_cert='/c/client.pem', client_key='/c/key.pem', "
                         "client_key_password='******')")
    assert repr(TlsSettings(ca_bundle="/c/ca.pem")) == "TlsSettings(ca_bundle='/c/ca.pem')"
    assert pickle.loads(pickle.dumps(tls)) == tls and hash(tls) == hash(pickle.loads(pickle.dumps(tls)))
