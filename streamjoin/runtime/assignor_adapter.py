"""Plugs the pure assignor into aiokafka's client-side assignment (thin shell, no decisions).

aiokafka calls :meth:`StreamjoinAssignor.metadata` when joining (our
subscription userdata: what this worker owned, its epoch, lags, capacity,
tags, instance id), :meth:`assign` on the elected leader (decode every member,
run :func:`streamjoin.assignor.assign`, encode), and :meth:`on_assignment` on
every member (remember the new epoch, active and standby partitions for the
next join). aiokafka rebalances eagerly; an instance is accepted where it
expects an assignor class.

What a worker owned is also saved to ``<state_dir>/membership.json`` after
each assignment, so a restarted process claims its previous tasks (at its old
epoch: a newer owner still wins the conflict).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from streamjoin.assignor import assign
from streamjoin.assignor.model import AssignorConfig, MemberState, Scenario, TopicPartitions
from streamjoin.assignor.protocol import (
    SubscriptionUserdata,
    UserdataError,
    assignment_userdata_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    next_generation,
)

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.topology import Topology

log = logging.getLogger("streamjoin.assignor")

ASSIGNOR_NAME = "streamjoin"
#: Kafka consumer-protocol version of our metadata/assignment structs.
CONSUMER_PROTOCOL_VERSION = 0

LagProvider = Callable[[], Mapping[str, Mapping[int, int]]]


def _group_by_topic(tps: Iterable[tuple[str, int]]) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for topic, partition in tps:
        out.setdefault(topic, []).append(partition)
    return {t: tuple(sorted(ps)) for t, ps in sorted(out.items())}


class StreamjoinAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """aiokafka assignor backed by :mod:`streamjoin.assignor`."""

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
        self.active: TopicPartitions = {}
        self.standby: TopicPartitions = {}
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
            config=AssignorConfig(standby_replicas=config.standby_replicas),
            capacity=config.capacity,
            tags=config.tags,
            host=config.host,
            group_instance_id=config.group_instance_id,
            membership_file=config.state_path / "membership.json",
        )

    @property
    def name(self) -> str:
        return ASSIGNOR_NAME

    # -- member side

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        userdata = SubscriptionUserdata(
            generation=self.generation,
            active=self.active,
            standby=self.standby,
            state_lag=self._lag_provider() if self._lag_provider else {},
            capacity=self._capacity,
            tags=self._tags,
            host=self._host,
            group_instance_id=self._instance_id,
        )
        # Changelog topics are listed so the leader sees this member as eligible for the
        # groups they belong to; they never appear in the Kafka-level active assignment.
        subscription = sorted(set(topics) | self._changelog_topics)
        return ConsumerProtocolMemberMetadata(
            CONSUMER_PROTOCOL_VERSION, subscription, encode_subscription(userdata)
        )

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.active = {t: tuple(sorted(ps)) for t, ps in assignment.assignment}
        try:
            userdata = decode_assignment(assignment.user_data)
        except UserdataError as exc:
            log.error("ignoring unreadable assignment userdata: %s", exc)
            return
        self.generation = userdata.generation
        self.standby = userdata.standby
        self.followup_rebalance = userdata.followup_rebalance
        self._save_membership()

    def record_active(self, assigned: set[tuple[str, int]]) -> None:
        """Called after partitions were assigned (keeps ``active`` right if aiokafka filtered)."""
        self.active = _group_by_topic(assigned)

    # -- leader side

    def assign(
        self,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        states: list[MemberState] = []
        kafka_ids: dict[str, str] = {}
        for kafka_id in sorted(members):
            meta = members[kafka_id]
            try:
                userdata = decode_subscription(meta.user_data)
            except UserdataError as exc:
                # An incompatible or broken member still gets work: it just claims nothing.
                log.warning(
                    "member %s sent unreadable userdata (%s); treating as new", kafka_id, exc
                )
                userdata = SubscriptionUserdata()
            member_id = userdata.group_instance_id or kafka_id
            if member_id in kafka_ids:
                member_id = kafka_id  # duplicate instance id: fall back to the unique Kafka id
            kafka_ids[member_id] = kafka_id
            states.append(userdata.to_member_state(member_id, meta.subscription))
        topics: dict[str, int] = {}
        for state in states:
            for topic in state.topics:
                partitions = cluster.partitions_for_topic(topic)
                if partitions:
                    topics[topic] = len(partitions)
        known = set(topics)
        scenario = Scenario(
            topics=topics,
            members=tuple(_only_known_topics(s, known) for s in states),
            copartition=tuple(g for g in self._copartition if set(g) <= known),
            changelog_topics=self._changelog_topics & known,
            config=self._config,
        )
        result = assign(scenario)
        generation = next_generation(s.generation for s in states)
        for warning in result.warnings:
            log.warning("assignor: %s", warning)
        log.info(
            "assignment epoch %d for %d members: %d tasks, %d moved (minimum %s)",
            generation,
            len(states),
            result.stats.tasks,
            result.stats.moved,
            result.stats.min_possible_moves,
        )
        out: dict[str, ConsumerProtocolMemberAssignment] = {}
        for member_id, kafka_id in kafka_ids.items():
            member = result.assignments.get(member_id)
            active = member.active if member is not None else {}
            out[kafka_id] = ConsumerProtocolMemberAssignment(
                CONSUMER_PROTOCOL_VERSION,
                sorted(
                    (t, list(ps)) for t, ps in active.items() if t not in self._changelog_topics
                ),
                encode_assignment(assignment_userdata_for(result, member_id, generation)),
            )
        return out

    # -- persistence of what this worker owned

    def _load_membership(self) -> None:
        path = self._membership_file
        if path is None or not path.exists():
            return
        try:
            saved: dict[str, Any] = json.loads(path.read_text())
            self.generation = int(saved["generation"])
            self.active = {str(t): tuple(int(p) for p in ps) for t, ps in saved["active"].items()}
            self.standby = {str(t): tuple(int(p) for p in ps) for t, ps in saved["standby"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable %s: %s", path, exc)
            self.generation, self.active, self.standby = -1, {}, {}

    def _save_membership(self) -> None:
        path = self._membership_file
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(
                json.dumps(
                    {
                        "generation": self.generation,
                        "active": {t: list(ps) for t, ps in self.active.items()},
                        "standby": {t: list(ps) for t, ps in self.standby.items()},
                    }
                )
            )
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not save %s: %s", path, exc)


def _only_known_topics(state: MemberState, known: set[str]) -> MemberState:
    """Drop subscriptions and claims on topics that do not exist (yet) in the cluster."""
    if state.topics <= known and set(state.active) <= known and set(state.standby) <= known:
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
