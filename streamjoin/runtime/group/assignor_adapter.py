"""Plugs the pure assignor into the consumer group protocol (our membership service).

The membership service (:mod:`streamjoin.runtime.group.membership`) calls
:meth:`StreamjoinAssignor.metadata` when joining (our subscription userdata:
what this worker claims and owns, its epoch, lags, capacity, tags, instance
id), :meth:`~StreamjoinAssignor.assign_members` on the elected leader (decode
every member, run :func:`streamjoin.assignor.assign`, validate, withhold moving
tasks under the cooperative protocol, encode), and
:meth:`~StreamjoinAssignor.on_assignment` on every member (remember the new
epoch, standby, pending and warmup partitions for the next join).

Every decision the leader makes is a small function of its own, tested without
a broker: :func:`read_subscription` (unreadable or incompatible userdata: the
member is treated as new), :func:`resolve_member_ids` (instance ids, and what
happens to duplicates), :func:`known_partitions` and :func:`build_scenario`
(topics the cluster does not know yet), :func:`compute_assignment` (validation
and the fallback, below) and :func:`kafka_assignment` (changelog topics are
restored, not consumed, so they are never in the Kafka-level assignment; the
member learns its standbys from the assignment userdata).

**Validation.** Like Kafka Streams' ``StreamsPartitionAssignor`` checks its own
output, the leader runs :func:`~streamjoin.assignor.find_violations` on every
assignment before sending it, and logs each broken rule at ERROR. What it then
sends (:func:`compute_assignment`):

* a result that only breaks a quality rule (balance, minimal movement, standby
  count/balance/tag spread, its own stats) is sent anyway: every task still has
  exactly one owner that can consume it, which beats any replacement;
* a result that breaks a safety rule (:data:`~streamjoin.assignor.SAFETY_CODES`:
  a task with two actives or none, a split join, a partition its member cannot
  consume, a misplaced standby), or an assignor that raises, is never sent: the
  leader sends :func:`~streamjoin.assignor.fallback_assignment` (previous owners
  keep their tasks, orphans go to the least loaded member), itself validated.

The leader does not raise for these, although that is the obvious way to
"fail loudly": a leader that sends no SyncGroup leaves the other members
waiting until its session times out, and the next leader computes the same
result from the same input (the assignor is deterministic) and fails the same
way: the group would never get an assignment. Only when the fallback too is
unsafe (the grouping itself is broken) does
:meth:`~StreamjoinAssignor.assign_members` raise
:class:`~streamjoin.assignor.InvalidAssignmentError` (the worker stops with it),
as nothing safe is left to send.

What a worker owned is also saved to ``<state_dir>/membership.json`` after
each assignment, so a restarted process claims its previous tasks (at its old
epoch: a newer owner still wins the conflict).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamjoin.assignor import AssignmentResult, assign, fallback_assignment, find_violations
from streamjoin.assignor.cooperative import withhold_moves
from streamjoin.assignor.model import AssignorConfig, MemberState, Scenario, TopicPartitions
from streamjoin.assignor.protocol import (
    SubscriptionUserdata,
    assignment_userdata_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    next_generation,
)
from streamjoin.errors import (
    InvalidAssignmentError,
    UnsupportedUserdataVersion,
    UserdataError,
    Violation,
)

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.topology import Topology

log = logging.getLogger("streamjoin.assignor")

ASSIGNOR_NAME = "streamjoin"
#: Kafka consumer-protocol version of our metadata/assignment structs.
CONSUMER_PROTOCOL_VERSION = 0
#: how many violations of one rule are logged with their message
_LOGGED_PER_RULE = 3

LagProvider = Callable[[], Mapping[str, Mapping[int, int]]]


def _group_by_topic(tps: Iterable[tuple[str, int]]) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for topic, partition in tps:
        out.setdefault(topic, []).append(partition)
    return {t: tuple(sorted(ps)) for t, ps in sorted(out.items())}


# --------------------------------------------------------------------------- leader side


def read_subscription(kafka_id: str, user_data: bytes) -> SubscriptionUserdata:
    """A member's subscription userdata; a member whose userdata cannot be read is new.

    It still gets work (capacity 1, no tags), it just claims nothing: an
    incompatible version (a rolling upgrade across a major protocol version) or
    corrupt bytes must not block the rebalance. Either is logged as a warning.
    """
    try:
        return decode_subscription(user_data)
    except UnsupportedUserdataVersion as exc:
        log.warning(
            "member %s runs an incompatible streamjoin version (%s); treating it as new: "
            "it claims nothing this rebalance",
            kafka_id,
            exc,
        )
    except UserdataError as exc:
        log.warning("member %s sent unreadable userdata (%s); treating it as new", kafka_id, exc)
    return SubscriptionUserdata()


def resolve_member_ids(members: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """Assignor member id -> Kafka member id, from ``(kafka member id, group_instance_id)``.

    A member is known by its ``group_instance_id`` when it has one (stable
    across restarts), else by its Kafka member id. When two members report the
    same instance id, the first in Kafka member-id order keeps it and the other
    is known by its Kafka member id (warned): both get work, neither steals the
    other's assignment. Should that id be taken as well (an instance id equal to
    another member's Kafka id), a ``#n`` suffix makes it unique.
    """
    out: dict[str, str] = {}
    for kafka_id, instance_id in sorted(members, key=lambda m: m[0]):
        member_id = instance_id or kafka_id
        if member_id in out:
            if instance_id:
                log.warning(
                    "members %s and %s both report group_instance_id %r; %s is assigned "
                    "under its Kafka member id",
                    out[member_id],
                    kafka_id,
                    instance_id,
                    kafka_id,
                )
            member_id, n = kafka_id, 0
            while member_id in out:
                n += 1
                member_id = f"{kafka_id}#{n}"
        out[member_id] = kafka_id
    return out


def read_members(
    members: Mapping[str, ConsumerProtocolMemberMetadata],
) -> tuple[list[MemberState], dict[str, str], dict[str, TopicPartitions]]:
    """The assignor's view of every member, assignor member id -> Kafka member id, and
    what each member (assignor id) processes right now."""
    userdata = {k: read_subscription(k, members[k].user_data) for k in sorted(members)}
    ids = resolve_member_ids((k, u.group_instance_id) for k, u in userdata.items())
    states = [
        userdata[kafka_id].to_member_state(member_id, members[kafka_id].subscription)
        for member_id, kafka_id in ids.items()
    ]
    owned = {member_id: userdata[kafka_id].owned for member_id, kafka_id in ids.items()}
    return states, ids, owned


def known_partitions(cluster: ClusterMetadata, topics: Iterable[str]) -> dict[str, int]:
    """Partition counts of those ``topics`` the cluster metadata knows (with partitions)."""
    out: dict[str, int] = {}
    for topic in sorted(set(topics)):
        partitions = cluster.partitions_for_topic(topic)
        if partitions:
            out[topic] = len(partitions)
    return out


def build_scenario(
    states: Sequence[MemberState],
    topics: Mapping[str, int],
    copartition: Iterable[Sequence[str]],
    changelog_topics: frozenset[str],
    config: AssignorConfig,
) -> Scenario:
    """The assignor's input over the topics the cluster knows (``topics``).

    A topic some member subscribes to but the cluster does not know (being
    created, or declared by a newer worker during a rolling upgrade) is left
    out, warned about, of subscriptions, claims, lags and co-partition groups;
    the rest of its co-partition group stays together, so a join whose
    changelog does not exist yet still gets both inputs' partition p on one
    member.
    """
    known = frozenset(topics)
    unknown = sorted({t for s in states for t in s.topics} - known)
    if unknown:
        log.warning(
            "ignoring topic(s) unknown to the cluster metadata until they exist: %s",
            ", ".join(unknown),
        )
    groups = (tuple(t for t in group if t in known) for group in copartition)
    return Scenario(
        topics=dict(topics),
        members=tuple(_only_known_topics(s, known) for s in states),
        copartition=tuple(g for g in groups if g),
        changelog_topics=changelog_topics & known,
        config=config,
    )


@dataclass(frozen=True)
class Vetted:
    """What the leader sends for a scenario, and what was wrong on the way there."""

    result: AssignmentResult
    #: the rules the assignor's own result broke (empty when it was valid)
    violations: tuple[Violation, ...] = ()
    #: what the assignor or the validator raised, if it did
    error: Exception | None = None
    #: True when ``result`` is the fallback assignment, not the assignor's
    fallback: bool = False


def compute_assignment(scenario: Scenario) -> Vetted:
    """Assign and validate; never returns an unsafe assignment (see the module docstring).

    The assignor's result is returned when it breaks no safety rule (possibly
    with quality violations, which the caller logs); otherwise, or when the
    assignor or validator raises, the validated fallback assignment. Raises
    :class:`InvalidAssignmentError` if the fallback is unsafe too, and lets an
    exception from validating the fallback itself propagate: in both cases
    there is nothing checked left to send.
    """
    try:
        result = assign(scenario)
        violations = find_violations(scenario, result)
    except Exception as exc:  # a bug every leader would hit again: fall back, do not fail
        return _fall_back(scenario, (), exc)
    if any(v.unsafe for v in violations):
        return _fall_back(scenario, violations, None)
    return Vetted(result, tuple(violations))


def _fall_back(
    scenario: Scenario, violations: Sequence[Violation], error: Exception | None
) -> Vetted:
    result = fallback_assignment(scenario)
    unsafe = [v for v in find_violations(scenario, result) if v.unsafe]
    if unsafe:
        raise InvalidAssignmentError([*violations, *unsafe]) from error
    return Vetted(result, tuple(violations), error, fallback=True)


def kafka_assignment(
    active: TopicPartitions, changelog_topics: Iterable[str]
) -> list[tuple[str, list[int]]]:
    """The partitions a member consumes: its actives except changelog topics (restored)."""
    skip = frozenset(changelog_topics)
    return sorted((t, list(ps)) for t, ps in active.items() if t not in skip)


def member_assignment(
    result: AssignmentResult, member_id: str, generation: int, changelog_topics: Iterable[str]
) -> ConsumerProtocolMemberAssignment:
    """One member's assignment: consumed partitions, plus epoch and standbys in userdata."""
    member = result.assignments.get(member_id)
    active: TopicPartitions = member.active if member is not None else {}
    return ConsumerProtocolMemberAssignment(
        CONSUMER_PROTOCOL_VERSION,
        kafka_assignment(active, changelog_topics),
        encode_assignment(assignment_userdata_for(result, member_id, generation)),
    )


