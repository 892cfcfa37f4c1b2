"""A local broker secured as production clusters are: TLS, SCRAM-SHA-512 logins and ACLs.

For tests, demos and trying an app's least-privilege ACLs before a real cluster sees
them. The CLIENT listener speaks SASL_SSL with SCRAM-SHA-512 only; the broker runs
Kafka's ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``, so a
client may do exactly what an ACL allows. Users are created when the storage is
formatted (``kafka-storage format --add-scram``), and ACLs through the INTERNAL
listener (PLAINTEXT on loopback, whose ANONYMOUS principal is the super user that sets
the broker up; never give a client that address).

The certificates (a CA, and a server certificate for 127.0.0.1 and localhost that it
signs) are made here with ``cryptography`` (the ``test`` extra) and written as PEM, so
the broker needs no Java keystore. The pure parts (certificate making, the broker's
settings, the format arguments) are functions; :class:`SecureLocalKafka` is the shell.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamjoin.acls import Acl
from streamjoin.errors import ConfigurationError, KafkaProvisioningError
from streamjoin.local_kafka import LOOPBACK, LocalKafka, StartedByHand

__all__ = [
    "SCRAM_MECHANISM",
    "ScramUser",
    "SecureLocalKafka",
    "TlsFiles",
    "client_options_for",
    "make_certificates",
    "scram_format_args",
    "secure_broker_overrides",
]

SCRAM_MECHANISM = "SCRAM-SHA-512"
#: the INTERNAL and CONTROLLER listeners are PLAINTEXT: their principal is ANONYMOUS
SETUP_PRINCIPAL = "User:ANONYMOUS"
_USER_NAME_FORBIDDEN = set(",=[]'\" ")


@dataclass(frozen=True)
class ScramUser:
    """A SCRAM login; the password never shows in a repr."""

    name: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.name or _USER_NAME_FORBIDDEN & set(self.name):
            raise ConfigurationError(
                f"SCRAM user name {self.name!r} must be non-empty, without spaces, quotes, "
                "',', '=', '[' or ']'"
            )
        if not self.password or _USER_NAME_FORBIDDEN & set(self.password):
            raise ConfigurationError(
                f"the password of SCRAM user {self.name!r} must be non-empty, without spaces, "
                "quotes, ',', '=', '[' or ']' (kafka-storage's --add-scram syntax)"
            )

    @property
    def principal(self) -> str:
        """The principal Kafka's ACLs name this user by."""
        return f"User:{self.name}"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA clients trust, and the broker's key with its certificate chain."""

    ca_file: Path
    server_keystore: Path


def make_certificates(directory: Path, hosts: Sequence[str] = (LOOPBACK, "localhost")) -> TlsFiles:
    """A new CA and a server certificate it signs for ``hosts`` (IP addresses and DNS names),
    written as PEM into ``directory``: ``ca.pem`` (the trust anchor) and ``server.pem`` (the
    broker's unencrypted PKCS#8 key followed by its certificate and the CA's)."""
    from streamjoin.dev_certificates import CertificateAuthority

    authority = CertificateAuthority(directory, "streamjoin local test CA")
    leaf = authority.issue("broker", hosts=hosts, client=False)
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(authority.cert.read_bytes())
    keystore = directory / "server.pem"
    keystore.touch(mode=0o600)
    keystore.write_bytes(leaf.key.read_bytes() + leaf.cert.read_bytes() + ca_file.read_bytes())
    return TlsFiles(ca_file=ca_file, server_keystore=keystore)


def secure_broker_overrides(tls: TlsFiles) -> dict[str, str]:
    """Broker settings for SASL_SSL + SCRAM-SHA-512 on the CLIENT listener and ACLs enforced
    (the CLIENT listener's protocol itself is :class:`LocalKafka`'s ``client_protocol``)."""
    return {
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "listener.name.client.sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "listener.name.client.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.client.ssl.keystore.type": "PEM",
        "listener.name.client.ssl.keystore.location": str(tls.server_keystore),
        "listener.name.client.ssl.client.auth": "none",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": SETUP_PRINCIPAL,
    }


def scram_format_args(users: Iterable[ScramUser]) -> list[str]:
    """``kafka-storage format`` arguments creating ``users`` as SCRAM-SHA-512 credentials."""
    args: list[str] = []
    for user in users:
        args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user.name},password={user.password}]"]
    return args


