"""GroupMembership, the asyncio shell of the group protocol, against a scripted fake of
aiokafka's client (tests/unit/runtime/group_support.py).

What each answer means is tested input by input in test_group_protocol.py; these tests
check that the shell performs the decisions: the requests it sends, the listener calls in
their order, the two tasks. "Nothing else happens" is never shown by sleeping: a test waits
for an explicit event (a request sent, a task ended) and then reads the state that rules
out anything further (no rejoin due, no probe planned, the coordination task ended).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.client import ConnectionGroup
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.commit import OffsetCommitRequest
from aiokafka.protocol.group import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    SyncGroupRequest,
)

from streamjoin.errors import FencedInstanceError, GroupMembershipError
from streamjoin.runtime.group.membership import (
    COOPERATIVE_PROTOCOL,
    EAGER_PROTOCOL,
    GroupMembership,
    MembershipSettings,
)
from tests.unit.runtime.group_support import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP,
    GROUP_AUTHORIZATION_FAILED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    MEMBER_ID_REQUIRED,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    TOPIC,
    UNKNOWN_MEMBER_ID,
    FakeAssignor,
    FakeClient,
    FakeListener,
    assignment,
    commit_answer,
    eventually,
    heartbeat,
    join_error,
    join_ok,
    owned_in,
    sync_error,
    sync_ok,
    tps,
)

TP = tuple[str, int]


@dataclass
class Member:
    membership: GroupMembership
    client: FakeClient
    assignor: FakeAssignor
    listener: FakeListener
    events: list[tuple[Any, ...]]
    fatal: list[BaseException] = field(default_factory=list)

    def callbacks(self, *kinds: str) -> list[tuple[Any, ...]]:
        kinds = kinds or ("revoked", "assigned", "lost")
        return [e for e in self.events if e[0] in kinds]

    def joins(self) -> list[Any]:
        return self.client.requests(JoinGroupRequest)


@pytest.fixture
async def make_member() -> AsyncIterator[Callable[..., Member]]:
    started: list[GroupMembership] = []

    def make(
        *,
        partitions: dict[str, int] | None = None,
        start: bool = True,
        **settings: Any,
    ) -> Member:
        events: list[tuple[Any, ...]] = []
        client = FakeClient(events, partitions if partitions is not None else {TOPIC: 4})
        assignor, listener = FakeAssignor(), FakeListener(events)
        options: dict[str, Any] = {
            "group_id": GROUP,
            "heartbeat_interval_ms": 10,
            "session_timeout_ms": 5_000,
            "retry_backoff_ms": 5,
            **settings,
        }
        member: Member
        membership = GroupMembership(
            client,  # type: ignore[arg-type]
            MembershipSettings(**options),
            topics=[TOPIC],
            assignor=assignor,
            listener=listener,
            on_fatal=lambda exc: member.fatal.append(exc),
        )
        member = Member(membership, client, assignor, listener, events)
        if start:
            membership.start()
            started.append(membership)
        return member

    yield make
    for membership in started:
        await membership.stop()


def tasks_ended(member: Member) -> bool:
    """Whether both of the membership's tasks (coordination, heartbeats) have ended."""
    tasks = member.membership._tasks
    return bool(tasks) and all(task.done() for task in tasks)


async def assigned(member: Member, partitions: Iterable[int], *, times: int = 1) -> None:
    """Until the ``times``-th assignment has been applied and owns ``partitions``."""
    await eventually(
        lambda: (
            len(member.callbacks("assigned")) >= times
            and member.membership.owned == tps(*partitions)
        )
    )


# --------------------------------------------------------------------------- joining


async def test_a_dynamic_members_first_join_retries_with_the_member_id_it_was_given(
    make_member: Callable[..., Member],
) -> None:
    m = make_member(start=False)
    m.client.script(JoinGroupRequest, join_error(MEMBER_ID_REQUIRED, "m-given"), join_ok("m-given"))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    m.membership.start()
    await m.membership.wait_assigned()
    await m.membership.stop()
    first, second = m.joins()
    assert first.member_id == "" and first.group_instance_id is None
    assert second.member_id == "m-given"
    assert first.protocol_type == second.protocol_type == "consumer"
    assert [name for name, _ in second.group_protocols] == [COOPERATIVE_PROTOCOL, EAGER_PROTOCOL]
    assert m.membership.member_id == "m-given" and m.membership.generation == 1
    [sync] = m.client.requests(SyncGroupRequest)
    assert (sync.member_id, sync.generation_id, sync.group_assignment) == ("m-given", 1, [])
    assert m.callbacks() == [("assigned", tps(0, 1), tps(0, 1))]
    assert m.client.lookups == 1 and not m.fatal
    # JoinGroup and SyncGroup go over the coordination connection, nothing else does
    groups = {type(r).__name__: g for _n, r, g in m.client.sent}
    assert groups["JoinGroupRequest"] == groups["SyncGroupRequest"] == ConnectionGroup.COORDINATION


