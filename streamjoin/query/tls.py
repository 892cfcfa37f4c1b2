"""TLS of the workers' web servers, for both ends: SSL contexts built from PEM files.

The server side (:func:`server_context`) is what a worker serves ``/metrics``, the status
page and table queries with; the client side (:func:`client_context`) is what
``TableClient``, ``streamjoin table get --remote`` and a worker forwarding a read to
another one verify the server with. Both read their files once, when built, and turn
every failure into a :class:`~streamjoin.errors.ConfigurationError` naming the file and
what is wrong with it (missing, unreadable, not PEM, a key that does not match the
certificate, a wrong key password), so that a worker with bad files does not start
(exit code 3) instead of failing its first request.

Clients always verify the server's certificate and host name; ``insecure=True`` turns
both off, and says so in the log each time a context is built that way.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

from streamjoin.errors import ConfigurationError

__all__ = ["CLIENT_SETTINGS", "WORKER_SETTINGS", "PathLike", "client_context", "server_context"]

log = logging.getLogger("streamjoin.tls")

PathLike = str | os.PathLike[str]
#: what a client's settings are called in errors: CA, certificate, key, key password
CLIENT_SETTINGS = ("ca_file", "cert_file", "key_file", "key_password")
#: the same, as a worker's settings (the context it forwards reads with)
WORKER_SETTINGS = ("web_tls_ca", "web_tls_cert", "web_tls_key", "web_tls_key_password")


def server_context(
    cert_file: PathLike,
    key_file: PathLike,
    *,
    client_ca_file: PathLike | None = None,
    key_password: str | None = None,
) -> ssl.SSLContext:
    """A TLS server context: ``cert_file`` (the certificate, then its chain) and
    ``key_file`` (its private key); with ``client_ca_file``, clients must present a
    certificate that CA signed (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(
        context,
        cert_file,
        key_file,
        key_password,
        ("web_tls_cert", "web_tls_key", "web_tls_key_password"),
    )
    if client_ca_file is not None:
        _load_ca(context, client_ca_file, "web_tls_client_ca")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca_file: PathLike | None = None,
    *,
    cert_file: PathLike | None = None,
    key_file: PathLike | None = None,
    key_password: str | None = None,
    insecure: bool = False,
    setting_names: tuple[str, str, str, str] = CLIENT_SETTINGS,
) -> ssl.SSLContext:
    """A TLS client context that verifies the server against ``ca_file`` (None: the
    system's trusted CAs); with ``cert_file``/``key_file``, it presents that certificate
    to servers asking for one (mutual TLS). ``insecure=True`` verifies nothing (loudly).
    ``setting_names`` are what errors call the CA, certificate, key and password."""
    ca_setting, *chain_settings = setting_names
    if (cert_file is None) != (key_file is None):
        raise ConfigurationError(
            f"a client certificate needs both {chain_settings[0]} and {chain_settings[1]}"
        )
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        _load_ca(context, ca_file, ca_setting)
    if cert_file is not None and key_file is not None:
        cert_setting, key_setting, password_setting = chain_settings
        _load_chain(
            context,
            cert_file,
            key_file,
            key_password,
            (cert_setting, key_setting, password_setting),
        )
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        log.warning(
            "TLS certificates are NOT verified (insecure): anyone between here and the "
            "server can read and change what is exchanged, the query token included"
        )
    return context


def _load_chain(
    context: ssl.SSLContext,
    cert_file: PathLike,
    key_file: PathLike,
    password: str | None,
    settings: tuple[str, str, str],
) -> None:
    """Load ``cert_file`` and ``key_file``; ``settings`` name the certificate, the key and
    the key password in errors."""
    cert_setting, key_setting, password_setting = settings
    cert, key = _readable(cert_file, cert_setting), _readable(key_file, key_setting)
    if b"-----BEGIN CERTIFICATE-----" not in Path(cert).read_bytes():
        raise ConfigurationError(
            f"{cert_setting} {cert!r} is not a PEM certificate (no BEGIN CERTIFICATE line)"
        )
    key_text = Path(key).read_bytes()
    if b"PRIVATE KEY-----" not in key_text:
        raise ConfigurationError(
            f"{key_setting} {key!r} is not a PEM private key (no BEGIN ... PRIVATE KEY line)"
        )
    encrypted = b"ENCRYPTED" in key_text
    if encrypted and password is None:
        raise ConfigurationError(
            f"{key_setting} {key!r} is encrypted: give its password too ({password_setting})"
        )
    try:
        # a callable, so that OpenSSL never prompts on the terminal for a password
        context.load_cert_chain(cert, key, password=lambda: password or "")
    except ssl.SSLError as exc:
        reason = (exc.reason or "").upper()
        if "KEY_VALUES_MISMATCH" in reason:
            problem = "the private key does not belong to the certificate"
        elif encrypted:
            problem = "the key password does not decrypt the private key"
        else:
            problem = f"cannot be loaded as a certificate and its key ({exc.reason or exc})"
        raise ConfigurationError(
            f"{cert_setting} {cert!r} with {key_setting} {key!r}: {problem}"
        ) from None


def _load_ca(context: ssl.SSLContext, ca_file: PathLike, setting: str) -> None:
    path = _readable(ca_file, setting)
    try:
        context.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConfigurationError(
            f"{setting} {path!r} is not a PEM file of CA certificates ({reason})"
        ) from None


def _readable(path: PathLike, setting: str) -> str:
    """``path`` as a string, once it is known to be a readable file (else a clear error)."""
    file = Path(path)
    if not file.exists():
        raise ConfigurationError(f"{setting} {str(file)!r}: no such file")
    if not file.is_file():
        raise ConfigurationError(f"{setting} {str(file)!r} is not a file")
    try:
        with file.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise ConfigurationError(
            f"{setting} {str(file)!r} cannot be read: {exc.strerror or exc}"
        ) from None
    return str(file)
