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

from streamjoin.errors import ConfigurationError, CopartitioningError, ProvisioningError
from streamjoin.runtime.transport.record_limits import TopicLimits

_NO_ERROR = 0
_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC_OR_PARTITION = 3


def _count_mismatch(topic: str, declared: int, actual: int) -> CopartitioningError:
    """An existing topic has a different partition count than declared."""
    return CopartitioningError(
        f"topic {topic!r} exists with {actual} partitions but is declared with {declared}. "
        f"Co-partitioned joins need the declared count: recreate the topic, add partitions "
        f"with kafka-topics --alter (keys will move), or declare partitions={actual}."
    )


@dataclass(frozen=True)
class TopicSpec:
    """A topic the application needs: name, partition count, replication and configs."""

    name: str
    partitions: int
    replication_factor: int = 1
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("topic name must not be empty")
        if self.partitions < 1:
            raise ConfigurationError(
                f"topic {self.name!r}: partitions must be >= 1, got {self.partitions}"
            )


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
        response = await admin.create_topics(
            [
                NewTopic(
                    s.name,
                    s.partitions,
                    s.replication_factor,
                    topic_configs=dict(s.config),
                )
                for s in missing
            ]
        )
        failures = []
        for entry in response.topic_errors:
            name, code = entry[0], entry[1]
            message = entry[2] if len(entry) > 2 else None
            if code in (_NO_ERROR, _TOPIC_ALREADY_EXISTS):
                continue
            failures.append(f"{name}: {for_code(code).__name__} {message or ''}".strip())
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
