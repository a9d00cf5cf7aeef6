"""Test certificates made at test time with `cryptography`: a CA, a server certificate for 127.0.0.1 and
localhost (subjectAltName) and a client certificate, written as PEM files; and the server-side SSLContexts of the
test subscribers (tests/support/subscriber.py).

    pki = TestPki.create(tmp_path, key_password="pass phrase")
    pki.ca            # the test CA's certificate (what a client's caBundle names)
    pki.server_context(require_client_cert=True)
    pki.client_cert, pki.client_key   # the key encrypted with key_password (None: plain)
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Herald tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _certificate(subject: str, key, issuer: x509.Certificate | None, issuer_key, *, ca: bool,
                 usage: x509.ObjectIdentifier | None = None, hosts: tuple[str, ...] = ()) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject))
               .issuer_name(issuer.subject if issuer is not None else _name(subject))
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    else:
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                        critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if hosts:
        names = [x509.IPAddress(ipaddress.ip_address(host)) if host[0].isdigit() else x509.DNSName(host)
                 for host in hosts]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key, password: str | None) -> bytes:
    encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                  else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


@dataclass(frozen=True)
class TestPki:
    """PEM files in `directory`: ca.pem (the CA), server.pem / server-key.pem (127.0.0.1 and localhost, signed
    by the CA), elsewhere.pem / elsewhere-key.pem (signed by the CA, for elsewhere.invalid only), client.pem /
    client-key.pem (signed by the CA; the key encrypted with `key_password` when one is given), and
    other-ca.pem (a second CA that signed nothing here)."""

    __test__ = False  # not a test class, whatever its name

    directory: Path
    key_password: str | None = None

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def other_ca(self) -> Path:
        return self.directory / "other-ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server-key.pem"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client-key.pem"

    @classmethod
    def create(cls, directory: Path, key_password: str | None = None) -> TestPki:
        directory.mkdir(parents=True, exist_ok=True)
        pki = cls(directory, key_password)
        ca_key, other_key = _key(), _key()
        ca = _certificate("Herald test CA", ca_key, None, ca_key, ca=True)
        other = _certificate("Another test CA", other_key, None, other_key, ca=True)
        server_key, client_key = _key(), _key()
        server = _certificate("localhost", server_key, ca, ca_key, ca=False, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                              hosts=("127.0.0.1", "localhost"))
        elsewhere = _certificate("elsewhere.invalid", server_key, ca, ca_key, ca=False,
                                 usage=ExtendedKeyUsageOID.SERVER_AUTH, hosts=("elsewhere.invalid",))
        client = _certificate("herald-client", client_key, ca, ca_key, ca=False,
                              usage=ExtendedKeyUsageOID.CLIENT_AUTH)
        pki.ca.write_bytes(_pem(ca))
        pki.other_ca.write_bytes(_pem(other))
        pki.server_cert.write_bytes(_pem(server))
        pki.server_key.write_bytes(_key_pem(server_key, None))
        (directory / "elsewhere.pem").write_bytes(_pem(elsewhere))
        pki.client_cert.write_bytes(_pem(client))
        pki.client_key.write_bytes(_key_pem(client_key, key_password))
        return pki

    def server_context(self, require_client_cert: bool = False, wrong_host: bool = False) -> ssl.SSLContext:
        """A server's context with the server certificate (`wrong_host`: one for elsewhere.invalid only); with
        `require_client_cert`, a client must show a certificate the test CA signed (mutual TLS)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.directory / "elsewhere.pem" if wrong_host else self.server_cert, self.server_key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca)
        return context
