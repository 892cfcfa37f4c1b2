"""The classic group protocol's decisions, as a pure state machine (no I/O, no clock).

Everything that decides how this member takes part in the group lives here: what it
remembers (member id, generation, the protocol the group chose, what it owns, whether a
rejoin is due, the coordinator's node, the planned probing rebalance) and what each
answer of the group coordinator means. The asyncio shell
(:mod:`streamjoin.runtime.group.membership`) sends the requests, calls the rebalance
listener, sleeps and feeds what happened back in: answers (as error codes), broken
connections, the probing timer's expiry, requests to rejoin, leave or abandon, with the
current time. What it gets back is a :class:`Decision`: partitions to give up first
(without a commit), then one :class:`Step`.

Errors are handled as the Java consumer's ``AbstractCoordinator`` does:

* REBALANCE_IN_PROGRESS: rejoin (a heartbeat keeps the partitions meanwhile);
* UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION: this member was removed from the group, so its
  partitions are *lost* (no commit, no flush) and it rejoins. A dynamic member told
  UNKNOWN_MEMBER_ID forgets its member id; a static one keeps it (see
  :meth:`GroupProtocol.forget_member_id`);
* NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS: look the
  coordinator up again, without a rejoin when the member is still in the group;
* FENCED_INSTANCE_ID: another worker has this worker's instance id: lose everything, stop;
* the codes of :data:`FATAL`: retrying cannot help: stop.

The shell keeps everything about time and tasks: this module never awaits, sleeps or reads a
clock (``now`` is passed in), so each decision is tested as a table of inputs and answers.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from streamjoin.assignor.cooperative import PartitionChanges, partition_changes
from streamjoin.errors import FencedInstanceError, GroupMembershipError

__all__ = [
    "COORDINATOR_GONE",
    "FATAL",
    "MEMBER_GONE",
    "Decision",
    "GroupErrorCode",
    "GroupProtocol",
    "RebalanceStart",
    "Step",
    "code_name",
    "code_of",
]

TP = tuple[str, int]


class GroupErrorCode(enum.IntEnum):
    """Kafka error codes the group protocol answers with (numbers from ``Errors.java``)."""

    NONE = 0
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    GROUP_AUTHORIZATION_FAILED = 30
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82


Code = GroupErrorCode

#: the coordinator moved, is starting, or cannot be reached: look it up again
COORDINATOR_GONE = frozenset(
    {Code.COORDINATOR_NOT_AVAILABLE, Code.NOT_COORDINATOR, Code.COORDINATOR_LOAD_IN_PROGRESS}
)
#: the group no longer has this member at this generation
MEMBER_GONE = frozenset({Code.UNKNOWN_MEMBER_ID, Code.ILLEGAL_GENERATION})
#: answers retrying cannot fix, and why
FATAL = {
    Code.INCONSISTENT_GROUP_PROTOCOL: "the group is used by consumers of another protocol "
    "type or assignor (another application with the same id?)",
    Code.GROUP_MAX_SIZE_REACHED: "the group has reached the broker's group.max.size",
    Code.GROUP_AUTHORIZATION_FAILED: "not authorized to join the group",
    Code.INVALID_GROUP_ID: "the broker does not accept this group id",
    Code.INVALID_SESSION_TIMEOUT: "session_timeout_ms is outside the broker's "
    "group.min.session.timeout.ms..group.max.session.timeout.ms",
}


def code_of(value: int) -> GroupErrorCode | int:
    """The named code for ``value``, or ``value`` itself when this module does not name it."""
    try:
        return GroupErrorCode(value)
    except ValueError:
        return value


def code_name(code: int) -> str:
    """``"ILLEGAL_GENERATION"`` for 22; ``"error code N"`` for a code not named here."""
    named = code_of(code)
    return named.name if isinstance(named, GroupErrorCode) else f"error code {code}"


class Step(enum.Enum):
    """What the shell does after an answer (after giving up :attr:`Decision.lost`)."""

    #: the request did what it was for: go on (sync after a join, apply after a sync)
    PROCEED = "proceed"
    #: send JoinGroup again at once (with the member id the state now holds)
    JOIN_AGAIN = "join again"
    #: this member must join again: give up :attr:`Decision.lost`, back off, rejoin (a
    #: join or sync marked the rejoin due; after a heartbeat the shell requests it with
    #: :meth:`GroupProtocol.request_rejoin` once the lost partitions are given up)
    REJOIN = "rejoin after backoff"
    #: the coordinator moved or is unreachable: look it up again (it is forgotten)
    FIND_COORDINATOR = "find the coordinator"
    #: nothing to do (an answer about an earlier generation, an unexpected error)
    IGNORE = "ignore"
    #: the group will not have this member: stop with :attr:`Decision.error`
    FATAL = "fatal"


@dataclass(frozen=True)
class Decision:
    """The state machine's answer to one input."""

    step: Step
    #: give these up first, without a commit (the group gave them away already)
    lost: frozenset[TP] = frozenset()
    #: why :attr:`lost` were lost (for the log)
    lost_reason: str = ""
    #: for :attr:`Step.FATAL`
    error: GroupMembershipError | None = None
    #: an unexpected answer the shell logs as a warning
    warning: str | None = None
    #: a heartbeat heard that the group started a rebalance (metrics count it from here)
    rebalance_started: bool = False


