"""Certificates for the web server's TLS tests: a CA, and leaf certificates it signs for
127.0.0.1 / localhost (server and client use), written as PEM files.

Built with ``cryptography`` (the ``test`` extra). ``web_certs`` is a session fixture: the
test modules import it (``from tests.web_certificates import web_certs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from streamjoin.dev_certificates import CertificateAuthority, Leaf

__all__ = ["CertificateAuthority", "Leaf", "WebCerts", "web_certs"]


@dataclass(frozen=True)
class WebCerts:
    """What the TLS tests use: the app's CA, a server certificate, a client certificate,
    and a second CA that signed none of them (the wrong CA to trust)."""

    ca: CertificateAuthority
    server: Leaf
    client: Leaf
    other_ca: CertificateAuthority


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