async def test_the_leader_assigns_every_member_from_their_decoded_metadata(
    make_member: Callable[..., Member],
) -> None:
    m = make_member(start=False, partitions={}, group_instance_id="i1")
    m.client.unknown = {TOPIC: 4}  # the leader's metadata must learn the topic first
    theirs = ConsumerProtocolMemberMetadata(0, [TOPIC], b'[["t", 3]]')
    ours = m.assignor.metadata([TOPIC], ())
    m.assignor.plan = {"m1": assignment([0, 1]), "m2": assignment([2, 3])}
    m.client.script(
        JoinGroupRequest,
        join_ok(
            "m1", leader="m1", members=[("m1", "i1", ours.encode()), ("m2", "i2", theirs.encode())]
        ),
    )
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    m.membership.start()
    await m.membership.wait_assigned()

    [(topics, members, cooperative)] = m.assignor.assign_calls
    assert topics == {TOPIC: 4} and cooperative is True
    assert members == {"m1": ours, "m2": theirs}
    assert members["m2"].user_data == b'[["t", 3]]'
    assert m.client.added_topics == [TOPIC] and m.client.metadata_updates == 1
    [join] = m.joins()
    assert join.group_instance_id == "i1"
    [sync] = m.client.requests(SyncGroupRequest)
    assert sync.group_instance_id == "i1"
    assert {
        mid: ConsumerProtocolMemberAssignment.decode(a) for mid, a in sync.group_assignment
    } == (m.assignor.plan)
    assert m.membership.leader and m.membership.owned == tps(0, 1)
    assert m.assignor.assignments == [assignment([0, 1])]


async def test_a_follower_applies_what_the_leader_assigned(
    make_member: Callable[..., Member],
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok("m2", leader="m1"))
    m.client.script(SyncGroupRequest, sync_ok([2, 3]))
    await m.membership.wait_assigned()
    assert not m.assignor.assign_calls and not m.membership.leader
    [sync] = m.client.requests(SyncGroupRequest)
    assert sync.group_assignment == []
    assert m.callbacks() == [("assigned", tps(2, 3), tps(2, 3))]
    assert m.assignor.metadata_calls[0] == ([TOPIC], frozenset())


# --------------------------------------------------------------------------- rebalances


