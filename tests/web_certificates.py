"""Certificates for the web server's TLS tests: a CA, and leaf certificates it signs for
127.0.0.1 / localhost (server and client use), written as PEM files.

Built with ``cryptography`` (the ``test`` extra). ``web_certs`` is a session fixture: the
test modules import it (``from tests.web_certificates import web_certs``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "Leaf", "WebCerts", "web_certs"]


@dataclass(frozen=True)
class Leaf:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


class CertificateAuthority:
    """A self-signed CA that issues leaf certificates into ``directory``."""

    def __init__(self, directory: Path, name: str = "streamjoin test CA") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._name = subject
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / f"{_file_name(name)}.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        *,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        password: str | None = None,
    ) -> Leaf:
        """A leaf certificate for ``hosts`` (usable by servers and clients); its key is
        encrypted with ``password`` when one is given."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        encryption: serialization.KeySerializationEncryption = (
            serialization.NoEncryption()
            if password is None
            else serialization.BestAvailableEncryption(password.encode())
        )
        leaf = Leaf(
            self.directory / f"{_file_name(name)}.crt", self.directory / f"{_file_name(name)}.key"
        )
        leaf.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        leaf.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
            )
        )
        return leaf


@dataclass(frozen=True)
class WebCerts:
    """What the TLS tests use: the app's CA, a server certificate, a client certificate,
    and a second CA that signed none of them (the wrong CA to trust)."""

    ca: CertificateAuthority
    server: Leaf
    client: Leaf
    other_ca: CertificateAuthority


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


@pytest.fixture(scope="session")
def web_certs(tmp_path_factory: pytest.TempPathFactory) -> WebCerts:
    directory = tmp_path_factory.mktemp("web-tls")
    ca = CertificateAuthority(directory)
    return WebCerts(
        ca=ca,
        server=ca.issue("worker"),
        client=ca.issue("query client"),
        other_ca=CertificateAuthority(directory, "another CA"),
    )