@dataclass(frozen=True)
class RebalanceStart:
    """What a member gives up before it sends JoinGroup."""

    #: everything owned, given up without a commit (an exactly-once transaction aborted)
    lost: frozenset[TP]
    lost_reason: str
    #: everything owned, revoked with a commit (an eager group: nothing is processed until
    #: the new assignment arrives)
    revoke: frozenset[TP]


class GroupProtocol:
    """One member's view of the group and the rules for changing it.

    Every input is a method; the state is read through attributes the shell never writes.
    """

    def __init__(
        self,
        *,
        group_id: str,
        group_instance_id: str | None,
        cooperative: bool,
        eager_protocol: str,
        now: float,
    ) -> None:
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        #: whether this member offers the cooperative protocol
        self.cooperative = cooperative
        self._eager_protocol = eager_protocol
        self.member_id = ""
        self.generation = -1
        #: the protocol the group chose at the last join (None: never joined)
        self.protocol: str | None = None
        self.leader = False
        self.owned: frozenset[TP] = frozenset()
        #: the group coordinator's node (None: to be looked up)
        self.coordinator: int | None = None
        #: a join is due (at start, after a removal, a rebalance the group started, ...)
        self.rejoin_needed = True
        #: a JoinGroup or SyncGroup is in flight (the broker may be at the next generation)
        self.joining = False
        #: inside a rebalance: JoinGroup, SyncGroup and applying the assignment
        self.in_rebalance = False
        #: stopping: join no more rebalances
        self.leaving = False
        #: when the planned probing rebalance is due (None: none planned)
        self.probe_at: float | None = None
        #: when a heartbeat last reached the coordinator in good standing
        self.last_heartbeat_ok = now
        #: a reason to give everything owned up before the next join (exactly-once abort)
        self.abandon_reason: str | None = None

    # ------------------------------------------------------------------ reading the state

    @property
    def in_good_standing(self) -> bool:
        """In the group at a generation, and not joining: a commit carries a generation the
        group still accepts (short of a removal the member has not heard of yet)."""
        return self.generation >= 0 and bool(self.member_id) and not self.joining

    @property
    def rebalancing(self) -> bool:
        """The group's assignment is in flux: joining, syncing, applying, or a rejoin due."""
        return self.in_rebalance or self.rejoin_needed or self.generation < 0

    @property
    def eager_group(self) -> bool:
        """Whether the group speaks the eager protocol (or this member offers only it)."""
        return self.protocol == self._eager_protocol or not self.cooperative

    @property
    def wants_coordination(self) -> bool:
        """Whether the coordination task has something to do (else it waits for a change or
        the probing timer)."""
        return self.rejoin_needed or self.coordinator is None

    def heartbeat_generation(self) -> int | None:
        """The generation to send a heartbeat at; None when none may be sent: not in the
        group, or a JoinGroup in flight (the broker may already be at the next generation,
        and an ILLEGAL_GENERATION would then be about our own join, not a removal)."""
        if self.generation < 0 or not self.member_id or self.joining:
            return None
        return self.generation

    def silent_for(self, now: float, session_timeout: float) -> float | None:
        """Seconds since the last good heartbeat if that is past the session timeout while
        partitions are owned (the group has probably given them away), else None."""
        silent = now - self.last_heartbeat_ok
        return silent if silent > session_timeout and self.owned else None

    # ------------------------------------------------------------------ requests

    def request_rejoin(self) -> bool:
        """Rejoin at once; False if a rejoin was already due."""
        if self.rejoin_needed:
            return False
        self.rejoin_needed = True
        return True

    def probe_timer_expired(self) -> bool:
        """The planned probing rebalance is due: rejoin (False if one already was)."""
        self.probe_at = None
        return self.request_rejoin()

    def stop_joining(self) -> None:
        """The worker is stopping: join no more rebalances (one under way completes)."""
        self.leaving = True

    def abandon(self, reason: str) -> bool:
        """Give everything owned up as lost before the next join, and rejoin."""
        self.abandon_reason = reason
        return self.request_rejoin()

    def left(self) -> None:
        """LeaveGroup was sent: this member is no longer in the group."""
        self.member_id, self.generation = "", -1

    # ------------------------------------------------------------------ the coordinator

    def coordinator_found(self, node: int) -> None:
        self.coordinator = node

    def coordinator_lost(self) -> None:
        """The coordinator moved or cannot be reached: look it up (no rejoin by itself)."""
        self.coordinator = None

    # ------------------------------------------------------------------ a rebalance

    def should_join(self) -> bool:
        """Whether the coordination task joins now (a rejoin is due and the worker is not
        stopping); call with the coordinator known."""
        return self.rejoin_needed and not self.leaving

    def begin_rebalance(self) -> RebalanceStart:
        """The coordination task starts a rebalance: what to give up before JoinGroup."""
        self.in_rebalance = True
        lost: frozenset[TP] = frozenset()
        reason = ""
        if self.abandon_reason is not None:
            reason, self.abandon_reason = self.abandon_reason, None
            lost, self.owned = self.owned, frozenset()
        revoke = self.owned if self.eager_group else frozenset()
        return RebalanceStart(lost=lost, lost_reason=reason, revoke=revoke)

    def sending_join(self) -> None:
        """Everything to give up before joining is given up: JoinGroup goes out now."""
        self.rejoin_needed = False

    def end_rebalance(self) -> None:
        """The rebalance completed or failed (a failure leaves a rejoin due)."""
        self.in_rebalance = False

    def join_failed(self) -> None:
        """The join did not complete (an exception, a refusal): join again later."""
        self.rejoin_needed = True

    def request_sent(self) -> None:
        """A JoinGroup or SyncGroup is in flight."""
        self.joining = True

    def request_done(self) -> None:
        """The JoinGroup or SyncGroup in flight returned (answered or failed)."""
        self.joining = False

    def join_answered(
        self, code: int, *, member_id: str, generation: int, protocol: str, leader_id: str
    ) -> Decision:
        """A JoinGroup answer. PROCEED: joined (:attr:`leader` says whether to assign)."""
        named = code_of(code)
        if named == Code.NONE:
            self.member_id = member_id
            self.generation = generation
            self.protocol = protocol
            self.leader = leader_id == member_id
            return Decision(Step.PROCEED)
        if named == Code.MEMBER_ID_REQUIRED:
            self.member_id = member_id  # a dynamic member's first join: again, with this id
            return Decision(Step.JOIN_AGAIN)
        if named == Code.UNKNOWN_MEMBER_ID:
            lost = self._lose_all()
            self.member_id = ""
            return Decision(
                Step.JOIN_AGAIN,
                lost=lost,
                lost_reason="the group no longer knows this member id",
            )
        return self._refused(named, "JoinGroup")

    def sync_answered(self, code: int) -> Decision:
        """A SyncGroup answer. PROCEED: apply the assignment it carries."""
        named = code_of(code)
        if named == Code.NONE:
            return Decision(Step.PROCEED)
        if named in MEMBER_GONE:
            lost = self._lose_all()
            if named == Code.UNKNOWN_MEMBER_ID:
                self.forget_member_id()
            self.rejoin_needed = True
            return Decision(
                Step.REJOIN, lost=lost, lost_reason=f"SyncGroup answered {code_name(code)}"
            )
        return self._refused(named, "SyncGroup")

    def assignment_received(self, assigned: Iterable[TP]) -> PartitionChanges:
        """What an assignment changes: revoke ``revoked`` (then :meth:`revoked`), then take
        the assignment (:meth:`take_assignment`) and start ``added``."""
        return partition_changes(self.owned, assigned)

    def revoked(self, partitions: frozenset[TP]) -> None:
        """The listener revoked ``partitions`` (committed and stopped them)."""
        self.owned = self.owned - partitions

    def take_assignment(self, assigned: Iterable[TP]) -> frozenset[TP]:
        """This member owns ``assigned`` from now on (before the listener starts it)."""
        self.owned = frozenset(assigned)
        return self.owned

    def assignment_applied(
        self, *, revoked_any: bool, followup: bool, now: float, probing_interval: float
    ) -> bool:
        """The assignment is applied. Under the cooperative protocol what was revoked goes to
        its new owner in a follow-up rebalance (KIP-429): rejoin at once. ``followup``: the
        assignor plans a probing rebalance. True when a rejoin was requested here."""
        self.probe_at = now + probing_interval if followup else None
        if self.cooperative and revoked_any:
            return self.request_rejoin()
        return False

    # ------------------------------------------------------------------ heartbeats

    def heartbeat_answered(self, code: int, *, sent_at_generation: int, now: float) -> Decision:
        """A Heartbeat answer. PROCEED: in the group in good standing (a rebalance in
        progress still counts: the member keeps its partitions until it revokes them)."""
        if sent_at_generation != self.generation or self.joining:
            return Decision(Step.IGNORE)  # a join began or completed meanwhile
        named = code_of(code)
        if named == Code.NONE:
            self.last_heartbeat_ok = now
            return Decision(Step.PROCEED)
        if named == Code.REBALANCE_IN_PROGRESS:
            self.last_heartbeat_ok = now
            return Decision(Step.PROCEED, rebalance_started=self.request_rejoin())
        if named in MEMBER_GONE:
            if named == Code.UNKNOWN_MEMBER_ID:
                self.forget_member_id()
            lost = self._lose_all()
            # no rejoin yet: the coordination task must not join while the heartbeat's
            # task gives the partitions up (the shell requests it once they are)
            return Decision(
                Step.REJOIN,
                lost=lost,
                lost_reason=f"heartbeat answered {code_name(code)}",
                warning=f"heartbeat answered {code_name(code)}: this member was removed",
            )
        return self._refused(named, "Heartbeat", rejoin=False)

    def heartbeat_failed(self) -> Decision:
        """The heartbeat never reached the coordinator (connection broken, coordinator not
        known): look it up again."""
        self.coordinator_lost()
        return Decision(Step.FIND_COORDINATOR)

    # ------------------------------------------------------------------ the rules

    def forget_member_id(self) -> None:
        """The group answered UNKNOWN_MEMBER_ID to a heartbeat, SyncGroup or commit.

        A dynamic member joins again as a new member. A static member keeps its member id:
        Heartbeat v0/v1 and OffsetCommit v2/v3 (all aiokafka sends) carry no
        group_instance_id, so the broker answers UNKNOWN_MEMBER_ID, not FENCED_INSTANCE_ID,
        when another worker took over this instance id. Joining with an empty member id
        would take the instance id back from that worker, which would then do the same, for
        ever; joining with the old member id gets FENCED_INSTANCE_ID in that case, and
        UNKNOWN_MEMBER_ID (then a fresh join, see :meth:`join_answered`) if the session
        expired.
        """
        if self.group_instance_id is None:
            self.member_id = ""

    def _lose_all(self) -> frozenset[TP]:
        """Out of the group: no generation, nothing owned; returns what was owned."""
        self.generation = -1
        lost, self.owned = self.owned, frozenset()
        return lost

    def _refused(self, code: GroupErrorCode | int, what: str, *, rejoin: bool = True) -> Decision:
        """The errors every group request handles the same way. ``rejoin``: the request was
        part of a join (JoinGroup, SyncGroup), so any failure leaves a rejoin due."""
        if rejoin:
            self.rejoin_needed = True
        name = code_name(code)
        if code in COORDINATOR_GONE:
            self.coordinator_lost()
            return Decision(Step.FIND_COORDINATOR)
        if code == Code.FENCED_INSTANCE_ID:
            lost = self._lose_all()
            fenced = FencedInstanceError(
                f"another worker joined group {self.group_id!r} with this worker's "
                f"group_instance_id {self.group_instance_id!r}; this one stops"
            )
            return Decision(
                Step.FATAL,
                lost=lost,
                lost_reason="fenced by another worker with the same instance id",
                error=fenced,
            )
        if code in FATAL:
            refused = GroupMembershipError(
                f"cannot join group {self.group_id!r}: {FATAL[Code(code)]} ({name} from {what})"
            )
            return Decision(Step.FATAL, error=refused)
        step = Step.REJOIN if rejoin else Step.IGNORE
        if code == Code.REBALANCE_IN_PROGRESS:
            return Decision(step)
        return Decision(step, warning=f"group {self.group_id}: {what} answered {name}")