async def test_cooperative_heartbeat_rebalance_in_progress_rejoins_keeping_partitions(
    make_member: Callable[..., Member],
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok(generation=1), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await eventually(lambda: m.membership.generation == 2 and len(m.callbacks("assigned")) == 2)
    # nothing revoked or lost: the member processed its partitions throughout
    assert m.callbacks() == [
        ("assigned", tps(0, 1), tps(0, 1)),
        ("assigned", frozenset(), tps(0, 1)),
    ]
    # it told the leader what it owns, so the leader can keep them where they are
    assert m.assignor.metadata_calls[-1][1] == tps(0, 1)
    assert owned_in(m.joins()[1]) == [[TOPIC, 0], [TOPIC, 1]]
    assert m.joins()[1].member_id == "m1"
    assert m.client.count(OffsetCommitRequest) == 0


async def test_right_after_a_rebalance_a_member_hears_of_the_next_one_before_its_interval(
    make_member: Callable[..., Member],
) -> None:
    # KIP-429's second round (or the next worker of a rolling start) comes right after a
    # rebalance; a member that revoked nothing hears of it only from a heartbeat's answer,
    # and at a long interval the whole group would wait for it
    m = make_member(heartbeat_interval_ms=60_000)
    m.client.script(JoinGroupRequest, join_ok(generation=1), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await eventually(lambda: len(m.joins()) == 2)  # not a minute later
    await assigned(m, [0, 1], times=2)
    assert m.callbacks("revoked", "lost") == []


async def test_eager_heartbeat_rebalance_in_progress_revokes_everything_before_rejoining(
    make_member: Callable[..., Member],
) -> None:
    m = make_member(cooperative=False)
    m.client.script(
        JoinGroupRequest,
        join_ok(generation=1, protocol=EAGER_PROTOCOL),
        join_ok(generation=2, protocol=EAGER_PROTOCOL),
    )
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    assert [name for name, _ in m.joins()[0].group_protocols] == [EAGER_PROTOCOL]
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await eventually(lambda: len(m.callbacks("assigned")) == 2)
    relevant = [e for e in m.events if e[0] != "send" or e[1] == "JoinGroupRequest"]
    second_join = [i for i, e in enumerate(relevant) if e == ("send", "JoinGroupRequest")][1]
    assert relevant[second_join - 2 : second_join] == [
        ("revoked", tps(0, 1)),
        ("revoked-done", tps(0, 1)),
    ]
    assert m.callbacks() == [
        ("assigned", tps(0, 1), tps(0, 1)),
        ("revoked", tps(0, 1)),
        ("assigned", tps(0, 1), tps(0, 1)),
    ]
    assert m.assignor.metadata_calls[-1][1] == frozenset()  # it owned nothing when it rejoined


async def test_a_cooperative_assignment_dropping_a_partition_revokes_it_and_rejoins_at_once(
    make_member: Callable[..., Member],
) -> None:
    m = make_member()
    m.client.script(
        JoinGroupRequest, join_ok(generation=1), join_ok(generation=2), join_ok(generation=3)
    )
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0]), sync_ok([0]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await eventually(lambda: len(m.callbacks("assigned")) == 3)
    assert m.callbacks() == [
        ("assigned", tps(0, 1), tps(0, 1)),
        ("revoked", tps(1)),
        ("assigned", frozenset(), tps(0)),
        ("assigned", frozenset(), tps(0)),  # the follow-up rebalance
    ]
    # the follow-up join came right after the revocation, not from a heartbeat
    after = m.events[m.events.index(("revoked-done", tps(1))) :]
    sends = [e[1] for e in after if e[0] == "send"]
    assert sends.index("JoinGroupRequest") < 3, sends
    assert [owned for _t, owned in m.assignor.metadata_calls] == [frozenset(), tps(0, 1), tps(0)]
    assert m.membership.metrics.last is not None and m.membership.metrics.last.generation == 3


async def test_heartbeats_go_on_while_a_revocation_runs(
    make_member: Callable[..., Member],
) -> None:
    m = make_member()
    m.listener.hold_revocations = True
    m.client.script(
        JoinGroupRequest, join_ok(generation=1), join_ok(generation=2), join_ok(generation=3)
    )
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await eventually(lambda: ("revoked", tps(1)) in m.events)
    beats = m.client.count(HeartbeatRequest)
    await eventually(lambda: m.client.count(HeartbeatRequest) >= beats + 4)
    assert ("revoked-done", tps(1)) not in m.events  # held: the revocation still runs
    m.listener.release_revocation.set()
    await eventually(lambda: len(m.callbacks("assigned")) == 2)
    assert m.membership.owned == tps(0)


async def test_a_heartbeat_finds_a_lost_coordinator_again_during_a_slow_revocation(
    make_member: Callable[..., Member],
) -> None:
    """The coordination task is busy revoking; the heartbeat task looks the coordinator up
    itself, so that the member's session does not run out meanwhile."""
    m = make_member()
    m.listener.hold_revocations = True
    m.client.script(JoinGroupRequest, join_ok(generation=1), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await eventually(lambda: ("revoked", tps(1)) in m.events)
    m.client.script(HeartbeatRequest, heartbeat(NOT_COORDINATOR))
    await eventually(lambda: m.client.lookups == 2)
    beats = m.client.count(HeartbeatRequest)
    await eventually(lambda: m.client.count(HeartbeatRequest) >= beats + 2)
    assert ("revoked-done", tps(1)) not in m.events  # held: heartbeating again while it revokes
    assert m.membership.generation == 2 and len(m.joins()) == 2  # no rejoin for the lookup
    m.listener.release_revocation.set()
    await eventually(lambda: ("revoked-done", tps(1)) in m.events)


async def test_sync_group_rebalance_in_progress_joins_again(
    make_member: Callable[..., Member],
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok(generation=1), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_error(REBALANCE_IN_PROGRESS), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    assert [j.member_id for j in m.joins()] == ["", "m1"]
    assert m.membership.generation == 2
    assert m.callbacks() == [("assigned", tps(0, 1), tps(0, 1))]
    assert m.membership.metrics.failed_rebalance_total == 1
    assert m.membership.metrics.rebalance_total == 1 and not m.fatal


@pytest.mark.parametrize(
    "code", [INCONSISTENT_GROUP_PROTOCOL, INVALID_GROUP_ID, GROUP_AUTHORIZATION_FAILED]
)
async def test_a_join_refused_for_good_is_fatal(
    make_member: Callable[..., Member], code: int
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_error(code))
    await eventually(lambda: m.fatal)
    [fatal] = m.fatal
    assert type(fatal) is GroupMembershipError and repr(GROUP) in str(fatal)
    # the coordination task, the only one that joins, has ended
    await eventually(lambda: not m.membership.coordinating)
    assert len(m.joins()) == 1 and m.callbacks() == []


# --------------------------------------------------------------------------- removed from the group


@pytest.mark.parametrize("code", [UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION])
async def test_a_heartbeat_saying_the_member_was_removed_loses_its_partitions_and_rejoins(
    make_member: Callable[..., Member], code: int
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok("m1", generation=1), join_ok("m9", generation=5))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([2]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(code))
    await assigned(m, [2], times=2)
    # lost, never revoked: nothing was committed (the group gave them away already)
    assert m.callbacks() == [
        ("assigned", tps(0, 1), tps(0, 1)),
        ("lost", tps(0, 1)),
        ("assigned", tps(2), tps(2)),
    ]
    assert m.client.count(OffsetCommitRequest) == 0
    second = m.joins()[1]
    # UNKNOWN_MEMBER_ID: the group forgot the member id; ILLEGAL_GENERATION: only the generation
    assert second.member_id == ("" if code == UNKNOWN_MEMBER_ID else "m1")
    assert owned_in(second) == []  # it owns nothing any more
    assert m.membership.metrics.partitions_lost_total == 2
    assert m.membership.metrics.lost.count == 1 and not m.fatal


async def test_a_removed_member_rejoins_only_once_its_lost_partitions_are_given_up(
    make_member: Callable[..., Member],
) -> None:
    """The heartbeat task gives the partitions up; a join meanwhile would hand the listener
    a new assignment while it still drops the old one."""
    m = make_member()
    m.listener.hold_losses = True
    m.client.script(JoinGroupRequest, join_ok("m1", generation=1), join_ok("m2", generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(UNKNOWN_MEMBER_ID))
    await eventually(lambda: ("lost", tps(0, 1)) in m.events)
    assert not m.membership.state.rejoin_needed and len(m.joins()) == 1
    m.listener.release_loss.set()
    await assigned(m, [0, 1], times=2)
    joins = [i for i, e in enumerate(m.events) if e == ("send", "JoinGroupRequest")]
    assert m.events.index(("lost-done", tps(0, 1))) < joins[1]


async def test_a_static_member_told_unknown_keeps_its_member_id_to_learn_whether_it_was_fenced(
    make_member: Callable[..., Member],
) -> None:
    """Heartbeat v0/v1 (all aiokafka sends) carry no group_instance_id, so a broker answers a
    static member that another worker replaced with UNKNOWN_MEMBER_ID, not FENCED_INSTANCE_ID.
    Rejoining with an empty member id would take the instance id back from the newer worker
    (which then does the same: the two fence each other in turn, for ever). Rejoining with
    the old member id makes the broker answer FENCED_INSTANCE_ID."""
    m = make_member(group_instance_id="i1")
    m.client.script(JoinGroupRequest, join_ok("m1"), join_error(FENCED_INSTANCE_ID, "m1"))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(UNKNOWN_MEMBER_ID))
    await eventually(lambda: m.fatal)
    assert [(j.member_id, j.group_instance_id) for j in m.joins()] == [("", "i1"), ("m1", "i1")]
    assert m.callbacks() == [("assigned", tps(0, 1), tps(0, 1)), ("lost", tps(0, 1))]
    [fatal] = m.fatal
    assert isinstance(fatal, FencedInstanceError) and "'i1'" in str(fatal)


async def test_a_static_member_whose_session_expired_joins_again_under_a_new_member_id(
    make_member: Callable[..., Member],
) -> None:
    m = make_member(group_instance_id="i1")
    m.client.script(
        JoinGroupRequest,
        join_ok("m1"),
        join_error(UNKNOWN_MEMBER_ID, "m1"),  # the broker no longer knows the instance id
        join_ok("m2", generation=3),
    )
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(UNKNOWN_MEMBER_ID))
    await assigned(m, [0, 1], times=2)
    assert [j.member_id for j in m.joins()] == ["", "m1", ""]
    assert m.membership.member_id == "m2" and not m.fatal


async def test_fenced_instance_id_from_a_heartbeat_loses_the_partitions_and_is_fatal(
    make_member: Callable[..., Member],
) -> None:
    m = make_member(group_instance_id="i1")
    m.client.script(JoinGroupRequest, join_ok("m1"))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(FENCED_INSTANCE_ID))
    await eventually(lambda: m.fatal)
    [fatal] = m.fatal
    assert isinstance(fatal, FencedInstanceError) and isinstance(fatal, GroupMembershipError)
    assert "'i1'" in str(fatal) and repr(GROUP) in str(fatal)
    assert m.callbacks() == [("assigned", tps(0, 1), tps(0, 1)), ("lost", tps(0, 1))]
    assert m.client.count(OffsetCommitRequest) == 0
    # it stops: both tasks end (no more heartbeats, no rejoin)
    await eventually(lambda: tasks_ended(m))
    assert len(m.joins()) == 1 and len(m.fatal) == 1
    assert not m.membership.state.rejoin_needed


@pytest.mark.parametrize("where", ["JoinGroup", "SyncGroup"])
async def test_fenced_instance_id_while_rejoining_is_fatal_too(
    make_member: Callable[..., Member], where: str
) -> None:
    m = make_member(group_instance_id="i1")
    second_join = join_error(FENCED_INSTANCE_ID, "m1") if where == "JoinGroup" else join_ok("m1")
    m.client.script(JoinGroupRequest, join_ok("m1"), second_join)
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_error(FENCED_INSTANCE_ID))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await eventually(lambda: m.fatal)
    assert [type(e) for e in m.fatal] == [FencedInstanceError]
    assert m.callbacks() == [("assigned", tps(0, 1), tps(0, 1)), ("lost", tps(0, 1))]


