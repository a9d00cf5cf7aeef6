"""Attempt headers, Basic auth from the endpoint, and masking of passwords."""

import base64

import pytest

from herald.delivery.headers import attempt_headers, basic_authorization, static_headers
from herald.delivery.message import message_id
from herald.endpoint import Endpoint, mask_secrets


def test_static_headers_with_identity_custom_and_auth():
    headers = static_headers("application/json", "g.topic", "sub", True, (("X-Team", "a"),), "Basic abc")
    assert headers == {
        "Content-Type": "application/json",
        "Hermes-Topic-Name": "g.topic",
        "Hermes-Subscription-Name": "sub",
        "X-Team": "a",
        "Authorization": "Basic abc",
    }
    assert "Hermes-Topic-Name" not in static_headers("application/json", "g.topic", "sub", False)


def test_attempt_headers_add_id_and_retry_count_without_touching_the_static_ones():
    static = {"Content-Type": "application/json"}
    headers = attempt_headers(static, "m-1", 2)
    assert headers["Hermes-Message-Id"] == "m-1" and headers["Hermes-Retry-Count"] == "2"
    assert static == {"Content-Type": "application/json"}


def test_basic_auth_from_endpoint():
    endpoint = Endpoint.parse("http://alice:p%40ss:w@example.com:8080/hook?x=1")
    assert endpoint.url == "http://example.com:8080/hook?x=1"
    assert (endpoint.user, endpoint.password) == ("alice", "p@ss:w")
    token = basic_authorization(endpoint.user, endpoint.password).split()[1]
    assert base64.b64decode(token) == b"alice:p@ss:w"


def test_passwords_never_show():
    endpoint = Endpoint.parse("https://bob:hunter2@h.example/x")
    assert "hunter2" not in endpoint.masked and "hunter2" not in repr(endpoint)
    assert endpoint.masked == "https://bob:*****@h.example/x"
    text = "failed to reach http://bob:hunter2@h.example/x and https://u:v@other/y"
    assert mask_secrets(text) == "failed to reach http://bob:*****@h.example/x and https://u:*****@other/y"
    assert mask_secrets("lookup http://:token@lookup.example/x failed") == \
        "lookup http://:*****@lookup.example/x failed"


@pytest.mark.parametrize("raw", ["ftp://h/x", "http://", "not a url", "http://h:99999/"])
def test_invalid_endpoints_are_rejected(raw):
    with pytest.raises(ValueError):
        Endpoint.parse(raw)


def test_message_id_prefers_the_id_header_and_is_otherwise_deterministic():
    assert message_id("t", 0, 5, [("id", b"abc")]) == "abc"
    first = message_id("t", 0, 5, [])
    assert first == message_id("t", 0, 5, None) and first != message_id("t", 0, 6, None)
