"""The `tls` settings of HTTPS delivery: herald.yaml's `delivery.tls` for every subscription, a subscription's
own `tls` over it, their files checked when the configuration is loaded.

    tls:
      caBundle: certs/subscribers-ca.pem      # trusted instead of the default CAs (certifi's)
      clientCert: certs/herald.pem            # shown when a subscriber asks for one (mutual TLS)
      clientKey: certs/herald-key.pem         # omitted: the key is in clientCert's file
      clientKeyPassword: ${env:HERALD_KEY_PASSWORD}   # an encrypted clientKey's passphrase; never shown

Paths are relative to the conf directory (or absolute) and must be readable where Spark's tasks run, as they
are read at each new connection. A subscription's `tls` overrides herald.yaml's key by key, except that the
client certificate goes with its key and passphrase: a subscription that names a clientCert takes none of
herald.yaml's clientKey and clientKeyPassword. The subscriber's certificate and host name are always verified.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator, model_validator

from herald.config.files import Problem
from herald.delivery.tls import TlsSettings, tls_detail

_PATHS = ("caBundle", "clientCert", "clientKey")


class Tls(BaseModel):
    """Whom HTTPS attempts trust (caBundle: a PEM file of CAs, trusted instead of certifi's) and the client
    certificate they show (clientCert, clientKey: PEM files; clientKeyPassword: the key's passphrase)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    caBundle: str | None = None
    clientCert: str | None = None
    clientKey: str | None = None
    clientKeyPassword: SecretStr | None = None

    @field_validator(*_PATHS)
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a file path (relative to the conf directory, or absolute)")
        return value

    @model_validator(mode="after")
    def _key_with_certificate(self) -> Tls:
        if self.clientCert is None and (self.clientKey is not None or self.clientKeyPassword is not None):
            raise ValueError("clientKey and clientKeyPassword need clientCert (the client certificate)")
        return self

    def over(self, default: Tls | None) -> Tls:
        """These settings over `default` (herald.yaml's): caBundle key by key; the client certificate, key and
        passphrase together (see the module)."""
        if default is None:
            return self
        client = self if self.clientCert is not None else default
        return Tls(caBundle=self.caBundle if self.caBundle is not None else default.caBundle,
                   clientCert=client.clientCert, clientKey=client.clientKey,
                   clientKeyPassword=client.clientKeyPassword)

    def resolved(self, conf_dir: Path) -> Tls:
        """The same settings with absolute paths (relative ones are relative to `conf_dir`)."""
        return self.model_copy(update={name: str((conf_dir / getattr(self, name)).resolve())
                                       for name in _PATHS if getattr(self, name) is not None})

    def shown(self) -> dict[str, str]:
        """The settings as a command shows them: the keys that are set, the passphrase as ******."""
        shown = self.model_dump(exclude_none=True, exclude={"clientKeyPassword"})
        return {**shown, "clientKeyPassword": "******"} if self.clientKeyPassword is not None else shown

    def settings(self) -> TlsSettings:
        """What the tasks get (paths as they are here: resolve them first)."""
        password = self.clientKeyPassword
        return TlsSettings(ca_bundle=self.caBundle, client_cert=self.clientCert, client_key=self.clientKey,
                           client_key_password=password.get_secret_value() if password is not None else None)


def effective_tls(own: Tls | None, default: Tls | None, conf_dir: Path) -> Tls | None:
    """The TLS settings a subscription delivers with: its own over herald.yaml's `default`, paths absolute."""
    chosen = own.over(default) if own is not None else default
    return chosen.resolved(conf_dir) if chosen is not None else None


def check_tls(tls: Tls | None, conf_dir: Path, file: str, key: str) -> list[Problem]:
    """Problems of `tls`'s files (read relative to `conf_dir`), named by `file` and `key` (`tls`,
    `delivery.tls`): unreadable, a caBundle with no certificate, a client certificate that does not load with its
    key and passphrase. The passphrase is never shown."""
    if tls is None:
        return []
    problems = []
    for name in _PATHS:
        value = getattr(tls, name)
        if value is not None:
            try:
                (conf_dir / value).read_bytes()
            except OSError as error:
                problems.append(Problem(file, f"{key}.{name}", f"cannot read {value}: {error.strerror}"))
    if problems:
        return problems
    if tls.caBundle is not None:
        try:
            ssl.create_default_context(cafile=str(conf_dir / tls.caBundle))
        except ssl.SSLError as error:
            problems.append(Problem(file, f"{key}.caBundle", f"{tls.caBundle} is not a PEM CA bundle: "
                                                             f"{tls_detail(str(error))}"))
    if tls.clientCert is not None:
        problem = _client_problem(tls, conf_dir)
        if problem is not None:
            problems.append(Problem(file, f"{key}.{problem[0]}", problem[1]))
    return problems


def _client_problem(tls: Tls, conf_dir: Path) -> tuple[str, str] | None:
    """(key, message) when the client certificate does not load with its key and passphrase."""
    asked: list[bool] = []
    given = tls.clientKeyPassword.get_secret_value() if tls.clientKeyPassword is not None else ""

    def password() -> str:  # a callback, so that OpenSSL never prompts on a terminal
        asked.append(True)
        return given

    key_file = str(conf_dir / tls.clientKey) if tls.clientKey is not None else None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(str(conf_dir / tls.clientCert), key_file, password)
    except ssl.SSLError as error:
        text = str(error)
        if "KEY_VALUES_MISMATCH" in text:
            return "clientKey", f"is not the key of clientCert {tls.clientCert} (key values mismatch)"
        if asked and tls.clientKeyPassword is None:
            return "clientKeyPassword", "required: the client key is encrypted"
        if asked:
            return "clientKeyPassword", "does not decrypt the client key"
        if tls.clientKey is None:
            return "clientKey", f"required: {tls.clientCert} holds no private key (or no certificate)"
        reason = "not a PEM certificate and private key" if "PEM lib" in text else tls_detail(text)
        return "clientKey", f"does not load with clientCert {tls.clientCert}: {reason}"
    return None
