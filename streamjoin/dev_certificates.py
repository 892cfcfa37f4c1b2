"""Certificates for local TLS: a throw-away CA and the leaf certificates it signs for
loopback, written as PEM files (the secured local broker, the web server's TLS tests).

Needs ``cryptography`` (the ``test`` extra); nothing here is meant for production keys.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LOOPBACK_HOSTS", "CertificateAuthority", "Leaf"]

LOOPBACK_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost")
_PEM = serialization.Encoding.PEM


@dataclass(frozen=True)
class Leaf:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)


class CertificateAuthority:
    """A self-signed CA (its certificate written to ``directory/<name>.pem``) that issues
    leaf certificates into ``directory``."""

    def __init__(self, directory: Path, name: str = "streamjoin test CA", days: int = 30) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._days = days
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        valid_from, valid_to = _validity(days)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from)
            .not_valid_after(valid_to)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / f"{_file_name(name)}.pem"
        self.cert.write_bytes(self.certificate.public_bytes(_PEM))

    def issue(
        self,
        name: str,
        *,
        hosts: Sequence[str] = LOOPBACK_HOSTS,
        password: str | None = None,
        client: bool = True,
    ) -> Leaf:
        """A leaf certificate for ``hosts`` (IP addresses and DNS names) usable by servers
        (and by clients unless ``client=False``); its key (PKCS#8, mode 0600) is encrypted
        with ``password`` when one is given."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        valid_from, valid_to = _validity(self._days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from)
            .not_valid_after(valid_to)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
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
        leaf.cert.write_bytes(cert.public_bytes(_PEM))
        leaf.key.touch(mode=0o600)
        leaf.key.write_bytes(key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, encryption))
        return leaf
