"""TLS settings of a subscription's HTTPS attempts, as the tasks get them, and the text of a failed handshake.

Both transports verify the subscriber's certificate and its host name on every HTTPS attempt; `TlsSettings`
only says whom to trust and which client certificate to show (docs/design.md §4):

- ca_bundle: a PEM file of the CAs trusted instead of the default ones (certifi's bundle);
- client_cert / client_key: the client certificate (PEM) and its private key (PEM; None: the key is in
  client_cert's file), shown when the server asks for one (mutual TLS);
- client_key_password: the passphrase of an encrypted client_key. Never shown: repr masks it.

Paths are absolute (the configuration resolves them against the conf directory) and must be readable where the
tasks run. A plan with `tls=None` uses the defaults: certifi's CAs, no client certificate.

A failed handshake or verification is a retryable failure, like a refused connection; its reason starts with
"TLS: " and says what was wrong in the same words on both transports (`tls_detail`), e.g.
"TLS: certificate verify failed: unable to get local issuer certificate".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TlsSettings:
    """Whom an HTTPS attempt trusts and the client certificate it shows; paths absolute (see the module)."""

    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    client_key_password: str | None = field(default=None, repr=False)  # never shown

    def __repr__(self) -> str:
        shown = [f"{name}={value!r}" for name, value in (("ca_bundle", self.ca_bundle),
                                                         ("client_cert", self.client_cert),
                                                         ("client_key", self.client_key)) if value is not None]
        if self.client_key_password is not None:
            shown.append("client_key_password='******'")
        return f"TlsSettings({', '.join(shown)})"

    __str__ = __repr__


# Python's ssl says "[SSL: CERTIFICATE_VERIFY_FAILED] <reason> (_ssl.c:1006)"
_PYTHON_TAG = re.compile(r"^\[[A-Z0-9_]+(?:: [A-Z0-9_]+)?\]\s*")
_PYTHON_PLACE = re.compile(r"\s*\(_ssl\.c:\d+\)$")
# libcurl says "SSL certificate OpenSSL verify result: <reason> (20)" (8.x) or "SSL certificate problem: <reason>"
_CURL_VERIFY = re.compile(r"^SSL certificate (?:problem|OpenSSL verify result): (.*?)(?: \(\d+\))?$")
# another host's certificate: libcurl's words, then Python's
_HOST_MISMATCH = re.compile(
    r"^(?:SSL: )?no alternative certificate subject name matches target [A-Za-z0-9 ]+ '([^']*)'$"
    r"|^certificate verify failed: (?:Hostname|IP address) mismatch, certificate is not valid for '([^']*)'\.?$")
# libcurl quotes OpenSSL's error string: "OpenSSL SSL_read: ...: error:0A00045C:SSL routines::<reason>, errno 0"
_OPENSSL_REASON = re.compile(r"error:[0-9A-Fa-f]+:SSL routines:[^:]*:([^,]+)")


def tls_detail(text: str) -> str:
    """A TLS error as a reason says it, whichever client reported it, so that both transports say the same:
    Python's tag and source place dropped, libcurl's verification result and OpenSSL error string reduced to
    OpenSSL's reason. A certificate that does not verify reads "certificate verify failed: <OpenSSL's
    reason>" ("... certificate is not valid for '<host>'" when it is another host's); a server's alert
    "<alert>" (e.g. "tlsv13 alert certificate required")."""
    text = text.strip()
    if text == "[SSL] PEM lib" or text.startswith("[SSL] PEM lib "):
        return "cannot load the client certificate or its key (a wrong passphrase?)"
    text = _PYTHON_PLACE.sub("", _PYTHON_TAG.sub("", text))
    host = _HOST_MISMATCH.match(text)
    if host:
        return f"certificate verify failed: certificate is not valid for '{host.group(1) or host.group(2)}'"
    verify = _CURL_VERIFY.match(text)
    if verify:
        return f"certificate verify failed: {verify.group(1)}"
    reason = _OPENSSL_REASON.search(text)
    if reason:
        return reason.group(1).strip()
    return text.removeprefix("SSL: ")