# --------------------------------------------------------------------------- the coordinator


@pytest.mark.parametrize("code", [NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE])
async def test_a_join_answered_coordinator_gone_looks_it_up_and_joins_again(
    make_member: Callable[..., Member], code: int
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_error(code), join_ok())
    m.client.script(SyncGroupRequest, sync_ok([0]))
    await assigned(m, [0])
    assert m.client.lookups == 2 and len(m.joins()) == 2
    assert m.events.index(("lookup",), 1) < m.events.index(("send", "JoinGroupRequest"), 2)


async def test_a_join_whose_connection_broke_looks_the_coordinator_up_and_joins_again(
    make_member: Callable[..., Member],
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, KafkaConnectionError("reset by peer"), join_ok())
    m.client.script(SyncGroupRequest, sync_error(NOT_COORDINATOR), sync_ok([0]))
    # the sync failing sends it back to JoinGroup
    m.client.script(JoinGroupRequest, join_ok(generation=2))
    await assigned(m, [0])
    assert m.client.lookups == 3 and len(m.joins()) == 3


@pytest.mark.parametrize("code", [NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE])
async def test_a_heartbeat_answered_coordinator_gone_looks_it_up_and_heartbeats_on(
    make_member: Callable[..., Member], code: int
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok())
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(HeartbeatRequest, heartbeat(code))
    await eventually(lambda: m.client.lookups == 2)
    beats = m.client.count(HeartbeatRequest)
    await eventually(lambda: m.client.count(HeartbeatRequest) >= beats + 3)
    # the member is still in the group, at its generation: no rejoin, nothing revoked or lost
    assert len(m.joins()) == 1
    assert m.callbacks() == [("assigned", tps(0, 1), tps(0, 1))]
    assert m.membership.generation == 1


