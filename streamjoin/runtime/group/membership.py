"""Our own consumer-group membership: the classic group protocol through aiokafka's client.

aiokafka's consumer rebalances eagerly and stops heartbeating while its
rebalance callbacks run. This service speaks the group protocol itself
(FindCoordinator, JoinGroup v5 with ``group_instance_id``, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit and OffsetFetch with generation and member
id) through :class:`aiokafka.AIOKafkaClient` and its protocol structs, the way
the changelog reader already speaks Fetch. The fetching consumer uses manual
assignment and is told what to fetch by the runtime.

Two protocols, chosen by the group (the broker picks the first protocol every
member supports, so a group stays eager while any member speaks only eager):

* ``streamjoin`` (eager, the protocol of aiokafka-based versions): a member
  revokes everything before it rejoins;
* ``streamjoin-cooperative`` (KIP-429): a member keeps processing while the
  group rebalances; the leader withholds every task whose owner changes
  (:func:`streamjoin.assignor.cooperative.withhold_moves`), the owner revokes it
  when its new assignment arrives and rejoins at once, and the follow-up
  rebalance hands it over.

Heartbeats run in their own task, so they keep going while partitions are
revoked, restored or committed. Errors are handled as the Java consumer's
``AbstractCoordinator`` does: REBALANCE_IN_PROGRESS rejoins; UNKNOWN_MEMBER_ID
and ILLEGAL_GENERATION mean this member was removed from the group, so its
partitions are *lost* (no commit, no flush of their pending writes) and it
rejoins; NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE look the coordinator
up again (without a rejoin when the member is still in the group); FENCED_INSTANCE_ID
(another worker with our instance id) loses the partitions and stops the worker with
:class:`FencedInstanceError`. Heartbeats and commits of the protocol versions aiokafka
speaks carry no instance id, so a replaced static member hears UNKNOWN_MEMBER_ID there: it
keeps its member id and rejoins with it, which the broker answers FENCED_INSTANCE_ID.

JoinGroup and SyncGroup go over aiokafka's coordination connection; heartbeats
and offset commits over a second connection to the coordinator, so a commit is
never queued behind a JoinGroup the broker holds until the rebalance completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka import AIOKafkaClient
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaError
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest
from aiokafka.protocol.group import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    SyncGroupRequest,
)

from streamjoin.assignor.cooperative import partition_changes
from streamjoin.errors import FencedInstanceError, GroupMembershipError, TransactionFailed
from streamjoin.runtime.group.assignor_adapter import ASSIGNOR_NAME, known_partitions
from streamjoin.runtime.group.rebalance_metrics import RebalanceMetrics, RebalanceRecord
from streamjoin.runtime.group.txn_protocol import (
    PRODUCER_FENCED_CODES,
    ErrorCode,
    fetch_committed,
    txn_offset_commit,
)
from streamjoin.runtime.group.txn_protocol import error_name as txn_error_name

if TYPE_CHECKING:
    from streamjoin.runtime.group.transaction import TransactionIds

log = logging.getLogger("streamjoin.membership")

#: how often a wait for offsets held by an open transaction is reported past the first minute
UNSTABLE_WARNING_EVERY = 60.0

__all__ = [
    "COOPERATIVE_PROTOCOL",
    "EAGER_PROTOCOL",
    "GroupAssignor",
    "GroupMembership",
    "MembershipSettings",
    "RebalanceListener",
]

TP = tuple[str, int]

#: the assignor's name in every earlier (eager, aiokafka-based) version: kept for upgrades
EAGER_PROTOCOL = ASSIGNOR_NAME
COOPERATIVE_PROTOCOL = "streamjoin-cooperative"
PROTOCOL_TYPE = "consumer"


class _Code(enum.IntEnum):
    """Kafka error codes the group protocol answers with."""

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
    FENCED_INSTANCE_ID = 82
    GROUP_MAX_SIZE_REACHED = 81


_COORDINATOR_GONE = {
    _Code.COORDINATOR_NOT_AVAILABLE,
    _Code.NOT_COORDINATOR,
    _Code.COORDINATOR_LOAD_IN_PROGRESS,
}
_MEMBER_GONE = {_Code.UNKNOWN_MEMBER_ID, _Code.ILLEGAL_GENERATION}
#: TxnOffsetCommit answers: this member's partitions moved (the commit is a zombie's)
_TXN_MEMBER_GONE = _MEMBER_GONE | {_Code.FENCED_INSTANCE_ID}
#: TxnOffsetCommit answers a retry fixes (within the transaction's lifetime)
_TXN_RETRIABLE = _COORDINATOR_GONE | {
    ErrorCode.CONCURRENT_TRANSACTIONS,
    _Code.REBALANCE_IN_PROGRESS,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
}
_FATAL = {
    _Code.INCONSISTENT_GROUP_PROTOCOL: "the group is used by consumers of another protocol "
    "type or assignor (another application with the same id?)",
    _Code.GROUP_MAX_SIZE_REACHED: "the group has reached the broker's group.max.size",
    _Code.GROUP_AUTHORIZATION_FAILED: "not authorized to join the group",
    _Code.INVALID_GROUP_ID: "the broker does not accept this group id",
    _Code.INVALID_SESSION_TIMEOUT: "session_timeout_ms is outside the broker's "
    "group.min.session.timeout.ms..group.max.session.timeout.ms",
}


def _code(value: int) -> _Code | int:
    try:
        return _Code(value)
    except ValueError:
        return value


class _CoordinatorLost(Exception):
    """Look the coordinator up again (it moved, or its connection broke)."""


class _Rejoin(Exception):
    """Start the join again (the group started another rebalance meanwhile)."""


class RebalanceListener(Protocol):
    """What the runtime does when the assignment changes; nothing slow may run here.

    Heartbeats go on while these run; under the cooperative protocol so does the
    processing of every partition not named.
    """

    async def on_partitions_revoked(self, revoked: frozenset[TP]) -> None:
        """Stop, flush and commit these partitions: another member gets them next."""

    async def on_partitions_assigned(self, added: frozenset[TP], owned: frozenset[TP]) -> None:
        """Start processing ``added``; ``owned`` is everything this member now owns."""

    async def on_partitions_lost(self, lost: frozenset[TP]) -> None:
        """Drop these partitions without a commit: this member was removed from the group."""


class GroupAssignor(Protocol):
    """The assignor adapter as the membership service uses it."""

    followup_rebalance: bool

    def metadata(
        self, topics: Iterable[str], owned: Iterable[TP]
    ) -> ConsumerProtocolMemberMetadata: ...

    def assign_members(
        self,
        topics: Mapping[str, int],
        members: Mapping[str, ConsumerProtocolMemberMetadata],
        *,
        cooperative: bool,
    ) -> dict[str, ConsumerProtocolMemberAssignment]: ...

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None: ...


@dataclass(frozen=True)
class MembershipSettings:
    """How this member takes part in the group (the Java consumer's names, in ms)."""

    group_id: str
    group_instance_id: str | None = None
    cooperative: bool = True
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    rebalance_timeout_ms: int = 60_000
    retry_backoff_ms: int = 100
    #: while the assignor plans warmups, rejoin this often to see whether they caught up
    probing_rebalance_interval: float = 600.0
    #: exactly-once: committed offsets are read "stable" (waiting for open transactions
    #: that commit offsets of the partitions, KIP-447)
    exactly_once: bool = False

    @property
    def protocols(self) -> tuple[str, ...]:
        """What this member offers, most preferred first."""
        if self.cooperative:
            return (COOPERATIVE_PROTOCOL, EAGER_PROTOCOL)
        return (EAGER_PROTOCOL,)


class GroupMembership:
    """One member of the app's consumer group; runs two tasks: coordination and heartbeats."""

    def __init__(
        self,
        client: AIOKafkaClient,
        settings: MembershipSettings,
        *,
        topics: Iterable[str],
        assignor: GroupAssignor,
        listener: RebalanceListener,
        on_fatal: Callable[[BaseException], None],
        metrics: RebalanceMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.settings = settings
        self._topics = sorted(set(topics))
        self._assignor = assignor
        self._listener = listener
        self._on_fatal = on_fatal
        self._clock = clock
        self.member_id = ""
        self.generation = -1
        #: the protocol the group chose at the last join (None: never joined)
        self.protocol: str | None = None
        self.leader = False
        self.owned: frozenset[TP] = frozenset()
        self.metrics = metrics if metrics is not None else RebalanceMetrics()
        self._coordinator: int | None = None
        #: set while the coordinator is not known: wakes the coordination task to look it up
        #: (without a rejoin: the member is still in the group at its generation)
        self._coordinator_unknown = asyncio.Event()
        self._coordinator_unknown.set()
        self._rejoin = asyncio.Event()
        self._rejoin.set()
        self._joining = False
        #: inside a join (JoinGroup, SyncGroup and applying the assignment)
        self._rebalancing = False
        #: stopping: no more joins (see :meth:`stop_joining`)
        self._leaving = False
        self._probe_at: float | None = None
        self._last_heartbeat_ok = clock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._assigned_once = asyncio.Event()
        #: exactly-once: a transaction was aborted, so everything owned must be given up
        #: (as lost) before the next join
        self._abandon: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(self._coordinate), name="streamjoin-group-coordination"),
            loop.create_task(self._run(self._heartbeats), name="streamjoin-group-heartbeats"),
        ]

    async def stop(self) -> None:
        """Stop coordinating (the caller commits afterwards, then calls :meth:`leave`)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    def stop_joining(self) -> None:
        """The worker is stopping: join no more rebalances (a join already under way
        completes, see :meth:`settle`). A rebalance another member started (one leaving in
        the same full stop) waits for this member to rejoin or leave, and meanwhile the group
        still accepts its commit at its generation; joining instead would hand it partitions
        it is about to give up, and add one assignment per stopping worker."""
        self._leaving = True

    async def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for a join under way to complete, so that a
        stopping worker commits at the group's current generation: a commit sent at the
        previous one is refused, and its events would be processed again by the next owner."""
        deadline = self._clock() + timeout
        # polled: the join runs in the coordination task, and this runs once
        while (self._joining or self._rebalancing) and self._clock() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def leave(self) -> None:
        """Leave the group so that it rebalances now; static members stay (their session
        keeps their partitions for a restart with the same instance id)."""
        if self.settings.group_instance_id is not None or not self.member_id:
            return
        coordinator = self._coordinator
        if coordinator is None:
            return
        request = LeaveGroupRequest(self.settings.group_id, self.member_id)
        try:
            await asyncio.wait_for(self._client.send(coordinator, request), timeout=5.0)
        except (KafkaError, asyncio.TimeoutError) as exc:
            log.warning("could not leave group %s cleanly: %r", self.settings.group_id, exc)
        self.member_id, self.generation = "", -1

    async def wait_assigned(self) -> None:
        """Until the first assignment has been applied."""
        await self._assigned_once.wait()

    def request_rejoin(self, reason: str) -> None:
        """Rejoin at once (a probing rebalance, a topic change)."""
        if not self._rejoin.is_set():
            log.info("rejoining group %s: %s", self.settings.group_id, reason)
            self._rejoin.set()

    async def _run(self, loop_body: Callable[[], Awaitable[None]]) -> None:
        try:
            await loop_body()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if not self._stopping:
                self._on_fatal(exc)

    # ------------------------------------------------------------------ coordination

    async def _coordinate(self) -> None:
        backoff = self.settings.retry_backoff_ms / 1000
        while not self._stopping:
            try:
                await self._ensure_coordinator()
                if not self._rejoin.is_set():
                    await self._wait_for_rejoin()
                    continue
                if self._leaving:
                    return
                await self._join_and_sync()
            except _CoordinatorLost as exc:
                log.info("group coordinator unavailable (%s); looking it up again", exc)
                self._forget_coordinator()
                self.metrics.failed(self._clock())
                await asyncio.sleep(backoff)
            except _Rejoin:
                await asyncio.sleep(backoff)
            except KafkaError as exc:
                log.warning("group %s: %r; retrying", self.settings.group_id, exc)
                self._forget_coordinator()
                self.metrics.failed(self._clock())
                await asyncio.sleep(backoff)

    async def _wait_for_rejoin(self) -> None:
        """Until a rejoin is requested, the coordinator is lost (it is looked up again, no
        rejoin) or a planned probing rebalance is due."""
        timeout = None
        if self._probe_at is not None:
            timeout = max(0.0, self._probe_at - self._clock())
        waits = [
            asyncio.ensure_future(self._rejoin.wait()),
            asyncio.ensure_future(self._coordinator_unknown.wait()),
        ]
        try:
            done, _ = await asyncio.wait(
                waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
        if not done:
            self._probe_at = None
            self.request_rejoin("probing rebalance: are the warmup replicas caught up?")

    def _forget_coordinator(self) -> None:
        """The coordinator moved or cannot be reached: the coordination task looks it up."""
        self._coordinator = None
        self._coordinator_unknown.set()

    def _forget_member_id(self) -> None:
        """The group answered UNKNOWN_MEMBER_ID to a heartbeat, SyncGroup or commit.

        A dynamic member joins again as a new member. A static member keeps its member id:
        Heartbeat v0/v1 and OffsetCommit v2/v3 (all aiokafka sends) carry no
        group_instance_id, so the broker answers UNKNOWN_MEMBER_ID, not FENCED_INSTANCE_ID,
        when another worker took over this instance id. Joining with an empty member id
        would take the instance id back from that worker, which would then do the same, for
        ever; joining with the old member id gets FENCED_INSTANCE_ID in that case, and
        UNKNOWN_MEMBER_ID (then a fresh join, see :meth:`_join`) if the session expired.
        """
        if self.settings.group_instance_id is None:
            self.member_id = ""

    async def _ensure_coordinator(self) -> None:
        backoff = self.settings.retry_backoff_ms / 1000
        while self._coordinator is None and not self._stopping:
            try:
                node = await self._client.coordinator_lookup(
                    CoordinationType.GROUP, self.settings.group_id
                )
                ready = await self._client.ready(node, group=ConnectionGroup.COORDINATION)
            except KafkaError as exc:
                log.debug("coordinator lookup failed: %r", exc)
                if not exc.retriable:
                    raise
                await self._client.force_metadata_update()
                await asyncio.sleep(backoff)
                continue
            if ready:
                self._coordinator = node
                self._coordinator_unknown.clear()
                log.debug("group %s: coordinator is node %s", self.settings.group_id, node)
            else:
                await asyncio.sleep(backoff)

    def _require_coordinator(self) -> int:
        if self._coordinator is None:
            raise _CoordinatorLost("not known")
        return self._coordinator

    @property
    def in_good_standing(self) -> bool:
        """In the group at a generation, and not joining: a commit carries a generation the
        group still accepts (short of a removal the member has not heard of yet)."""
        return self.generation >= 0 and bool(self.member_id) and not self._joining

    @property
    def rebalancing(self) -> bool:
        """Joining, syncing or applying an assignment, or about to rejoin (a follow-up
        rebalance is due): the group's assignment is in flux (interactive queries answer
        503 meanwhile)."""
        return self._rebalancing or self._rejoin.is_set() or self.generation < 0

    def abandon(self, reason: str) -> None:
        """Give every owned partition up as lost and rejoin (exactly-once, after an aborted
        transaction: the tasks start again from the committed offsets). Done by the
        coordination task before its next join, so it never races an assignment."""
        self._abandon = reason
        self.request_rejoin(reason)

    async def _join_and_sync(self) -> None:
        self._rebalancing = True
        try:
            await self._join_sync_and_apply()
        finally:
            self._rebalancing = False

    async def _join_sync_and_apply(self) -> None:
        if self._abandon is not None:
            reason, self._abandon = self._abandon, None
            if self.owned:
                lost, self.owned = self.owned, frozenset()
                log.warning("giving up %d partitions (%s)", len(lost), reason)
                await self._listener.on_partitions_lost(lost)
        self.metrics.started(self._clock())
        eager_group = self.protocol == EAGER_PROTOCOL or not self.settings.cooperative
        if eager_group and self.owned:
            # Eager: nothing may be processed past this point until the new assignment.
            await self._revoke(self.owned)
        self._rejoin.clear()
        try:
            joined = await self._join()
            # If the group fell back to eager here (a member that speaks only eager joined)
            # while we still own partitions, we cannot revoke them now: the group is
            # completing its rebalance and would refuse the commit. Our leaders withhold what
            # a member still owns whatever the protocol, so what moves is revoked after
            # SyncGroup as usual.
            assignments: list[tuple[str, bytes]] = []
            if joined.leader_id == joined.member_id:
                assignments = await self._lead(joined)
            assignment = await self._sync(assignments)
        except BaseException:
            # Not joined (coordinator lost, connection broken, ...): join again once the
            # coordinator is found, whatever made this attempt fail.
            self._rejoin.set()
            raise
        await self._apply(assignment)

    async def _join(self) -> Any:
        settings = self.settings
        while True:
            metadata = self._assignor.metadata(self._topics, self.owned).encode()
            request = JoinGroupRequest(
                settings.group_id,
                settings.session_timeout_ms,
                settings.rebalance_timeout_ms,
                self.member_id,
                settings.group_instance_id,
                PROTOCOL_TYPE,
                [(name, metadata) for name in settings.protocols],
            )
            response = await self._send(request, join=True)
            code = _code(response.error_code)
            if code == _Code.NONE:
                self.member_id = response.member_id
                self.generation = response.generation_id
                self.protocol = response.group_protocol
                self.leader = response.leader_id == response.member_id
                return response
            if code == _Code.MEMBER_ID_REQUIRED:
                self.member_id = response.member_id  # a dynamic member's first join: again
                continue
            if code == _Code.UNKNOWN_MEMBER_ID:
                await self._lose_all("the group no longer knows this member id")
                self.member_id = ""
                continue
            await self._check_common(code, "JoinGroup")
            self.metrics.failed(self._clock())
            self._rejoin.set()
            raise _Rejoin()

    async def _lead(self, joined: Any) -> list[tuple[str, bytes]]:
        members = {
            member_id: ConsumerProtocolMemberMetadata.decode(metadata)
            for member_id, _instance, metadata in joined.members
        }
        topics = sorted({t for m in members.values() for t in m.subscription})
        counts = await self._partition_counts(topics)
        result = self._assignor.assign_members(
            counts, members, cooperative=joined.group_protocol == COOPERATIVE_PROTOCOL
        )
        return [(member_id, a.encode()) for member_id, a in result.items()]

    async def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        """Partition counts of the topics the cluster knows (metadata refreshed if needed)."""
        if any(not self._client.cluster.partitions_for_topic(t) for t in topics):
            for topic in topics:
                self._client.add_topic(topic)
            await self._client.force_metadata_update()
        return known_partitions(self._client.cluster, topics)

    async def _sync(self, assignments: list[tuple[str, bytes]]) -> ConsumerProtocolMemberAssignment:
        request = SyncGroupRequest(
            self.settings.group_id,
            self.generation,
            self.member_id,
            self.settings.group_instance_id,
            assignments,
        )
        response = await self._send(request, join=True)
        code = _code(response.error_code)
        if code == _Code.NONE:
            return ConsumerProtocolMemberAssignment.decode(response.member_assignment)
        if code in _MEMBER_GONE:
            await self._lose_all(f"SyncGroup answered {_code_name(code)}")
            if code == _Code.UNKNOWN_MEMBER_ID:
                self._forget_member_id()
        else:
            await self._check_common(code, "SyncGroup")
        self.metrics.failed(self._clock())
        self._rejoin.set()
        raise _Rejoin()

    async def _apply(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self._assignor.on_assignment(assignment)
        assigned = {(t, p) for t, ps in assignment.assignment for p in ps}
        changes = partition_changes(self.owned, assigned)
        cooperative = self.protocol == COOPERATIVE_PROTOCOL
        if changes.revoked:
            await self._revoke(changes.revoked)
        self.owned = frozenset(assigned)
        started = self._clock()
        await self._listener.on_partitions_assigned(changes.added, self.owned)
        self.metrics.assigned.add(self._clock() - started)
        self._assigned_once.set()
        if self.settings.cooperative and changes.revoked:
            # KIP-429: what we gave up goes to its new owner in a follow-up rebalance.
            self.request_rejoin("partitions revoked for their new owner")
        if self._assignor.followup_rebalance:
            self._probe_at = self._clock() + self.settings.probing_rebalance_interval
        else:
            self._probe_at = None
        record = self.metrics.completed(
            self._clock(),
            RebalanceRecord(
                generation=self.generation,
                protocol="cooperative" if cooperative else "eager",
                seconds=0.0,
                assigned=len(changes.added),
                revoked=len(changes.revoked),
                owned=len(self.owned),
                leader=self.leader,
                followup=self._probe_at is not None,
            ),
        )
        log.info(
            "rebalance done: generation %d (%s%s) in %.3fs: %d partitions assigned, %d revoked, "
            "%d owned%s",
            record.generation,
            record.protocol,
            ", leader" if record.leader else "",
            record.seconds,
            record.assigned,
            record.revoked,
            record.owned,
            "; probing rebalance planned for warmups" if record.followup else "",
        )

    async def _revoke(self, tps: Iterable[TP]) -> None:
        revoked = frozenset(tps)
        started = self._clock()
        await self._listener.on_partitions_revoked(revoked)
        self.metrics.revoked.add(self._clock() - started)
        self.owned = self.owned - revoked

    async def _lose_all(self, reason: str) -> None:
        self.generation = -1
        if not self.owned:
            return
        lost, self.owned = self.owned, frozenset()
        log.warning(
            "lost %d partitions (%s): nothing of theirs is committed or flushed; their next "
            "owner replays from the last commit",
            len(lost),
            reason,
        )
        started = self._clock()
        await self._listener.on_partitions_lost(lost)
        self.metrics.lost.add(self._clock() - started)
        self.metrics.partitions_lost_total += len(lost)

    async def _check_common(self, code: _Code | int, what: str) -> None:
        """Raise for errors every group request handles the same way (a fenced member
        loses its partitions first)."""
        if code in _COORDINATOR_GONE:
            raise _CoordinatorLost(f"{what}: {_code_name(code)}")
        if code == _Code.FENCED_INSTANCE_ID:
            await self._lose_all("fenced by another worker with the same instance id")
            raise FencedInstanceError(
                f"another worker joined group {self.settings.group_id!r} with this worker's "
                f"group_instance_id {self.settings.group_instance_id!r}; this one stops"
            )
        if code in _FATAL:
            raise GroupMembershipError(
                f"cannot join group {self.settings.group_id!r}: {_FATAL[_Code(code)]} "
                f"({_code_name(code)} from {what})"
            )
        if code == _Code.REBALANCE_IN_PROGRESS:
            return
        log.warning("group %s: %s answered %s", self.settings.group_id, what, _code_name(code))

    async def _send(self, request: Any, *, join: bool = False) -> Any:
        node = self._require_coordinator()
        group = ConnectionGroup.COORDINATION if join else ConnectionGroup.DEFAULT
        if join:
            self._joining = True
        try:
            return await self._client.send(node, request, group=group)
        except KafkaError as exc:
            if exc.retriable or not join:
                raise _CoordinatorLost(repr(exc)) from exc
            raise
        finally:
            if join:
                self._joining = False

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeats(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        while not self._stopping:
            await asyncio.sleep(interval)
            if self.generation < 0 or self._joining:
                continue
            if self._coordinator is None:
                # Look it up here too: the coordination task may be busy in a slow
                # revocation, and this member's session must not run out meanwhile.
                await self._ensure_coordinator()
                continue
            await self.heartbeat()
            silent = self._clock() - self._last_heartbeat_ok
            if silent > self.settings.session_timeout_ms / 1000 and self.owned:
                log.warning(
                    "no heartbeat reached the group coordinator for %.0fs (session timeout "
                    "%.0fs): the group has probably given this member's partitions away",
                    silent,
                    self.settings.session_timeout_ms / 1000,
                )

    async def heartbeat(self) -> bool:
        """Send one heartbeat now; True while this member is in the group in good standing
        (a rebalance in progress still counts: the member keeps its partitions until it
        revokes them itself)."""
        generation = self.generation
        if generation < 0 or not self.member_id or self._joining:
            # While a JoinGroup is in flight the broker may already be at the next
            # generation: an ILLEGAL_GENERATION then would be about our own join, not a
            # removal. Not in good standing for a commit either: the next one retries.
            return False
        request = HeartbeatRequest(self.settings.group_id, generation, self.member_id)
        try:
            response = await self._send(request)
        except _CoordinatorLost as exc:
            log.debug("heartbeat failed: %s", exc)
            self._forget_coordinator()
            return False
        if generation != self.generation or self._joining:
            return False  # a join began or completed meanwhile: the answer is about the old one
        code = _code(response.error_code)
        if code == _Code.NONE:
            self._last_heartbeat_ok = self._clock()
            return True
        if code == _Code.REBALANCE_IN_PROGRESS:
            self._last_heartbeat_ok = self._clock()
            if not self._rejoin.is_set():
                self.metrics.started(self._clock())
                self._rejoin.set()
            return True
        if code in _MEMBER_GONE:
            log.warning("heartbeat answered %s: this member was removed", _code_name(code))
            if code == _Code.UNKNOWN_MEMBER_ID:
                self._forget_member_id()
            await self._lose_all(f"heartbeat answered {_code_name(code)}")
            self._rejoin.set()
            return False
        try:
            await self._check_common(code, "Heartbeat")
        except _CoordinatorLost:
            self._forget_coordinator()
        except GroupMembershipError as exc:
            self._stopping = True
            self._on_fatal(exc)
        return False

    # ------------------------------------------------------------------ offsets

    async def commit(self, offsets: Mapping[TP, int]) -> bool:
        """Commit ``offsets`` as this member at this generation; False if the group refused
        (rebalanced, member removed) or could not be reached: the next commit retries."""
        if not offsets:
            return True
        generation = self.generation
        if generation < 0 or self._coordinator is None:
            return False
        by_topic: dict[str, list[tuple[int, int, str]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append((partition, offset, ""))
        request = OffsetCommitRequest(
            self.settings.group_id,
            generation,
            self.member_id,
            OffsetCommitRequest.DEFAULT_RETENTION_TIME,
            sorted(by_topic.items()),
        )
        try:
            response = await self._send(request)
        except _CoordinatorLost as exc:
            log.warning("commit of %d partitions failed: %s", len(offsets), exc)
            self._forget_coordinator()
            return False
        failed = {
            _code(code)
            for _topic, partitions in response.topics
            for _partition, code in partitions
            if code != 0
        }
        if not failed:
            return True
        names = ", ".join(sorted(_code_name(c) for c in failed))
        if failed == {_Code.REBALANCE_IN_PROGRESS}:
            # The group is completing a rebalance this member already joined: the next
            # commit, at the new generation, carries these offsets. Asking to rejoin here
            # would start yet another rebalance, whose commits would be refused the same way.
            log.info("commit of %d partitions deferred: the group is rebalancing", len(offsets))
            return False
        log.warning("commit of %d partitions refused: %s", len(offsets), names)
        if failed & _COORDINATOR_GONE:
            self._forget_coordinator()
        if failed & _MEMBER_GONE and generation == self.generation:
            # (a join that completed meanwhile already answered this)
            self._rejoin.set()
        return False

    async def commit_in_transaction(self, ids: TransactionIds, offsets: Mapping[TP, int]) -> None:
        """Commit ``offsets`` inside the transaction ``ids`` as this member at this generation
        (TxnOffsetCommit v3, KIP-447): a worker whose partitions moved is refused by the
        group, whatever its producer. Raises :class:`TransactionFailed`."""
        backoff = self.settings.retry_backoff_ms / 1000
        deadline = self._clock() + 5.0
        while True:
            generation, member_id = self.generation, self.member_id
            if generation < 0 or not member_id:
                raise TransactionFailed("this worker is not in the group", fenced=True)
            await self._ensure_coordinator()
            node = self._require_coordinator()
            try:
                codes = await txn_offset_commit(
                    self._client,
                    node,
                    transactional_id=ids.transactional_id,
                    group_id=self.settings.group_id,
                    producer_id=ids.producer_id,
                    producer_epoch=ids.producer_epoch,
                    generation_id=generation,
                    member_id=member_id,
                    group_instance_id=self.settings.group_instance_id,
                    offsets=offsets,
                )
            except KafkaError as exc:
                codes = {tp: int(_Code.NOT_COORDINATOR) for tp in offsets}
                log.info("offsets in transaction: %r; retrying", exc)
            failed = {code for code in codes.values() if code != 0}
            if not failed:
                return
            names = ", ".join(sorted({txn_error_name(c) for c in failed}))
            if failed & _TXN_MEMBER_GONE:
                if generation == self.generation:
                    self._rejoin.set()
                raise TransactionFailed(
                    f"the group refused this worker's offsets ({names}): its partitions moved",
                    fenced=True,
                )
            if failed & PRODUCER_FENCED_CODES:
                raise TransactionFailed(
                    f"the group refused this worker's offsets ({names}): its producer was fenced",
                    fenced=True,
                )
            if not failed <= _TXN_RETRIABLE or self._clock() >= deadline:
                raise TransactionFailed(f"the group refused this worker's offsets ({names})")
            if failed & _COORDINATOR_GONE:
                self._forget_coordinator()
            await asyncio.sleep(backoff)

    async def committed(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The group's committed offsets of ``tps`` (partitions without one are left out)."""
        if self.settings.exactly_once:
            return await self._committed_stable(tps)
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(set(tps)):
            by_topic.setdefault(topic, []).append(partition)
        if not by_topic:
            return {}
        backoff = self.settings.retry_backoff_ms / 1000
        while True:
            await self._ensure_coordinator()
            request = OffsetFetchRequest(self.settings.group_id, sorted(by_topic.items()))
            try:
                response = await self._send(request)
            except _CoordinatorLost:
                self._forget_coordinator()
                await asyncio.sleep(backoff)
                continue
            # OffsetFetch v2+ reports a coordinator that is loading or moved, or a refusal,
            # in a top-level error code with no partitions at all: never "nothing committed"
            # (which would restart every partition from the reset policy's offset).
            top = _code(getattr(response, "error_code", 0))
            if top in _COORDINATOR_GONE:
                log.info("committed offsets: %s; retrying", _code_name(top))
                self._forget_coordinator()
                await asyncio.sleep(backoff)
                continue
            if top != _Code.NONE:
                reason = _FATAL.get(top, "refused") if isinstance(top, _Code) else "refused"
                raise GroupMembershipError(
                    f"cannot read the committed offsets of group {self.settings.group_id!r}: "
                    f"{reason} ({_code_name(top)} from OffsetFetch)"
                )
            out: dict[TP, int] = {}
            retry = False
            for topic, partitions in response.topics:
                for partition, offset, _metadata, code in partitions:
                    if code != 0:
                        log.warning(
                            "committed offset of %s[%d]: %s", topic, partition, _code_name(code)
                        )
                        retry = retry or _code(code) in _COORDINATOR_GONE
                    elif offset >= 0:
                        out[(topic, partition)] = offset
            if not retry:
                return out
            self._forget_coordinator()
            await asyncio.sleep(backoff)

    async def _committed_stable(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Committed offsets once no open transaction holds offsets of ``tps`` (OffsetFetch
        with require_stable, KIP-447): a previous owner's transaction either commits them
        (and we start after its events) or aborts (and we start before them). The broker
        ends any transaction within its timeout; one it never ends is waited for with a
        warning every minute (starting from offsets it may still commit would process
        events twice)."""
        wanted = sorted(set(tps))
        if not wanted:
            return {}
        backoff = self.settings.retry_backoff_ms / 1000
        waited_since: float | None = None
        warned_at = 0.0
        while True:
            await self._ensure_coordinator()
            node = self._require_coordinator()
            try:
                top, found = await fetch_committed(
                    self._client,
                    node,
                    group_id=self.settings.group_id,
                    partitions=wanted,
                    require_stable=True,
                )
            except KafkaError as exc:
                log.info("committed offsets: %r; retrying", exc)
                self._forget_coordinator()
                await asyncio.sleep(backoff)
                continue
            codes = {top} | {code for _, code in found.values()}
            codes.discard(0)
            if not codes:
                return {tp: offset for tp, (offset, _) in found.items() if offset >= 0}
            if codes & _COORDINATOR_GONE:
                self._forget_coordinator()
            elif codes == {ErrorCode.UNSTABLE_OFFSET_COMMIT}:
                if waited_since is None:
                    waited_since = warned_at = self._clock()
                    log.info(
                        "committed offsets: a transaction of a previous owner is still open; "
                        "waiting for it to commit or abort"
                    )
                elif self._clock() - warned_at >= UNSTABLE_WARNING_EVERY:
                    # Longer than any transaction timeout: the broker holds offsets of a
                    # transaction it never completes (seen after a broker restart that lost
                    # a transaction marker of the group's offsets partition).
                    warned_at = self._clock()
                    log.warning(
                        "committed offsets of group %s still held by an open transaction "
                        "after %.0f s; not processing %d partitions until the broker "
                        "completes it",
                        self.settings.group_id,
                        warned_at - waited_since,
                        len(wanted),
                    )
            else:
                raise GroupMembershipError(
                    f"cannot read the committed offsets of group {self.settings.group_id!r}: "
                    + ", ".join(sorted(txn_error_name(c) for c in codes))
                )
            await asyncio.sleep(backoff)


def _code_name(code: _Code | int) -> str:
    return code.name if isinstance(code, _Code) else f"error code {code}"