def log_vetted(generation: int, vetted: Vetted) -> None:
    """ERROR lines naming each broken rule and what the leader sends instead, if anything."""
    if vetted.error is not None:
        log.error(
            "assignor failed for epoch %d: %r",
            generation,
            vetted.error,
            exc_info=vetted.error,
        )
    by_rule: dict[str, list[Violation]] = defaultdict(list)
    for violation in vetted.violations:
        by_rule[violation.code.value].append(violation)
    for rule, found in sorted(by_rule.items()):
        shown = "; ".join(v.message for v in found[:_LOGGED_PER_RULE])
        hidden = len(found) - _LOGGED_PER_RULE
        more = f" (and {hidden} more)" if hidden > 0 else ""
        log.error(
            "assignment for epoch %d breaks rule %s%s: %s%s",
            generation,
            rule,
            " (unsafe)" if found[0].unsafe else "",
            shown,
            more,
        )
    if vetted.fallback:
        log.error(
            "not sending the assignor's result for epoch %d: sending the fallback assignment "
            "(previous owners keep their tasks, orphans go to the least loaded members; "
            "see docs/assignor.md)",
            generation,
        )
    elif vetted.violations:
        log.error(
            "sending the assignment for epoch %d anyway: every task has exactly one owner "
            "that can consume it",
            generation,
        )