@pytest.mark.parametrize("code", [NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE])
async def test_a_commit_answered_coordinator_gone_fails_and_looks_the_coordinator_up(
    make_member: Callable[..., Member], code: int
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok())
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(OffsetCommitRequest, commit_answer(code))
    assert await m.membership.offsets.commit({(TOPIC, 0): 10}) is False
    await eventually(lambda: m.client.lookups == 2)
    assert await m.membership.offsets.commit({(TOPIC, 0): 10}) is True
    beats = m.client.count(HeartbeatRequest)
    await eventually(lambda: m.client.count(HeartbeatRequest) >= beats + 2)
    assert len(m.joins()) == 1 and m.membership.generation == 1
    [_, commit] = m.client.requests(OffsetCommitRequest)
    assert (commit.consumer_group_generation_id, commit.consumer_id) == (1, "m1")
    assert commit.topics == [(TOPIC, [(0, 10, "")])]


async def test_a_commit_whose_connection_broke_fails_and_looks_the_coordinator_up(
    make_member: Callable[..., Member],
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok())
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(OffsetCommitRequest, KafkaConnectionError("broken pipe"))
    assert await m.membership.offsets.commit({(TOPIC, 1): 3}) is False
    await eventually(lambda: m.client.lookups == 2)
    assert await m.membership.offsets.commit({(TOPIC, 1): 3}) is True


