"""HTTPS settings in the configuration: herald.yaml's delivery.tls and a subscription's tls, read, merged and
resolved against the conf directory; their files checked, each problem naming file and key; the passphrase
never shown."""

from __future__ import annotations

import pickle

import pytest

from herald.config import ConfigError, load_config
from herald.config.tls import Tls
from herald.delivery.flow import FlowSettings
from herald.delivery.tls import TlsSettings
from herald.engine.round.planner import lane_plan
from herald.engine.round.state import SubscriptionState
from tests.support.config_files import SETTINGS, SUBSCRIPTION, problems_of, write_conf
from tests.support.tls_certs import TestPki

PASSPHRASE = "swordfish-passphrase"
HERALD = "conf/herald.yaml"
BILLING = "conf/subscriptions/billing.yaml"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"), key_password=PASSPHRASE)


def conf_with(tmp_path, pki: TestPki, settings_tls: str = "", subscription_tls: str = "", plain_key: bool = False):
    """A conf directory with the test PKI's files in conf/certs (plain-key.pem: another, unencrypted key)."""
    conf = write_conf(tmp_path, settings=SETTINGS + (f"delivery:\n  tls: {settings_tls}\n" if settings_tls else ""),
                      subscriptions={"billing": SUBSCRIPTION + (f"tls: {subscription_tls}\n"
                                                                  if subscription_tls else "")})
    (conf / "certs").mkdir()
    for path in pki.directory.glob("*.pem"):
        (conf / "certs" / path.name).write_bytes(path.read_bytes())
    if plain_key:
        (conf / "certs" / "plain-key.pem").write_bytes(pki.server_key.read_bytes())
    return conf


def test_no_tls_settings_by_default(tmp_path, pki):
    config = load_config(conf_with(tmp_path, pki))
    assert config.settings.delivery.tls is None and config.subscriptions[0].tls is None
    assert lane_plan(SubscriptionState(config.subscriptions[0]), FlowSettings(), 0).tls is None