# --------------------------------------------------------------------------- member side


@dataclass(frozen=True)
class Membership:
    """What a worker owned after its last assignment, kept across restarts."""

    generation: int = -1
    active: TopicPartitions = field(default_factory=dict)
    standby: TopicPartitions = field(default_factory=dict)


def read_membership(path: Path) -> Membership | None:
    """The membership saved at ``path``; None if there is none or it is unreadable (warned)."""
    if not path.exists():
        return None
    try:
        saved: dict[str, Any] = json.loads(path.read_text())
        return Membership(
            generation=int(saved["generation"]),
            active={str(t): tuple(int(p) for p in ps) for t, ps in saved["active"].items()},
            standby={str(t): tuple(int(p) for p in ps) for t, ps in saved["standby"].items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None


def write_membership(path: Path, membership: Membership) -> None:
    """Save atomically (write a sibling, then rename); a failure is only warned about."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "generation": membership.generation,
                    "active": {t: list(ps) for t, ps in membership.active.items()},
                    "standby": {t: list(ps) for t, ps in membership.standby.items()},
                }
            )
        )
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not save %s: %s", path, exc)


class StreamjoinAssignor:
    """The group's assignor, backed by :mod:`streamjoin.assignor`."""

    def __init__(
        self,
        *,
        copartition: Iterable[Iterable[str]] = (),
        changelog_topics: Iterable[str] = (),
        config: AssignorConfig | None = None,
        capacity: int = 1,
        tags: Mapping[str, str] | None = None,
        host: str | None = None,
        group_instance_id: str | None = None,
        lag_provider: LagProvider | None = None,
        membership_file: Path | None = None,
    ) -> None:
        self._copartition = tuple(tuple(sorted(g)) for g in copartition)
        self._changelog_topics = frozenset(changelog_topics)
        self._config = config or AssignorConfig()
        self._capacity = capacity
        self._tags = dict(tags or {})
        self._host = host
        self._instance_id = group_instance_id
        self._lag_provider = lag_provider
        self._membership_file = membership_file
        self.generation = -1
        #: what this worker claims (for stickiness): its assignment plus what is pending
        self.active: TopicPartitions = {}
        self.standby: TopicPartitions = {}
        #: active partitions withheld from this worker until their owner revokes them
        self.pending: TopicPartitions = {}
        #: changelog partitions to restore for a future move here (KIP-441 warmups)
        self.warmup: TopicPartitions = {}
        self.followup_rebalance = False
        self._load_membership()

    @classmethod
    def for_topology(
        cls, topology: Topology, config: AppConfig, lag_provider: LagProvider | None = None
    ) -> StreamjoinAssignor:
        return cls(
            lag_provider=lag_provider,
            copartition=topology.copartition_groups,
            changelog_topics=topology.changelog_topics,
            config=AssignorConfig(
                standby_replicas=config.standby_replicas,
                acceptable_recovery_lag=config.acceptable_recovery_lag,
                high_availability=config.high_availability,
                max_warmup_replicas=config.max_warmup_replicas,
            ),
            capacity=config.capacity,
            tags=config.tags,
            host=config.host,
            group_instance_id=config.group_instance_id,
            membership_file=config.state_path / "membership.json",
        )

    # -- member side

    def metadata(
        self, topics: Iterable[str], owned: Iterable[tuple[str, int]] = ()
    ) -> ConsumerProtocolMemberMetadata:
        """Our subscription: ``owned`` is what this process consumes right now."""
        userdata = SubscriptionUserdata(
            generation=self.generation,
            active=self.active,
            standby=self.standby,
            state_lag=self._lag_provider() if self._lag_provider else {},
            capacity=self._capacity,
            tags=self._tags,
            host=self._host,
            group_instance_id=self._instance_id,
            owned=_group_by_topic(owned),
        )
        # Changelog topics are listed so the leader sees this member as eligible for the
        # groups they belong to; they never appear in the Kafka-level active assignment.
        subscription = sorted(set(topics) | self._changelog_topics)
        return ConsumerProtocolMemberMetadata(
            CONSUMER_PROTOCOL_VERSION, subscription, encode_subscription(userdata)
        )

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        assigned = [(t, p) for t, ps in assignment.assignment for p in ps]
        self.active = _group_by_topic(assigned)
        try:
            userdata = decode_assignment(assignment.user_data)
        except UserdataError as exc:
            log.error("ignoring unreadable assignment userdata: %s", exc)
            self.pending, self.warmup, self.followup_rebalance = {}, {}, False
            return
        self.generation = userdata.generation
        self.standby = userdata.standby
        self.pending = userdata.pending
        self.warmup = userdata.warmup
        self.followup_rebalance = userdata.followup_rebalance
        if self.pending:
            # claimed in the next subscription, so that the follow-up rebalance (once their
            # owner revoked them) gives them here, as the leader intended
            pending = [(t, p) for t, ps in self.pending.items() for p in ps]
            self.active = _group_by_topic([*assigned, *pending])
        self._save_membership()

    def restore_targets(self) -> dict[str, set[int]]:
        """Changelog partitions to keep warm here: standbys, warmups and pending tasks."""
        out: dict[str, set[int]] = {}
        for source in (self.standby, self.warmup, self.pending):
            for topic, partitions in source.items():
                if topic in self._changelog_topics:
                    out.setdefault(topic, set()).update(partitions)
        return out

    # -- leader side

    def assign_members(
        self,
        topics: Mapping[str, int],
        members: Mapping[str, ConsumerProtocolMemberMetadata],
        *,
        cooperative: bool,
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """The leader's work: every member's assignment (Kafka member id -> assignment).

        ``topics`` are the partition counts of the topics the cluster knows. Under the
        cooperative protocol, and whenever a member still owns partitions, tasks whose
        owner changes are withheld from their new owner until the owner revoked them.
        """
        states, kafka_ids, owned = read_members(members)
        scenario = build_scenario(
            states, topics, self._copartition, self._changelog_topics, self._config
        )
        generation = next_generation(s.generation for s in states)
        vetted = compute_assignment(scenario)
        log_vetted(generation, vetted)
        result = vetted.result
        if cooperative or any(owned.values()):
            result = withhold_moves(result, owned, scenario.topics, scenario.copartition)
        for warning in result.warnings:
            log.warning("assignor: %s", warning)
        log.info(
            "assignment epoch %d for %d members: %d tasks, %d moved (minimum %s)%s",
            generation,
            len(states),
            result.stats.tasks,
            result.stats.moved,
            result.stats.min_possible_moves,
            f", {withheld} withheld until revoked"
            if (withheld := result.stats.extra.get("withheld"))
            else "",
        )
        return {
            kafka_id: member_assignment(result, member_id, generation, self._changelog_topics)
            for member_id, kafka_id in kafka_ids.items()
        }

    # -- persistence of what this worker owned

    def _load_membership(self) -> None:
        if self._membership_file is None:
            return
        saved = read_membership(self._membership_file)
        if saved is not None:
            self.generation, self.active, self.standby = (
                saved.generation,
                saved.active,
                saved.standby,
            )

    def _save_membership(self) -> None:
        if self._membership_file is not None:
            write_membership(
                self._membership_file, Membership(self.generation, self.active, self.standby)
            )


def _only_known_topics(state: MemberState, known: frozenset[str]) -> MemberState:
    """Drop subscriptions and claims on topics that do not exist (yet) in the cluster."""
    if state.topics | state.active.keys() | state.standby.keys() | state.state_lag.keys() <= known:
        return state
    return MemberState(
        member_id=state.member_id,
        topics=state.topics & known,
        capacity=state.capacity,
        generation=state.generation,
        active={t: ps for t, ps in state.active.items() if t in known},
        standby={t: ps for t, ps in state.standby.items() if t in known},
        state_lag={t: lag for t, lag in state.state_lag.items() if t in known},
        tags=state.tags,
        host=state.host,
    )