def client_options_for(user: ScramUser, ca_file: Path) -> dict[str, Any]:
    """streamjoin's ``client_options`` that log in as ``user`` and trust ``ca_file``."""
    return {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": SCRAM_MECHANISM,
        "sasl_plain_username": user.name,
        "sasl_plain_password": user.password,
        "ssl_cafile": str(ca_file),
    }


_RESOURCE_TYPES = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
_PATTERN_TYPES = {"LITERAL": 3, "PREFIXED": 4}
_OPERATIONS = {
    "ALL": 2,
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10,
    "ALTER_CONFIGS": 11,
    "IDEMPOTENT_WRITE": 12,
}
_ALLOW = 3


class SecureLocalKafka(StartedByHand):
    """A :class:`LocalKafka` with a SASL_SSL (SCRAM-SHA-512) CLIENT listener and ACLs enforced.

    ``users`` are the logins it knows. ``client_options(user)`` are what an App (or the
    CLI, see docs/security.md) passes to log in; :meth:`grant` adds ACLs. Other keywords go
    to :class:`LocalKafka` (``heap``, ``progress``...).
    """

    def __init__(self, users: Sequence[ScramUser], **local_kafka: Any) -> None:
        if not users:
            raise ConfigurationError("a secured broker needs at least one SCRAM user")
        self.users = {u.name: u for u in users}
        self._local_kafka = local_kafka
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.tls: TlsFiles | None = None
        self.kafka: LocalKafka | None = None

    @property
    def bootstrap_servers(self) -> str:
        """The SASL_SSL listener (what clients use)."""
        return self._started().bootstrap_servers

    @property
    def internal_bootstrap_servers(self) -> str:
        """The PLAINTEXT super-user listener (set-up only)."""
        return self._started().internal_bootstrap_servers

    @property
    def ca_file(self) -> Path:
        if self.tls is None:
            raise KafkaProvisioningError("the secured broker is not started")
        return self.tls.ca_file

    def client_options(self, user: str) -> dict[str, Any]:
        """``client_options`` logging in as the user named ``user``."""
        return client_options_for(self.users[user], self.ca_file)

    def start(self) -> SecureLocalKafka:
        self._tmpdir = tempfile.TemporaryDirectory(prefix="streamjoin-tls-")
        self.tls = make_certificates(Path(self._tmpdir.name))
        overrides = {**secure_broker_overrides(self.tls), **self._local_kafka.pop("overrides", {})}
        self.kafka = LocalKafka(
            client_protocol="SASL_SSL",
            overrides=overrides,
            format_args=scram_format_args(self.users.values()),
            **self._local_kafka,
        )
        try:
            self.kafka.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        kafka, self.kafka = self.kafka, None
        try:
            if kafka is not None:
                kafka.stop()
        finally:
            if self._tmpdir is not None:
                self._tmpdir.cleanup()
                self._tmpdir = None

    async def grant(self, acls: Iterable[Acl]) -> None:
        """Create ``acls`` (ALLOW, any host) through the super-user listener."""
        await _create_acls(self.internal_bootstrap_servers, acls)

    def _started(self) -> LocalKafka:
        if self.kafka is None:
            raise KafkaProvisioningError("the secured broker is not started; call start()")
        return self.kafka


async def _create_acls(bootstrap: str, acls: Iterable[Acl]) -> None:
    """CreateAcls, one binding a request (aiokafka's request takes one), errors named."""
    from aiokafka import AIOKafkaClient
    from aiokafka.errors import for_code
    from aiokafka.protocol.admin import CreateAclsRequest

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        node = client.get_random_node()
        for acl in acls:
            response = await client.send(
                node,
                CreateAclsRequest(
                    _RESOURCE_TYPES[acl.resource_type],
                    acl.name,
                    _PATTERN_TYPES[acl.pattern],
                    acl.principal,
                    "*",
                    _OPERATIONS[acl.operation],
                    _ALLOW,
                ),
            )
            for code, message in response.creation_responses:
                if code != 0:
                    raise KafkaProvisioningError(
                        f"creating ACL {acl.describe()} failed: {for_code(code).__name__} "
                        f"{message or ''}".rstrip()
                    )
    finally:
        await client.close()