def test_herald_yaml_settings_apply_to_every_subscription_with_paths_from_the_conf_directory(tmp_path, pki,
                                                                                               monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    conf = conf_with(tmp_path, pki, "{caBundle: certs/ca.pem, clientCert: certs/client.pem, "
                                    "clientKey: certs/client-key.pem, clientKeyPassword: '${env:KEY_PASSWORD}'}")
    config = load_config(conf)
    assert config.settings.delivery.tls.caBundle == "certs/ca.pem"  # herald.yaml's, as written
    plan = lane_plan(SubscriptionState(config.subscriptions[0]), FlowSettings(), 0)
    assert plan.tls == TlsSettings(ca_bundle=str(conf / "certs/ca.pem"), client_cert=str(conf / "certs/client.pem"),
                                   client_key=str(conf / "certs/client-key.pem"), client_key_password=PASSPHRASE)
    assert pickle.loads(pickle.dumps(plan)).tls == plan.tls  # it travels to the tasks


def test_a_subscriptions_settings_override_herald_yamls_key_by_key(tmp_path, pki, monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    conf = conf_with(tmp_path, pki, "{caBundle: certs/ca.pem, clientCert: certs/client.pem, "
                                    "clientKey: certs/client-key.pem, clientKeyPassword: '${env:KEY_PASSWORD}'}",
                     "{caBundle: certs/other-ca.pem}")
    tls = load_config(conf).subscriptions[0].tls
    assert (tls.caBundle, tls.clientCert, tls.clientKey) == (str(conf / "certs/other-ca.pem"),
                                                             str(conf / "certs/client.pem"),
                                                             str(conf / "certs/client-key.pem"))
    assert tls.clientKeyPassword.get_secret_value() == PASSPHRASE


def test_a_subscriptions_client_certificate_comes_with_its_own_key_and_no_passphrase_of_herald_yamls(tmp_path, pki,
                                                                                                      monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    conf = conf_with(tmp_path, pki, "{caBundle: certs/ca.pem, clientCert: certs/client.pem, "
                                    "clientKey: certs/client-key.pem, clientKeyPassword: '${env:KEY_PASSWORD}'}",
                     "{clientCert: certs/server.pem, clientKey: certs/plain-key.pem}", plain_key=True)
    settings = load_config(conf).subscriptions[0].tls.settings()
    assert settings == TlsSettings(str(conf / "certs/ca.pem"), str(conf / "certs/server.pem"),
                                   str(conf / "certs/plain-key.pem"), None)


def test_absolute_paths_stay_as_they_are(tmp_path, pki):
    conf = conf_with(tmp_path, pki, subscription_tls=f"{{caBundle: {pki.ca}}}")
    assert load_config(conf).subscriptions[0].tls.caBundle == str(pki.ca)


def test_unreadable_files_are_named_by_file_and_key(tmp_path, pki):
    conf = conf_with(tmp_path, pki, "{caBundle: certs/missing-ca.pem}",
                     "{caBundle: certs/ca.pem, clientCert: certs/nope.pem, clientKey: certs/client-key.pem}")
    assert set(problems_of(conf)) == {
        f"{HERALD}: delivery.tls.caBundle: cannot read certs/missing-ca.pem: No such file or directory",
        f"{BILLING}: tls.clientCert: cannot read certs/nope.pem: No such file or directory"}


def test_files_that_are_not_what_they_should_be(tmp_path, pki, monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    conf = conf_with(tmp_path, pki, "{caBundle: certs/server-key.pem}",
                     "{clientCert: certs/client.pem, clientKey: certs/plain-key.pem}", plain_key=True)
    assert set(problems_of(conf)) == {
        f"{HERALD}: delivery.tls.caBundle: certs/server-key.pem is not a PEM CA bundle: no certificate or crl found",
        f"{BILLING}: tls.clientKey: is not the key of clientCert certs/client.pem (key values mismatch)"}


@pytest.mark.parametrize("password, expected", [
    (None, "tls.clientKeyPassword: required: the client key is encrypted"),
    ("'${env:KEY_PASSWORD}-wrong'", "tls.clientKeyPassword: does not decrypt the client key"),
])
def test_an_encrypted_key_needs_its_passphrase(tmp_path, pki, monkeypatch, capfd, password, expected):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    given = f", clientKeyPassword: {password}" if password else ""
    conf = conf_with(tmp_path, pki, subscription_tls=f"{{clientCert: certs/client.pem, clientKey: "
                                                     f"certs/client-key.pem{given}}}")
    problems = problems_of(conf)
    assert problems == [f"{BILLING}: {expected}"]
    assert PASSPHRASE not in "".join(problems) + "".join(capfd.readouterr())  # and nothing asked on a terminal


def test_a_key_needs_a_certificate_and_unknown_keys_are_refused(tmp_path, pki):
    conf = conf_with(tmp_path, pki, "{caBundle: certs/ca.pem, verify: false}",
                     "{clientKey: certs/client-key.pem, clientKeyPassword: x}")
    assert set(problems_of(conf)) == {
        f"{HERALD}: delivery.tls.verify: unknown key",
        f"{BILLING}: tls: clientKey and clientKeyPassword need clientCert (the client certificate)"}


def test_the_passphrase_is_never_shown(tmp_path, pki, monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    conf = conf_with(tmp_path, pki, "{caBundle: certs/ca.pem, clientCert: certs/client.pem, "
                                    "clientKey: certs/client-key.pem, clientKeyPassword: '${env:KEY_PASSWORD}'}")
    config = load_config(conf)
    subscription = config.subscriptions[0]
    plan = lane_plan(SubscriptionState(subscription), FlowSettings(), 0)
    shown = [repr(config.settings), str(config.settings), repr(subscription.tls), str(subscription.tls),
             subscription.model_dump_json(), repr(plan), str(plan), repr(plan.tls), str(plan.tls)]
    for text in shown:
        assert PASSPHRASE not in text
    assert repr(plan.tls).endswith("client_key_password='******')")
    with pytest.raises(ConfigError) as caught:  # a limit broken next to it: the error shows no passphrase either
        load_config(conf_with(tmp_path / "other", pki, f"{{clientCert: certs/client.pem, clientKeyPassword: "
                                                        f"{PASSPHRASE}, caBundle: 7}}"))
    assert PASSPHRASE not in str(caught.value)


def test_merging_is_a_model_operation_too():
    default = Tls(caBundle="a.pem", clientCert="c.pem", clientKey="k.pem", clientKeyPassword="p")
    assert Tls().over(default) == default
    assert Tls(caBundle="b.pem").over(default) == default.model_copy(update={"caBundle": "b.pem"})
    assert Tls(clientCert="d.pem").over(default) == Tls(caBundle="a.pem", clientCert="d.pem")
    assert Tls(clientCert="d.pem").over(None) == Tls(clientCert="d.pem")


def conf_with_provider(tmp_path, pki: TestPki, provider_tls: str = "", settings_tls: str = ""):
    """conf_with, plus an OAuth provider `auth` (with `provider_tls` as its tls) that billing uses."""
    provider = ("oauthProviders:\n  - {name: auth, tokenEndpoint: 'https://127.0.0.1:9/token', clientId: herald, "
                "clientSecret: '${env:CLIENT_SECRET}'" + (f", tls: {provider_tls}" if provider_tls else "") + "}\n")
    conf = conf_with(tmp_path, pki, settings_tls)
    (conf / "herald.yaml").write_text((conf / "herald.yaml").read_text() + provider)
    billing = conf / "subscriptions" / "billing.yaml"
    billing.write_text(billing.read_text() + "oAuthPolicy: {grantType: clientCredentials, providerName: auth}\n")
    return conf


def token_tls(conf) -> TlsSettings | None:
    config = load_config(conf)
    return lane_plan(SubscriptionState(config.subscriptions[0]), FlowSettings(), 0,
                     providers={p.name: p for p in config.settings.oauthProviders}).oauth.tls


def test_token_requests_use_herald_yamls_tls_or_the_providers_own_over_it(tmp_path, pki, monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    monkeypatch.setenv("CLIENT_SECRET", "client-s3cret")
    assert token_tls(conf_with_provider(tmp_path / "none", pki)) is None, "certifi's CAs, no client certificate"
    everything = ("{caBundle: certs/ca.pem, clientCert: certs/client.pem, clientKey: certs/client-key.pem, "
                  "clientKeyPassword: '${env:KEY_PASSWORD}'}")
    conf = conf_with_provider(tmp_path / "inherits", pki, settings_tls=everything)
    assert token_tls(conf) == TlsSettings(str(conf / "certs/ca.pem"), str(conf / "certs/client.pem"),
                                          str(conf / "certs/client-key.pem"), PASSPHRASE)
    conf = conf_with_provider(tmp_path / "own", pki, "{caBundle: certs/other-ca.pem}", settings_tls=everything)
    assert token_tls(conf) == TlsSettings(str(conf / "certs/other-ca.pem"), str(conf / "certs/client.pem"),
                                          str(conf / "certs/client-key.pem"), PASSPHRASE), "key by key"
    conf = conf_with_provider(tmp_path / "alone", pki, everything)
    assert token_tls(conf) == TlsSettings(str(conf / "certs/ca.pem"), str(conf / "certs/client.pem"),
                                          str(conf / "certs/client-key.pem"), PASSPHRASE)
    assert load_config(conf).subscriptions[0].tls is None, "a provider's tls is not the subscribers'"


def test_a_providers_tls_problems_name_herald_yaml_and_the_providers_key(tmp_path, pki, monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    monkeypatch.setenv("CLIENT_SECRET", "client-s3cret")
    conf = conf_with_provider(tmp_path / "files", pki, "{caBundle: certs/missing-ca.pem}")
    assert problems_of(conf) == [
        f"{HERALD}: oauthProviders[0].tls.caBundle: cannot read certs/missing-ca.pem: No such file or directory"]
    conf = conf_with_provider(tmp_path / "key", pki, "{clientCert: certs/client.pem, clientKey: certs/client-key.pem, "
                                                     "clientKeyPassword: '${env:KEY_PASSWORD}-wrong'}")
    assert problems_of(conf) == [f"{HERALD}: oauthProviders[0].tls.clientKeyPassword: does not decrypt the client key"]
    conf = conf_with_provider(tmp_path / "unknown", pki, "{caBundle: certs/ca.pem, verify: false}")
    assert problems_of(conf) == [f"{HERALD}: oauthProviders[0].tls.verify: unknown key"]
    conf = conf_with_provider(tmp_path / "alone", pki, "{clientKey: certs/client-key.pem}")
    assert problems_of(conf) == [
        f"{HERALD}: oauthProviders[0].tls: clientKey and clientKeyPassword need clientCert (the client certificate)"]


def test_a_providers_passphrase_is_never_shown(tmp_path, pki, monkeypatch, capsys):
    import json

    from herald.cli import main

    monkeypatch.setenv("KEY_PASSWORD", PASSPHRASE)
    monkeypatch.setenv("CLIENT_SECRET", "client-s3cret")
    everything = ("{caBundle: certs/ca.pem, clientCert: certs/client.pem, clientKey: certs/client-key.pem, "
                  "clientKeyPassword: '${env:KEY_PASSWORD}'}")
    conf = conf_with_provider(tmp_path, pki, everything)
    config = load_config(conf)
    (provider,) = config.settings.oauthProviders
    source = lane_plan(SubscriptionState(config.subscriptions[0]), FlowSettings(), 0,
                       providers={"auth": provider}).oauth
    assert source.tls.client_key_password == PASSPHRASE
    assert pickle.loads(pickle.dumps(source)) == source  # it travels to the tasks
    assert main(["oauth", "providers", "--conf", str(conf), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["tls"] == {"caBundle": str(conf / "certs/ca.pem"), "clientCert": str(conf / "certs/client.pem"),
                             "clientKey": str(conf / "certs/client-key.pem"), "clientKeyPassword": "******"}
    assert main(["oauth", "providers", "--conf", str(conf)]) == 0
    shown = [capsys.readouterr().out, repr(source), str(source), repr(provider), repr(config.settings),
             provider.model_dump_json()]
    for text in shown:
        assert PASSPHRASE not in text and "client-s3cret" not in text
