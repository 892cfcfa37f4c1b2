"""Topic administration: create declared topics, verify existing ones (thin shell over aiokafka).

aiokafka's ``create_topics`` does not raise on per-topic errors, so every
response's ``topic_errors`` is checked here and turned into a named error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import for_code

from streamjoin.errors import (
    AccessRefused,
    ConfigurationError,
    CopartitioningError,
    ProvisioningError,
)
from streamjoin.runtime.transport.record_limits import TopicLimits

_NO_ERROR = 0
_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC_OR_PARTITION = 3
_TOPIC_AUTHORIZATION_FAILED = 29
_CLUSTER_AUTHORIZATION_FAILED = 31


def _count_mismatch(topic: str, declared: int, actual: int) -> CopartitioningError:
    """An existing topic has a different partition count than declared."""
    return CopartitioningError(
        f"topic {topic!r} exists with {actual} partitions but is declared with {declared}. "
        f"Co-partitioned joins need the declared count: recreate the topic, add partitions "
        f"with kafka-topics --alter (keys will move), or declare partitions={actual}."
    )


@dataclass(frozen=True)
class TopicSpec:
    """A topic the application needs: name, partition count, replication and configs.

    ``replication_factor`` None: decided when the topic is created, from the cluster
    (:func:`replication_for`).
    """

    name: str
    partitions: int
    replication_factor: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("topic name must not be empty")
        if self.partitions < 1:
            raise ConfigurationError(
                f"topic {self.name!r}: partitions must be >= 1, got {self.partitions}"
            )


#: "auto" replication never goes above this: 3 copies survive one broker down plus a second
#: failure, as Kafka Streams' recommended replication.factor=3 does
AUTO_REPLICATION_MAX = 3


def replication_for(topic: str, requested: int | None, brokers: int) -> int:
    """The replication factor a topic is created with: ``requested`` when given, else
    ``min(3, brokers)``; more replicas than brokers is a clear error naming both numbers."""
    if requested is None:
        return max(1, min(AUTO_REPLICATION_MAX, brokers))
    if requested > brokers:
        raise ConfigurationError(
            f"topic {topic!r}: replication factor {requested} is more than the {brokers} "
            f"broker{'s' if brokers != 1 else ''} in the cluster; lower it (App("
            f"topic_replication_factor=...) or the topic's replication_factor=), or use "
            f'"auto" (min(3, brokers))'
        )
    return requested


def creation_config(config: Mapping[str, str], replication: int) -> dict[str, str]:
    """A new topic's configs: with 3 or more replicas, ``min.insync.replicas=2`` unless the
    user set it (acks=all then survives one broker down, and an acknowledged write is on
    two brokers: the loss of one never loses it)."""
    out = dict(config)
    if replication >= 3:
        out.setdefault("min.insync.replicas", "2")
    return out


def internal_topics(app_id: str, names: Iterable[str], changelogs: Iterable[str]) -> set[str]:
    """The topics streamjoin makes for itself: changelogs, and ``<app id>-*-repartition``."""
    prefix = f"{app_id}-"
    repartition = {n for n in names if n.startswith(prefix) and n.endswith("-repartition")}
    return repartition | set(changelogs)


@dataclass(frozen=True)
class TopicReplication:
    """An existing topic's replication: its replica count and ``min.insync.replicas``."""

    replication_factor: int
    min_insync_replicas: int | None = None