# --------------------------------------------------------------------------- offsets


@pytest.mark.parametrize("code", [ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID])
async def test_a_commit_refused_by_the_group_returns_false_and_rejoins(
    make_member: Callable[..., Member], code: int
) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok(), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(OffsetCommitRequest, commit_answer(code))
    assert await m.membership.offsets.commit({(TOPIC, 0): 5, (TOPIC, 1): 7}) is False
    await assigned(m, [0, 1], times=2)
    assert len(m.joins()) == 2 and m.membership.generation == 2
    assert m.client.lookups == 1


async def test_a_commit_refused_during_a_rebalance_starts_no_other(
    make_member: Callable[..., Member],
) -> None:
    """REBALANCE_IN_PROGRESS on a commit: the group is completing a rebalance the member is
    part of; rejoining once it completes would start another one, whose commits would be
    refused the same way (a cascade of no-op rebalances)."""
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok())
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.client.script(OffsetCommitRequest, commit_answer(REBALANCE_IN_PROGRESS))
    assert await m.membership.offsets.commit({(TOPIC, 0): 5}) is False
    # nothing for the coordination task to do: it waits for a rejoin or a lost coordinator
    assert not m.membership.state.wants_coordination
    assert len(m.joins()) == 1 and m.membership.generation == 1


async def test_a_commit_refused_for_a_generation_the_member_already_left_does_not_rejoin(
    make_member: Callable[..., Member],
) -> None:
    """A commit sent at generation 1 and answered ILLEGAL_GENERATION after the member joined
    generation 2 says nothing about generation 2: no further rebalance."""
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok(generation=1), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1]))
    await assigned(m, [0, 1])
    release = asyncio.Event()

    async def late_refusal(request: Any) -> Any:
        await release.wait()
        return commit_answer(ILLEGAL_GENERATION)(request)

    m.client.script(OffsetCommitRequest, late_refusal)
    commit = asyncio.ensure_future(m.membership.offsets.commit({(TOPIC, 0): 5}))
    await eventually(lambda: m.client.count(OffsetCommitRequest) == 1)
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    await assigned(m, [0, 1], times=2)
    release.set()
    assert await commit is False
    assert not m.membership.state.wants_coordination  # no rejoin due
    assert len(m.joins()) == 2 and m.membership.generation == 2


async def test_commit_without_a_generation_sends_nothing(
    make_member: Callable[..., Member],
) -> None:
    m = make_member(start=False)
    assert await m.membership.offsets.commit({}) is True
    assert await m.membership.offsets.commit({(TOPIC, 0): 1}) is False
    assert m.client.sent == []


# --------------------------------------------------------------------------- probing, metrics


async def test_a_planned_followup_rebalance_rejoins_after_the_probing_interval(
    make_member: Callable[..., Member],
) -> None:
    m = make_member(probing_rebalance_interval=0.08)
    m.client.script(JoinGroupRequest, join_ok(generation=1), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0], b"followup"), sync_ok([0, 1]))
    await assigned(m, [0])
    done = time.monotonic()
    assert m.membership.metrics.last is not None and m.membership.metrics.last.followup
    await eventually(lambda: len(m.joins()) == 2)
    waited = time.monotonic() - done
    assert 0.06 <= waited < 1.0, waited
    await assigned(m, [0, 1], times=2)
    # the follow-up planned no further probe: the member stays put (no timer, no rejoin)
    assert m.membership.metrics.last is not None and not m.membership.metrics.last.followup
    assert m.membership.state.probe_at is None
    assert not m.membership.state.wants_coordination
    assert len(m.joins()) == 2


