"""Typed inputs and outputs of the assignor (pure: no I/O, no asyncio, no Kafka).

These value objects are the contract between the runtime (which builds them from
aiokafka's group metadata and our userdata) and the assignment core. They are
frozen so the core can share them freely; mappings are copied into plain
dicts/tuples by the constructors so callers cannot mutate them afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamjoin.errors import InvalidScenarioError

#: state lags whose keys and values are all of these types need no conversion
_INT = frozenset([int])

#: topic name -> sorted partition numbers
TopicPartitions = Mapping[str, tuple[int, ...]]


def normalize_topic_partitions(value: Mapping[str, Iterable[int]]) -> dict[str, tuple[int, ...]]:
    """Sorted, de-duplicated partitions per topic; topics with no partitions dropped.

    Co-partitioned topics usually share one partition tuple (decoded userdata
    and assignments do): it is normalized once, and the result stays shared.
    """
    out: dict[str, tuple[int, ...]] = {}
    #: id of a given tuple -> (that tuple, kept alive so the id stays its own; normalized)
    done: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for topic in sorted(value):
        given = value[topic]
        if type(given) is tuple:
            hit = done.get(id(given))
            if hit is None:
                hit = done[id(given)] = (given, tuple(sorted(set(given))))
            parts = hit[1]
        else:
            parts = tuple(sorted(set(given)))
        if parts:
            out[topic] = parts
    return out


def sorted_by_key(mapping: Mapping[int, int]) -> dict[int, int]:
    """A plain-dict copy in key order (lags: normalized once by the decoder, once more
    by the member state, so a mapping already in order is just copied)."""
    keys = list(mapping)
    ordered = sorted(keys)
    if keys == ordered:
        return dict(mapping)
    return dict(zip(ordered, map(mapping.__getitem__, ordered), strict=True))


@dataclass(frozen=True)
class MemberState:
    """What one group member reports in its subscription.

    ``active``/``standby`` are the topic partitions it owned in its last
    assignment (as of ``generation``); ``state_lag`` is, per changelog topic and
    partition, how far its local store is behind the changelog end (0 = caught
    up, absent = no local state).
    """

    member_id: str
    topics: frozenset[str]
    capacity: int = 1
    generation: int = -1
    active: TopicPartitions = field(default_factory=dict)
    standby: TopicPartitions = field(default_factory=dict)
    state_lag: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None

    def __post_init__(self) -> None:
        if not self.member_id:
            raise InvalidScenarioError("member id must be a non-empty string")
        if self.capacity < 1:
            raise InvalidScenarioError(
                f"member {self.member_id!r}: capacity must be >= 1, got {self.capacity}"
            )
        object.__setattr__(self, "topics", frozenset(self.topics))
        object.__setattr__(self, "active", normalize_topic_partitions(self.active))
        object.__setattr__(self, "standby", normalize_topic_partitions(self.standby))
        lag: dict[str, dict[int, int]] = {}
        for topic in sorted(self.state_lag):
            per_partition = self.state_lag[topic]
            if not set(map(type, per_partition)) | set(map(type, per_partition.values())) <= _INT:
                per_partition = {int(p): int(v) for p, v in per_partition.items()}
            if per_partition and min(per_partition.values()) < 0:
                for p, v in per_partition.items():
                    if v < 0:
                        raise InvalidScenarioError(
                            f"member {self.member_id!r}: negative state lag {v} for {topic}[{p}]"
                        )
            lag[topic] = sorted_by_key(per_partition)
        object.__setattr__(self, "state_lag", lag)
        object.__setattr__(self, "tags", dict(sorted(self.tags.items())))


@dataclass(frozen=True)
class AssignorConfig:
    """Knobs of the assignment; defaults are the documented ones."""

    standby_replicas: int = 0
    acceptable_recovery_lag: int = 10_000
    #: KIP-441 style: keep a task on a caught-up member beyond its share while a
    #: warm-up replica catches up on the balanced target. Off by default.
    high_availability: bool = False
    #: KIP-441 style: at most this many warm-up replicas at once (high-availability mode only).
    max_warmup_replicas: int = 2

    def __post_init__(self) -> None:
        if self.max_warmup_replicas < 0:
            raise InvalidScenarioError(
                f"max_warmup_replicas must be >= 0, got {self.max_warmup_replicas}"
            )
        if self.standby_replicas < 0:
            raise InvalidScenarioError(
                f"standby_replicas must be >= 0, got {self.standby_replicas}"
            )
        if self.acceptable_recovery_lag < 0:
            raise InvalidScenarioError(
                f"acceptable_recovery_lag must be >= 0, got {self.acceptable_recovery_lag}"
            )


@dataclass(frozen=True)
class Scenario:
    """Everything the assignor needs: cluster topics, declared groups, members."""

    topics: Mapping[str, int]
    members: tuple[MemberState, ...]
    copartition: tuple[tuple[str, ...], ...] = ()
    changelog_topics: frozenset[str] = frozenset()
    config: AssignorConfig = field(default_factory=AssignorConfig)


@dataclass(frozen=True)
class MemberAssignment:
    """What one member is told to own after the rebalance.

    ``warmup`` (high-availability mode only) lists changelog partitions to restore
    so the member can take over the task's active in a follow-up rebalance.
    ``pending`` (cooperative rebalancing) lists active partitions meant for this
    member but withheld until their current owner has revoked them.
    """

    active: TopicPartitions
    standby: TopicPartitions
    warmup: TopicPartitions = field(default_factory=dict)
    pending: TopicPartitions = field(default_factory=dict)


@dataclass(frozen=True)
class AssignmentStats:
    tasks: int
    moved: int
    #: None where the minimum cannot be computed exactly (unequal subscriptions).
    min_possible_moves: int | None
    standby_tasks: int = 0
    extra: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AssignmentResult:
    assignments: Mapping[str, MemberAssignment]
    unassigned: TopicPartitions
    warnings: tuple[str, ...]
    followup_rebalance: bool
    stats: AssignmentStats