def replication_warnings(
    existing: Mapping[str, TopicReplication],
    *,
    internal: Iterable[str],
    changelogs: Iterable[str],
    brokers: int,
    exactly_once: bool,
) -> list[str]:
    """One line for each internal topic that is less safe than the cluster allows: a single
    copy on a cluster of 3+ brokers, and (exactly-once) a replicated changelog whose
    ``min.insync.replicas`` of 1 lets an acknowledged write live on one broker only."""
    out = []
    changelog_names = set(changelogs)
    for name in sorted(set(internal) & set(existing)):
        topic = existing[name]
        if topic.replication_factor == 1 and brokers >= AUTO_REPLICATION_MAX:
            out.append(
                f"topic {name!r} has replication factor 1 on a cluster of {brokers} brokers: "
                "losing one broker loses its data. Stop the app's workers, delete the topic "
                "(streamjoin creates it again with 3 replicas) or add replicas with "
                "kafka-reassign-partitions"
            )
        elif (
            exactly_once
            and name in changelog_names
            and topic.replication_factor >= AUTO_REPLICATION_MAX
            and topic.min_insync_replicas == 1
        ):
            out.append(
                f"exactly_once: changelog {name!r} has {topic.replication_factor} replicas "
                "but min.insync.replicas=1, so a committed write can be on one broker only "
                "and lost with it; set it to 2: kafka-configs --alter --entity-type topics "
                f"--entity-name {name} --add-config min.insync.replicas=2"
            )
    return out


async def describe_partition_counts(
    admin: AIOKafkaAdminClient, topics: Iterable[str]
) -> dict[str, int]:
    """Partition count of each existing topic among ``topics`` (missing ones are absent)."""
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    counts: dict[str, int] = {}
    for entry in await admin.describe_topics(wanted):
        code = entry["error_code"]
        if code == _UNKNOWN_TOPIC_OR_PARTITION:
            continue
        if code == _TOPIC_AUTHORIZATION_FAILED:
            raise AccessRefused(
                f"the brokers refused to describe topic {entry['topic']!r} "
                "(TOPIC_AUTHORIZATION_FAILED: DESCRIBE, or READ or WRITE, on it is needed); "
                "`streamjoin acls -A MODULE:APP` lists the ACLs the app needs"
            )
        if code != _NO_ERROR:
            raise ProvisioningError(
                f"describing topic {entry['topic']!r} failed: {for_code(code).__name__}"
            )
        counts[entry["topic"]] = len(entry["partitions"])
    return counts