async def test_metrics_record_a_completed_rebalance(make_member: Callable[..., Member]) -> None:
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok("m1", leader="m1", members=[]))
    m.assignor.plan = {"m1": assignment([0, 1, 2])}
    m.client.script(SyncGroupRequest, sync_ok([0, 1, 2]))
    await assigned(m, [0, 1, 2])
    metrics = m.membership.metrics
    assert metrics.rebalance_total == 1 and metrics.failed_rebalance_total == 0
    assert not metrics.in_progress and metrics.last_rebalance_at is not None
    assert metrics.last is not None
    assert (
        metrics.last.generation,
        metrics.last.protocol,
        metrics.last.assigned,
        metrics.last.revoked,
        metrics.last.owned,
        metrics.last.leader,
        metrics.last.followup,
    ) == (1, "cooperative", 3, 0, 3, True, False)
    assert metrics.assigned.count == 1 and metrics.revoked.count == 0
    snapshot = metrics.snapshot(time.monotonic())
    assert snapshot["rebalance-total"] == 1 and snapshot["rebalance-rate-per-hour"] == 1


async def test_leave_sends_leave_group_for_dynamic_members_only(
    make_member: Callable[..., Member],
) -> None:
    for instance in (None, "i1"):
        m = make_member(group_instance_id=instance)
        m.client.script(JoinGroupRequest, join_ok("m1"))
        m.client.script(SyncGroupRequest, sync_ok([0]))
        await assigned(m, [0])
        await m.membership.stop()
        await m.membership.leave()
        leaves = m.client.requests(LeaveGroupRequest)
        if instance is None:
            assert [(r.group, r.member_id) for r in leaves] == [(GROUP, "m1")]
            assert m.membership.member_id == "" and m.membership.generation == -1
        else:
            assert leaves == []  # a static member keeps its partitions for its restart


async def test_a_heartbeat_answered_during_a_join_is_not_taken_for_a_removal(
    make_member: Callable[..., Member],
) -> None:
    """A commit's membership check can heartbeat while our own JoinGroup is in flight; the
    broker may already be at the next generation and answer ILLEGAL_GENERATION. Taking
    that for a removal lost the partitions (and replayed them) in a clean rebalance."""
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok())
    m.client.script(SyncGroupRequest, sync_ok([0, 1]))
    await assigned(m, [0, 1])
    m.membership.request_rejoin("test")  # the next JoinGroup has no script: it is held
    await eventually(lambda: len(m.joins()) == 2)
    m.client.script(HeartbeatRequest, heartbeat(ILLEGAL_GENERATION))
    assert await m.membership.heartbeat() is False  # no commit now
    assert not [e for e in m.listener.events if e[0] == "lost"]
    assert m.membership.owned == {(TOPIC, 0), (TOPIC, 1)}


async def test_a_stopping_member_joins_no_rebalance_and_commits_at_its_generation(
    make_member: Callable[..., Member],
) -> None:
    """A full stop: the first worker to leave starts a rebalance. The others, stopping too,
    must not join it (each join used to add an assignment, and hand a stopping worker the
    partitions of those gone before it); the group accepts their commit at their generation
    while it waits for them to leave."""
    m = make_member()
    m.client.script(JoinGroupRequest, join_ok(generation=1), join_ok(generation=2))
    m.client.script(SyncGroupRequest, sync_ok([0, 1]), sync_ok([0, 1, 2, 3]))
    await assigned(m, [0, 1])
    m.membership.stop_joining()
    m.client.script(HeartbeatRequest, heartbeat(REBALANCE_IN_PROGRESS))
    # a rejoin is due, and the coordination task ends rather than join
    await eventually(lambda: not m.membership.coordinating)
    assert m.membership.state.rejoin_needed and not m.fatal
    await m.membership.settle(1.0)  # nothing under way: returns at once
    m.client.script(OffsetCommitRequest, commit_answer(0))
    assert await m.membership.offsets.commit({(TOPIC, 0): 5, (TOPIC, 1): 7}) is True
    assert len(m.joins()) == 1
    assert m.membership.generation == 1 and m.membership.owned == tps(0, 1)
    assert m.client.requests(OffsetCommitRequest)[-1].consumer_group_generation_id == 1
