"""How Kafka clients log in: TLS files made into an SSL context, credentials from the
environment, and the same settings in the JVM client's names for Spark.

``client_options`` take aiokafka's names (``security_protocol``, ``sasl_mechanism``,
``sasl_plain_username``, ``sasl_plain_password``...) plus file options aiokafka lacks:
``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile`` and ``ssl_password`` become one
``ssl_context`` where the clients are built (:func:`client_kwargs`). That context can be
pickled (it is rebuilt from the files), so Spark tasks get it too. Nothing here logs or
raises a credential's value.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamjoin.errors import ConfigurationError

__all__ = [
    "ENV_PREFIX",
    "FILE_OPTIONS",
    "client_kwargs",
    "client_options_from_env",
    "spark_kafka_options",
]

#: ``STREAMJOIN_CLIENT_SASL_PLAIN_PASSWORD=...`` sets the client option ``sasl_plain_password``;
#: ``STREAMJOIN_CLIENT_SASL_PLAIN_PASSWORD_FILE=/run/secrets/kafka`` reads it from a file
ENV_PREFIX = "STREAMJOIN_CLIENT_"
FILE_SUFFIX = "_FILE"
#: TLS options given as files, turned into an ``ssl_context``
FILE_OPTIONS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password")
_INT_OPTIONS = frozenset({"request_timeout_ms", "retry_backoff_ms", "metadata_max_age_ms"})
#: the client options the environment may set (a typo is an error, not an ignored variable)
ENV_OPTIONS = frozenset(
    {
        "security_protocol",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        *FILE_OPTIONS,
        *_INT_OPTIONS,
    }
)
_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class FileSSLContext(ssl.SSLContext):
    """A client SSL context built from files, which pickles as those files' names (Spark
    ships client options to its tasks; a plain SSLContext cannot be pickled)."""

    _files: tuple[str | None, str | None, str | None, str | None]

    def __reduce__(self) -> tuple[Any, ...]:
        return (ssl_context_from_files, self._files)


def ssl_context_from_files(
    cafile: str | None,
    certfile: str | None = None,
    keyfile: str | None = None,
    password: str | None = None,
) -> FileSSLContext:
    """A client context verifying the broker against ``cafile`` (the system's CAs when
    None), and presenting ``certfile``/``keyfile`` when the brokers want client certificates."""
    context = FileSSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context._files = (cafile, certfile, keyfile, password)
    try:
        if cafile is None:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            context.load_verify_locations(cafile=cafile)
        if certfile is not None:
            context.load_cert_chain(certfile, keyfile, password)
    except (OSError, ssl.SSLError) as exc:
        what = ", ".join(
            f"{n}={f}"
            for n, f in (
                ("ssl_cafile", cafile),
                ("ssl_certfile", certfile),
                ("ssl_keyfile", keyfile),
            )
            if f
        )
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigurationError(
            f"client TLS files could not be loaded ({what}): {reason}"
        ) from None
    return context


def client_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (secrets already revealed) as aiokafka's clients take them: the TLS file
    options replaced by one ``ssl_context``."""
    out = dict(options)
    files = {name: out.pop(name) for name in FILE_OPTIONS if name in out}
    if not files:
        return out
    if "ssl_context" in out:
        raise ConfigurationError(
            f"client_options: give either ssl_context or {', '.join(sorted(files))}, not both"
        )
    if "ssl_keyfile" in files and "ssl_certfile" not in files:
        raise ConfigurationError("client_options: ssl_keyfile needs ssl_certfile")
    out["ssl_context"] = ssl_context_from_files(
        _path(files.get("ssl_cafile")),
        _path(files.get("ssl_certfile")),
        _path(files.get("ssl_keyfile")),
        files.get("ssl_password"),
    )
    return out


def _path(value: Any) -> str | None:
    return None if value is None else os.fspath(value)


def client_options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Client options from ``STREAMJOIN_CLIENT_<OPTION>`` variables (``<OPTION>_FILE``: the
    value is the first line of that file), e.g. ``STREAMJOIN_CLIENT_SECURITY_PROTOCOL=SASL_SSL``.
    The CLI merges them over the app's own ``client_options``."""
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for variable, raw in sorted(environ.items()):
        if not variable.startswith(ENV_PREFIX) or variable == ENV_PREFIX:
            continue
        name = variable[len(ENV_PREFIX) :].lower()
        value: str = raw
        if name.endswith(FILE_SUFFIX.lower()) and name not in FILE_OPTIONS:
            name = name[: -len(FILE_SUFFIX)]
            try:
                value = Path(raw).read_text().splitlines()[0] if raw else ""
            except (OSError, IndexError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "it is empty"
                raise ConfigurationError(f"${variable}: cannot read {raw}: {reason}") from None
        if name not in ENV_OPTIONS:
            raise ConfigurationError(
                f"${variable} sets no known client option; the environment may set "
                + ", ".join(f"{ENV_PREFIX}{o.upper()}" for o in sorted(ENV_OPTIONS))
            )
        out[name] = int(value) if name in _INT_OPTIONS and value.isdigit() else value
    protocol = out.get("security_protocol")
    if protocol is not None:
        out["security_protocol"] = protocol = str(protocol).upper()
        if protocol not in _SECURITY_PROTOCOLS:
            raise ConfigurationError(
                f"${ENV_PREFIX}SECURITY_PROTOCOL={protocol!r}: expected one of "
                f"{', '.join(_SECURITY_PROTOCOLS)}"
            )
    return out


def spark_kafka_options(options: Mapping[str, Any]) -> dict[str, str]:
    """The same login for Spark's Kafka source (the JVM client's names, ``kafka.``-prefixed):
    security protocol, SASL PLAIN/SCRAM through ``sasl.jaas.config``, the CA as a PEM
    truststore. Options it cannot translate are left out (an ``ssl_context`` object: give
    ``ssl_cafile`` instead)."""
    out: dict[str, str] = {}
    protocol = options.get("security_protocol")
    if protocol is None:
        return out
    out["kafka.security.protocol"] = str(protocol)
    mechanism = options.get("sasl_mechanism")
    if mechanism is not None and str(protocol).startswith("SASL_"):
        out["kafka.sasl.mechanism"] = str(mechanism)
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        user = _jaas_quote(options.get("sasl_plain_username"))
        password = _jaas_quote(options.get("sasl_plain_password"))
        out["kafka.sasl.jaas.config"] = (
            f'{module} required username="{user}" password="{password}";'
        )
    cafile = options.get("ssl_cafile")
    if cafile is not None:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.location"] = os.fspath(cafile)
    return out


def _jaas_quote(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"')
