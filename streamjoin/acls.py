"""The Kafka ACLs an app needs, computed from its declarations (pure: no I/O).

Least privilege, as Kafka Streams' documentation lists an application's ACLs: a worker
reads its input topics, writes its outputs, owns the internal topics named after its
app id (changelogs, repartition topics), takes part in the consumer group named by its
app id and, under exactly-once, uses transactional ids under the app id as prefix.
``streamjoin acls -A APP`` prints them; docs/security.md explains each line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from streamjoin.config import AppConfig
from streamjoin.errors import ConfigurationError
from streamjoin.topology import Topology

__all__ = ["Acl", "kafka_acls_commands", "required_acls"]

RESOURCE_TYPES = ("TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER")
PATTERNS = ("LITERAL", "PREFIXED")
#: kafka-acls.sh's option naming each resource type
_RESOURCE_OPTION = {
    "TOPIC": "--topic",
    "GROUP": "--group",
    "TRANSACTIONAL_ID": "--transactional-id",
    "CLUSTER": "--cluster",
}


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW binding: ``principal`` may do ``operation`` on a resource (any host)."""

    resource_type: str
    pattern: str
    name: str
    operation: str
    principal: str
    #: what of the app needs it (for people, not for Kafka)
    why: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.resource_type not in RESOURCE_TYPES:
            raise ConfigurationError(
                f"ACL resource type {self.resource_type!r}: expected one of {RESOURCE_TYPES}"
            )
        if self.pattern not in PATTERNS:
            raise ConfigurationError(f"ACL pattern {self.pattern!r}: expected one of {PATTERNS}")
        if not self.principal.startswith("User:"):
            raise ConfigurationError(
                f"ACL principal {self.principal!r} must look like 'User:<name>'"
            )

    def describe(self) -> str:
        """``READ on TOPIC orders (literal) for User:alice``."""
        return (
            f"{self.operation} on {self.resource_type} {self.name} ({self.pattern.lower()}) "
            f"for {self.principal}"
        )


def internal_prefix(app_id: str) -> str:
    """The prefix of every topic and transactional id the app names after itself."""
    return f"{app_id}-"


def required_acls(topology: Topology, config: AppConfig, principal: str) -> list[Acl]:
    """The ALLOW ACLs ``principal`` needs to run the app's workers, sorted.

    Inputs (topics agents read): READ and DESCRIBE_CONFIGS. Other declared topics (outputs,
    dead-letter topics): WRITE and DESCRIBE_CONFIGS. Internal topics (``<app id>-``
    prefix): CREATE, READ, WRITE, DESCRIBE_CONFIGS. The group ``<app id>``: READ.
    Exactly-once: WRITE on transactional ids prefixed ``<app id>-``. READ and WRITE imply
    DESCRIBE, which metadata, offsets and ``assignment`` need.
    """
    prefix = internal_prefix(config.id)
    acls: set[Acl] = set()

    def allow(kind: str, pattern: str, name: str, operations: Iterable[str], why: str) -> None:
        for operation in operations:
            acls.add(Acl(kind, pattern, name, operation, principal, why))

    sources = topology.source_topics
    for name in sorted(topology.topics):
        if name.startswith(prefix):
            continue  # covered by the prefixed ACLs below
        if name in sources:
            allow("TOPIC", "LITERAL", name, ("READ", "DESCRIBE_CONFIGS"), "input topic")
        else:
            allow("TOPIC", "LITERAL", name, ("WRITE", "DESCRIBE_CONFIGS"), "output topic")
    allow(
        "TOPIC",
        "PREFIXED",
        prefix,
        ("CREATE", "READ", "WRITE", "DESCRIBE_CONFIGS"),
        "internal topics: changelogs, repartition topics",
    )
    allow("GROUP", "LITERAL", config.id, ("READ",), "the app's consumer group")
    if config.exactly_once:
        allow(
            "TRANSACTIONAL_ID",
            "PREFIXED",
            prefix,
            ("WRITE",),
            "exactly-once: each worker's transactional id",
        )
    return sorted(acls)


def kafka_acls_commands(
    acls: Iterable[Acl],
    bootstrap: str = "BOOTSTRAP",
    command_config: str | None = "admin.properties",
) -> list[str]:
    """``kafka-acls.sh --add`` commands creating ``acls``, one per resource and principal."""
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for acl in sorted(acls):
        key = (acl.principal, acl.resource_type, acl.pattern, acl.name)
        grouped.setdefault(key, []).append(acl.operation)
    lines = []
    for (principal, kind, pattern, name), operations in grouped.items():
        parts = ["kafka-acls.sh", "--bootstrap-server", bootstrap]
        if command_config:
            parts += ["--command-config", command_config]
        parts += ["--add", "--allow-principal", principal]
        for operation in operations:
            parts += ["--operation", _camel(operation)]
        parts.append(_RESOURCE_OPTION[kind])
        if kind != "CLUSTER":
            parts.append(name)
        if pattern == "PREFIXED":
            parts += ["--resource-pattern-type", "prefixed"]
        lines.append(" ".join(_quote(p) for p in parts))
    return lines


def _camel(operation: str) -> str:
    """kafka-acls.sh's spelling: ``DESCRIBE_CONFIGS`` -> ``DescribeConfigs``."""
    return "".join(word.capitalize() for word in operation.split("_"))


def _quote(part: str) -> str:
    import shlex

    return shlex.quote(part)
