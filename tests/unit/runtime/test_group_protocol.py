"""The group protocol's decisions (runtime/group/protocol.py), input by input: no client,
no event loop, no clock. Each table row is one answer of the group coordinator to a member
in a known state, and what the member must do and become."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from streamjoin.errors import FencedInstanceError, GroupMembershipError
from streamjoin.runtime.group.membership import COOPERATIVE_PROTOCOL, EAGER_PROTOCOL
from streamjoin.runtime.group.protocol import GroupProtocol, Step, code_name
from tests.unit.runtime.group_support import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP,
    GROUP_AUTHORIZATION_FAILED,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    tps,
)

COORDINATOR_GONE = [NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS]
FATAL = [
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    GROUP_AUTHORIZATION_FAILED,
    GROUP_MAX_SIZE_REACHED,
    INVALID_SESSION_TIMEOUT,
]
UNNAMED = 99  # an error code the protocol does not name


def fresh(*, static: bool = False, cooperative: bool = True) -> GroupProtocol:
    state = GroupProtocol(
        group_id=GROUP,
        group_instance_id="i1" if static else None,
        cooperative=cooperative,
        eager_protocol=EAGER_PROTOCOL,
        now=0.0,
    )
    state.coordinator_found(1)
    return state


def member(
    *,
    owned: frozenset[tuple[str, int]] = tps(0, 1),
    generation: int = 1,
    static: bool = False,
    cooperative: bool = True,
    protocol: str = COOPERATIVE_PROTOCOL,
) -> GroupProtocol:
    """A member in the group at ``generation``, owning ``owned``, no rejoin due."""
    state = fresh(static=static, cooperative=cooperative)
    assert state.begin_rebalance().lost == frozenset()
    state.sending_join()
    decision = state.join_answered(
        NONE, member_id="m1", generation=generation, protocol=protocol, leader_id="m0"
    )
    assert decision.step is Step.PROCEED
    assert state.sync_answered(NONE).step is Step.PROCEED
    changes = state.assignment_received(owned)
    assert changes.added == owned and not changes.revoked
    state.take_assignment(owned)
    assert not state.assignment_applied(
        revoked_any=False, followup=False, now=1.0, probing_interval=60.0
    )
    state.end_rebalance()
    assert not state.rejoin_needed and not state.rebalancing
    return state


# --------------------------------------------------------------------------- JoinGroup


@dataclass(frozen=True)
class Row:
    """An answer, and what the member must do and become."""

    code: int
    step: Step
    lost: bool = False
    member_id: str = "m1"
    generation: int = 1
    coordinator_known: bool = True
    error: type[BaseException] | None = None
    warning: bool = False


def rejoining(*, static: bool = False) -> GroupProtocol:
    """A cooperative member with partitions 0 and 1, rejoining: its JoinGroup is out."""
    state = member(static=static)
    assert state.request_rejoin()
    start = state.begin_rebalance()
    assert not start.lost and not start.revoke  # cooperative: it keeps processing them
    state.sending_join()
    state.request_sent()
    state.request_done()
    return state


JOIN_ROWS = [
    Row(MEMBER_ID_REQUIRED, Step.JOIN_AGAIN, member_id="given"),
    Row(UNKNOWN_MEMBER_ID, Step.JOIN_AGAIN, lost=True, member_id="", generation=-1),
    Row(REBALANCE_IN_PROGRESS, Step.REJOIN),
    Row(UNNAMED, Step.REJOIN, warning=True),
    Row(FENCED_INSTANCE_ID, Step.FATAL, lost=True, generation=-1, error=FencedInstanceError),
    *(Row(c, Step.FIND_COORDINATOR, coordinator_known=False) for c in COORDINATOR_GONE),
    *(Row(c, Step.FATAL, error=GroupMembershipError) for c in FATAL),
]


@pytest.mark.parametrize("row", JOIN_ROWS, ids=lambda r: code_name(r.code))
def test_join_group_answers(row: Row) -> None:
    state = rejoining()
    decision = state.join_answered(
        row.code, member_id="given", generation=-1, protocol="", leader_id=""
    )
    assert decision.step is row.step
    assert decision.lost == (tps(0, 1) if row.lost else frozenset())
    assert state.owned == (frozenset() if row.lost else tps(0, 1))
    assert (state.member_id, state.generation) == (row.member_id, row.generation)
    assert (state.coordinator is not None) == row.coordinator_known
    assert (decision.warning is not None) == row.warning
    if row.error is None:
        assert decision.error is None
    else:
        assert type(decision.error) is row.error and repr(GROUP) in str(decision.error)
    if row.step in (Step.REJOIN, Step.FIND_COORDINATOR, Step.FATAL):
        assert state.rejoin_needed  # the join did not complete: a rejoin stays due


def test_a_join_answered_none_takes_the_groups_generation_protocol_and_leadership() -> None:
    state = rejoining()
    decision = state.join_answered(
        NONE, member_id="m1", generation=7, protocol=EAGER_PROTOCOL, leader_id="m1"
    )
    assert decision.step is Step.PROCEED and not decision.lost
    assert (state.generation, state.protocol, state.leader) == (7, EAGER_PROTOCOL, True)
    assert state.eager_group and not state.rejoin_needed


def test_a_fenced_error_names_the_instance_id() -> None:
    state = member(static=True)
    decision = state.join_answered(
        FENCED_INSTANCE_ID, member_id="m1", generation=-1, protocol="", leader_id=""
    )
    assert decision.error is not None and "'i1'" in str(decision.error)
    assert decision.lost_reason == "fenced by another worker with the same instance id"


# --------------------------------------------------------------------------- SyncGroup


SYNC_ROWS = [
    Row(NONE, Step.PROCEED),
    Row(ILLEGAL_GENERATION, Step.REJOIN, lost=True, generation=-1),
    Row(UNKNOWN_MEMBER_ID, Step.REJOIN, lost=True, member_id="", generation=-1),
    Row(REBALANCE_IN_PROGRESS, Step.REJOIN),
    Row(UNNAMED, Step.REJOIN, warning=True),
    Row(FENCED_INSTANCE_ID, Step.FATAL, lost=True, generation=-1, error=FencedInstanceError),
    *(Row(c, Step.FIND_COORDINATOR, coordinator_known=False) for c in COORDINATOR_GONE),
    *(Row(c, Step.FATAL, error=GroupMembershipError) for c in FATAL),
]


@pytest.mark.parametrize("row", SYNC_ROWS, ids=lambda r: code_name(r.code))
def test_sync_group_answers(row: Row) -> None:
    state = rejoining()
    state.join_answered(NONE, member_id="m1", generation=1, protocol="", leader_id="m0")
    decision = state.sync_answered(row.code)
    assert decision.step is row.step
    assert decision.lost == (tps(0, 1) if row.lost else frozenset())
    assert (state.member_id, state.generation) == (row.member_id, row.generation)
    assert (state.coordinator is not None) == row.coordinator_known
    assert (decision.warning is not None) == row.warning
    assert (type(decision.error) if decision.error else None) is row.error
    assert state.rejoin_needed == (row.step is not Step.PROCEED)


def test_a_static_member_told_unknown_member_id_keeps_its_member_id() -> None:
    """Heartbeat v0/v1 and SyncGroup answers about a static member replaced by another
    worker say UNKNOWN_MEMBER_ID: rejoining with the old member id lets the broker answer
    FENCED_INSTANCE_ID (rejoining without one would take the instance id back)."""
    state = member(static=True)
    assert state.heartbeat_answered(UNKNOWN_MEMBER_ID, sent_at_generation=1, now=2.0).lost
    assert state.member_id == "m1" and state.generation == -1
    state = rejoining(static=True)
    state.join_answered(NONE, member_id="m1", generation=1, protocol="", leader_id="m0")
    state.sync_answered(UNKNOWN_MEMBER_ID)
    assert state.member_id == "m1"


# --------------------------------------------------------------------------- Heartbeat


@dataclass(frozen=True)
class BeatRow:
    code: int
    step: Step
    lost: bool = False
    member_id: str = "m1"
    generation: int = 1
    coordinator_known: bool = True
    rejoin: bool = False
    error: type[BaseException] | None = None
    warning: bool = False


HEARTBEAT_ROWS = [
    BeatRow(NONE, Step.PROCEED),
    BeatRow(REBALANCE_IN_PROGRESS, Step.PROCEED, rejoin=True),
    # removed: lost, and a rejoin only once the shell has given them up
    BeatRow(ILLEGAL_GENERATION, Step.REJOIN, lost=True, generation=-1, warning=True),
    BeatRow(UNKNOWN_MEMBER_ID, Step.REJOIN, lost=True, member_id="", generation=-1, warning=True),
    BeatRow(FENCED_INSTANCE_ID, Step.FATAL, lost=True, generation=-1, error=FencedInstanceError),
    BeatRow(UNNAMED, Step.IGNORE, warning=True),
    # the member is still in the group at its generation: no rejoin, nothing lost
    *(BeatRow(c, Step.FIND_COORDINATOR, coordinator_known=False) for c in COORDINATOR_GONE),
    *(BeatRow(c, Step.FATAL, error=GroupMembershipError) for c in FATAL),
]


@pytest.mark.parametrize("row", HEARTBEAT_ROWS, ids=lambda r: code_name(r.code))
def test_heartbeat_answers(row: BeatRow) -> None:
    state = member()
    assert state.heartbeat_generation() == 1
    decision = state.heartbeat_answered(row.code, sent_at_generation=1, now=5.0)
    assert decision.step is row.step
    assert decision.lost == (tps(0, 1) if row.lost else frozenset())
    assert (state.member_id, state.generation) == (row.member_id, row.generation)
    assert (state.coordinator is not None) == row.coordinator_known
    assert state.rejoin_needed == row.rejoin
    assert decision.rebalance_started == (row.code == REBALANCE_IN_PROGRESS)
    assert (decision.warning is not None) == row.warning
    assert (type(decision.error) if decision.error else None) is row.error
    in_good_standing = row.code in (NONE, REBALANCE_IN_PROGRESS)
    assert state.last_heartbeat_ok == (5.0 if in_good_standing else 0.0)


def test_a_second_rebalance_in_progress_answer_starts_no_second_rebalance() -> None:
    state = member()
    assert state.heartbeat_answered(REBALANCE_IN_PROGRESS, sent_at_generation=1, now=2.0)
    again = state.heartbeat_answered(REBALANCE_IN_PROGRESS, sent_at_generation=1, now=3.0)
    assert again.step is Step.PROCEED and not again.rebalance_started


@pytest.mark.parametrize("code", [ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID])
def test_an_answer_about_an_earlier_generation_or_during_a_join_is_ignored(code: int) -> None:
    """A commit's membership check can heartbeat while our own JoinGroup is in flight; the
    broker may already be at the next generation and answer ILLEGAL_GENERATION. Taking that
    for a removal lost the partitions (and replayed them) in a clean rebalance."""
    state = member(generation=2)
    stale = state.heartbeat_answered(code, sent_at_generation=1, now=2.0)
    assert stale.step is Step.IGNORE and not stale.lost and state.owned == tps(0, 1)
    state.request_sent()  # a JoinGroup is in flight
    assert state.heartbeat_generation() is None and not state.in_good_standing
    during = state.heartbeat_answered(code, sent_at_generation=2, now=2.0)
    assert during.step is Step.IGNORE and state.owned == tps(0, 1) and state.generation == 2


def test_no_heartbeat_outside_the_group() -> None:
    assert fresh().heartbeat_generation() is None
    state = member()
    state.left()
    assert state.heartbeat_generation() is None and not state.in_good_standing


def test_a_heartbeat_that_never_arrived_looks_the_coordinator_up() -> None:
    state = member()
    decision = state.heartbeat_failed()
    assert decision.step is Step.FIND_COORDINATOR and state.coordinator is None
    assert state.wants_coordination and not state.rejoin_needed and state.generation == 1


def test_silence_past_the_session_timeout_is_reported_while_partitions_are_owned() -> None:
    state = member()
    assert state.silent_for(10.0, session_timeout=10.0) is None
    assert state.silent_for(10.5, session_timeout=10.0) == 10.5
    state.heartbeat_answered(NONE, sent_at_generation=1, now=10.5)
    assert state.silent_for(11.0, session_timeout=10.0) is None
    assert member(owned=frozenset()).silent_for(99.0, session_timeout=10.0) is None


# --------------------------------------------------------------------------- rebalances


def test_a_cooperative_member_keeps_processing_while_it_rejoins() -> None:
    state = member()
    state.request_rejoin()
    start = state.begin_rebalance()
    assert start.revoke == frozenset() and start.lost == frozenset()
    assert state.rebalancing and state.in_rebalance


@pytest.mark.parametrize(
    ("cooperative", "protocol"),
    [(False, EAGER_PROTOCOL), (True, EAGER_PROTOCOL)],
    ids=["eager member", "group fell back to eager"],
)
def test_an_eager_member_revokes_everything_before_rejoining(
    cooperative: bool, protocol: str
) -> None:
    state = member(cooperative=cooperative, protocol=protocol)
    state.request_rejoin()
    start = state.begin_rebalance()
    assert start.revoke == tps(0, 1) and start.lost == frozenset()
    state.revoked(start.revoke)
    assert state.owned == frozenset()


def test_abandon_gives_everything_up_as_lost_before_the_next_join() -> None:
    state = member(cooperative=False, protocol=EAGER_PROTOCOL)
    assert state.abandon("transaction aborted")
    assert state.rejoin_needed and state.owned == tps(0, 1)  # not before the join
    start = state.begin_rebalance()
    assert start.lost == tps(0, 1) and start.lost_reason == "transaction aborted"
    assert start.revoke == frozenset()  # lost, not revoked: nothing is committed
    assert state.abandon_reason is None and state.owned == frozenset()


def test_the_join_request_clears_the_rejoin_and_a_failure_sets_it_again() -> None:
    state = member()
    state.request_rejoin()
    state.begin_rebalance()
    state.sending_join()
    assert not state.rejoin_needed
    state.join_failed()
    state.end_rebalance()
    assert state.rejoin_needed and state.rebalancing and not state.in_rebalance


@pytest.mark.parametrize("cooperative", [True, False])
def test_an_assignment_dropping_a_partition_revokes_it_then_rejoins_if_cooperative(
    cooperative: bool,
) -> None:
    protocol = COOPERATIVE_PROTOCOL if cooperative else EAGER_PROTOCOL
    state = member(cooperative=cooperative, protocol=protocol)
    state.request_rejoin()
    state.begin_rebalance()
    state.sending_join()
    state.join_answered(NONE, member_id="m1", generation=2, protocol=protocol, leader_id="m0")
    changes = state.assignment_received(tps(0, 2))
    assert (changes.revoked, changes.added) == (tps(1), tps(2))
    state.revoked(changes.revoked)
    assert state.owned == tps(0)
    assert state.take_assignment(tps(0, 2)) == tps(0, 2)
    rejoin = state.assignment_applied(
        revoked_any=True, followup=False, now=5.0, probing_interval=60.0
    )
    # KIP-429: what was revoked goes to its new owner in a follow-up rebalance, at once
    assert rejoin is cooperative and state.rejoin_needed is cooperative


def test_a_planned_probing_rebalance_rejoins_when_its_timer_expires() -> None:
    state = member()
    state.request_rejoin()
    state.begin_rebalance()
    state.sending_join()
    state.assignment_applied(revoked_any=False, followup=True, now=5.0, probing_interval=60.0)
    state.end_rebalance()
    assert state.probe_at == 65.0 and not state.wants_coordination
    assert state.probe_timer_expired()
    assert state.rejoin_needed and state.probe_at is None
    # the follow-up plans no further probe: nothing is due afterwards
    state.begin_rebalance()
    state.sending_join()
    state.assignment_applied(revoked_any=False, followup=False, now=70.0, probing_interval=60.0)
    state.end_rebalance()
    assert state.probe_at is None and not state.wants_coordination


def test_a_stopping_member_joins_no_rebalance() -> None:
    state = member()
    state.stop_joining()
    state.heartbeat_answered(REBALANCE_IN_PROGRESS, sent_at_generation=1, now=2.0)
    assert state.rejoin_needed and not state.should_join()
    # the group still accepts its commit at its generation while it waits for it
    assert state.in_good_standing and state.generation == 1


def test_only_one_rejoin_request_is_reported() -> None:
    state = member()
    assert state.request_rejoin() and not state.request_rejoin()
    assert not state.abandon("again")  # already rejoining, but the abandon is recorded
    assert state.abandon_reason == "again"


def test_a_lost_coordinator_wakes_the_coordination_without_a_rejoin() -> None:
    state = member()
    assert not state.wants_coordination
    state.coordinator_lost()
    assert state.wants_coordination and not state.rejoin_needed and state.in_good_standing