async def ensure_topics(
    bootstrap_servers: str,
    specs: Iterable[TopicSpec],
    *,
    visible_timeout: float = 30.0,
    **client_kwargs: object,
) -> list[str]:
    """Create the missing topics among ``specs``; verify the partition count of existing ones.

    Returns the names of the topics it created, once the broker's metadata shows them.
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        existing = await describe_partition_counts(admin, (s.name for s in specs))
        for spec in specs:
            if spec.name in existing and existing[spec.name] != spec.partitions:
                raise _count_mismatch(spec.name, spec.partitions, existing[spec.name])
        missing = [s for s in specs if s.name not in existing]
        if not missing:
            return []
        brokers = len((await admin.describe_cluster())["brokers"])
        new_topics = []
        for spec in missing:
            replication = replication_for(spec.name, spec.replication_factor, brokers)
            configs = creation_config(spec.config, replication)
            new_topics.append(
                NewTopic(spec.name, spec.partitions, replication, topic_configs=configs)
            )
        response = await admin.create_topics(new_topics)
        failures = []
        refused = []
        for entry in response.topic_errors:
            name, code = entry[0], entry[1]
            message = entry[2] if len(entry) > 2 else None
            if code in (_NO_ERROR, _TOPIC_ALREADY_EXISTS):
                continue
            if code in (_TOPIC_AUTHORIZATION_FAILED, _CLUSTER_AUTHORIZATION_FAILED):
                refused.append(name)
                continue
            failures.append(f"{name}: {for_code(code).__name__} {message or ''}".strip())
        if refused:
            raise AccessRefused(
                f"the brokers refused to create topics {', '.join(map(repr, refused))} "
                "(TOPIC_AUTHORIZATION_FAILED: CREATE on them is needed, or create them "
                "beforehand); `streamjoin acls -A MODULE:APP` lists the ACLs the app needs"
            )
        if failures:
            raise ProvisioningError("creating topics failed: " + "; ".join(failures))
        # A concurrent creator may have won the race with another partition count. A new
        # topic can take a moment to show up in metadata: wait for it, or later lookups
        # (partition counts, co-partitioning checks) would not find it.
        raced = await _wait_visible(admin, [s.name for s in missing], visible_timeout)
        for spec in missing:
            if spec.name in raced and raced[spec.name] != spec.partitions:
                raise _count_mismatch(spec.name, spec.partitions, raced[spec.name])
        return [s.name for s in missing]
    finally:
        await admin.close()


async def _wait_visible(
    admin: AIOKafkaAdminClient, names: list[str], timeout: float
) -> dict[str, int]:
    """Partition counts of ``names``, waiting (bounded) until every one of them is described."""
    deadline = time.monotonic() + timeout
    while True:
        counts = await describe_partition_counts(admin, names)
        absent = [n for n in names if n not in counts]
        if not absent:
            return counts
        if time.monotonic() > deadline:
            raise ProvisioningError(
                f"topics created but still not in the broker's metadata after {timeout:.0f}s: "
                + ", ".join(absent)
            )
        await asyncio.sleep(0.1)


async def check_replication(
    bootstrap_servers: str,
    internal: Iterable[str],
    changelogs: Iterable[str],
    *,
    exactly_once: bool,
    **client_kwargs: object,
) -> list[str]:
    """:func:`replication_warnings` for the existing ``internal`` topics, as the cluster
    describes them now (their replicas, and the changelogs' ``min.insync.replicas``)."""
    wanted = sorted(set(internal))
    if not wanted:
        return []
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        brokers = len((await admin.describe_cluster())["brokers"])
        replicas: dict[str, int] = {}
        for entry in await admin.describe_topics(wanted):
            if entry["error_code"] == _NO_ERROR and entry["partitions"]:
                replicas[entry["topic"]] = min(len(p["replicas"]) for p in entry["partitions"])
        min_isr: dict[str, int] = {}
        changelog_names = sorted(set(changelogs) & set(replicas))
        if exactly_once and changelog_names:
            responses = await admin.describe_configs(
                [
                    ConfigResource(ConfigResourceType.TOPIC, name, {"min.insync.replicas": None})
                    for name in changelog_names
                ]
            )
            for response in responses:
                for code, _message, _type, name, entries in response.resources:
                    for entry in entries if code == _NO_ERROR else ():
                        if entry[0] == "min.insync.replicas" and entry[1] is not None:
                            min_isr[name] = int(entry[1])
    finally:
        await admin.close()
    existing = {
        name: TopicReplication(count, min_isr.get(name)) for name, count in replicas.items()
    }
    return replication_warnings(
        existing,
        internal=wanted,
        changelogs=changelogs,
        brokers=brokers,
        exactly_once=exactly_once,
    )


async def fetch_partition_counts(
    bootstrap_servers: str, topics: Iterable[str], **client_kwargs: object
) -> dict[str, int]:
    """Partition counts of existing topics, with a short-lived admin client."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        return await describe_partition_counts(admin, topics)
    finally:
        await admin.close()


#: the broker's default max.message.bytes (used when a topic's config cannot be read)
_DEFAULT_MAX_MESSAGE_BYTES = 1048588


async def fetch_topic_limits(
    bootstrap_servers: str, topics: Iterable[str], **client_kwargs: object
) -> dict[str, TopicLimits]:
    """``max.message.bytes`` and whether compacted, of each existing topic among ``topics``
    (their effective configs: the topic's own or the broker's default)."""
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in wanted]
        )
    finally:
        await admin.close()
    limits: dict[str, TopicLimits] = {}
    for response in responses:
        for code, _message, _type, name, entries in response.resources:
            if code != _NO_ERROR:
                continue  # not there (yet): its sends are checked by the broker alone
            configs = {entry[0]: entry[1] for entry in entries}
            limits[name] = TopicLimits(
                max_message_bytes=int(
                    configs.get("max.message.bytes") or _DEFAULT_MAX_MESSAGE_BYTES
                ),
                compacted="compact" in (configs.get("cleanup.policy") or ""),
            )
    return limits
