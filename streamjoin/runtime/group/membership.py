"""Our own consumer-group membership: the classic group protocol through aiokafka's client.

aiokafka's consumer rebalances eagerly and stops heartbeating while its
rebalance callbacks run. This service speaks the group protocol itself
(FindCoordinator, JoinGroup v5 with ``group_instance_id``, SyncGroup,
Heartbeat, LeaveGroup) through :class:`aiokafka.AIOKafkaClient` and its protocol
structs, the way the changelog reader already speaks Fetch. The fetching consumer uses
manual assignment and is told what to fetch by the runtime.

Two protocols, chosen by the group (the broker picks the first protocol every
member supports, so a group stays eager while any member speaks only eager):

* ``streamjoin`` (eager, the protocol of aiokafka-based versions): a member
  revokes everything before it rejoins;
* ``streamjoin-cooperative`` (KIP-429): a member keeps processing while the
  group rebalances; the leader withholds every task whose owner changes
  (:func:`streamjoin.assignor.cooperative.withhold_moves`), the owner revokes it
  when its new assignment arrives and rejoins at once, and the follow-up
  rebalance hands it over.

This module is the asyncio shell: it sends the requests, calls the rebalance listener,
sleeps and runs two tasks (coordination, and heartbeats, so that those keep going while
partitions are revoked, restored or committed). What every answer means, and the
member's state, is :class:`~streamjoin.runtime.group.protocol.GroupProtocol`'s (pure, with
the error handling described there). The group's committed offsets are
:class:`~streamjoin.runtime.group.group_offsets.GroupOffsets`' (:attr:`GroupMembership.offsets`).

JoinGroup and SyncGroup go over aiokafka's coordination connection; heartbeats
and offset commits over a second connection to the coordinator, so a commit is
never queued behind a JoinGroup the broker holds until the rebalance completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from aiokafka import AIOKafkaClient
from aiokafka.client import ConnectionGroup, CoordinationType
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaError
from aiokafka.protocol.group import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    SyncGroupRequest,
)

from streamjoin.errors import InternalError
from streamjoin.runtime.group.assignor_adapter import ASSIGNOR_NAME, known_partitions
from streamjoin.runtime.group.group_offsets import GroupOffsets
from streamjoin.runtime.group.protocol import Decision, GroupProtocol, Step
from streamjoin.runtime.group.rebalance_metrics import RebalanceMetrics, RebalanceRecord
from streamjoin.runtime.transport.access import REFUSALS
from streamjoin.runtime.transport.connections import ALL_NODES, drop_connections

if TYPE_CHECKING:
    pass

log = logging.getLogger("streamjoin.membership")

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
#: For QUICK_HEARTBEAT_WINDOW seconds after a rebalance a member heartbeats at least this
#: often (seconds): a follow-up rebalance comes then (KIP-429's second round, the next
#: worker of a rolling start), and a member that revoked nothing hears of it only from a
#: heartbeat's answer. At the 3 s default interval a 30-member group's second round waited
#: up to 3 s for its last member to notice.
QUICK_HEARTBEAT_INTERVAL = 0.5
QUICK_HEARTBEAT_WINDOW = 10.0


class _CoordinatorLost(Exception):
    """Look the coordinator up again (it moved, or its connection broke)."""


class _Rejoin(Exception):
    """Start the join again after a backoff (the join failed)."""


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
        listener: RebalanceListener | None = None,
        on_fatal: Callable[[BaseException], None],
        metrics: RebalanceMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.settings = settings
        self._topics = sorted(set(topics))
        self._assignor = assignor
        #: set here or by :meth:`start` (the listener may be built after the membership)
        self._listener: RebalanceListener | None = listener
        self._on_fatal = on_fatal
        self._clock = clock
        #: the member's state and the protocol's rules (everything decided is decided there)
        self.state = GroupProtocol(
            group_id=settings.group_id,
            group_instance_id=settings.group_instance_id,
            cooperative=settings.cooperative,
            eager_protocol=EAGER_PROTOCOL,
            now=clock(),
        )
        self.metrics = metrics if metrics is not None else RebalanceMetrics()
        #: the worker's other Kafka clients (fetcher, producer): their connections to a
        #: coordinator gone silent are given up too (set by the worker; each may be None)
        self.other_clients: Callable[[], Iterable[Any]] = tuple
        #: the group's committed offsets, committed as this member
        self.offsets = GroupOffsets(
            client,
            self,
            group_id=settings.group_id,
            group_instance_id=settings.group_instance_id,
            exactly_once=settings.exactly_once,
            retry_backoff=settings.retry_backoff_ms / 1000,
            clock=clock,
        )
        #: set when the coordination task may have something to do (a rejoin is due, the
        #: coordinator is to be looked up): it wakes up and asks the state
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._assigned_once = asyncio.Event()
        #: set when an assignment was applied: the heartbeat task's pause ends early
        self._rebalanced = asyncio.Event()
        self._quick_heartbeats_until = 0.0

    # ------------------------------------------------------------------ the state, read

    @property
    def member_id(self) -> str:
        return self.state.member_id

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def protocol(self) -> str | None:
        """The protocol the group chose at the last join (None: never joined)."""
        return self.state.protocol

    @property
    def leader(self) -> bool:
        return self.state.leader

    @property
    def owned(self) -> frozenset[TP]:
        return self.state.owned

    @property
    def in_good_standing(self) -> bool:
        """In the group at a generation, and not joining: a commit carries a generation the
        group still accepts (short of a removal the member has not heard of yet)."""
        return self.state.in_good_standing

    @property
    def coordinating(self) -> bool:
        """Whether the coordination task runs (it ends at :meth:`stop`, on a fatal error, and
        when a stopping worker would have to join: see :meth:`stop_joining`)."""
        return bool(self._tasks) and not self._tasks[0].done()

    def drop_all_connections(self) -> int:
        """Close every connection of the worker's clients (the group's and
        :attr:`other_clients`) to every broker: requests waiting on a silent one fail at
        once and are retried on new connections. Returns how many were closed."""
        clients = [self._client, *(c for c in self.other_clients() if c is not None)]
        return sum(drop_connections(client, ALL_NODES) for client in clients)

    async def check_standing(self) -> bool:
        """:attr:`in_good_standing`, as the commit path's membership check (no request)."""
        return self.state.in_good_standing

    @property
    def rebalancing(self) -> bool:
        """Joining, syncing or applying an assignment, or about to rejoin (a follow-up
        rebalance is due): the group's assignment is in flux (interactive queries answer
        503 meanwhile)."""
        return self.state.rebalancing

    # ------------------------------------------------------------------ lifecycle

    def start(self, listener: RebalanceListener | None = None) -> None:
        """Start the coordination and heartbeat tasks, telling ``listener`` (or the one
        given at construction) of every partition change."""
        if listener is not None:
            self._listener = listener
        if self._listener is None:
            raise InternalError("GroupMembership started without a rebalance listener")
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
        self.state.stop_joining()

    async def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for a join under way to complete, so that a
        stopping worker commits at the group's current generation: a commit sent at the
        previous one is refused, and its events would be processed again by the next owner."""
        deadline = self._clock() + timeout
        state = self.state
        # polled: the join runs in the coordination task, and this runs once
        while (state.joining or state.in_rebalance) and self._clock() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def leave(self) -> None:
        """Leave the group so that it rebalances now; static members stay (their session
        keeps their partitions for a restart with the same instance id)."""
        state = self.state
        if self.settings.group_instance_id is not None or not state.member_id:
            return
        coordinator = state.coordinator
        if coordinator is None:
            return
        request = LeaveGroupRequest(self.settings.group_id, state.member_id)
        try:
            await asyncio.wait_for(self._client.send(coordinator, request), timeout=5.0)
        except (KafkaError, asyncio.TimeoutError) as exc:
            log.warning("could not leave group %s cleanly: %r", self.settings.group_id, exc)
        state.left()

    async def wait_assigned(self) -> None:
        """Until the first assignment has been applied."""
        await self._assigned_once.wait()

    def request_rejoin(self, reason: str) -> None:
        """Rejoin at once (a probing rebalance, a topic change, a refused commit)."""
        if self.state.request_rejoin():
            log.info("rejoining group %s: %s", self.settings.group_id, reason)
            self._changed.set()

    def abandon(self, reason: str) -> None:
        """Give every owned partition up as lost and rejoin (exactly-once, after an aborted
        transaction: the tasks start again from the committed offsets). Done by the
        coordination task before its next join, so it never races an assignment."""
        if self.state.abandon(reason):
            log.info("rejoining group %s: %s", self.settings.group_id, reason)
            self._changed.set()

    # ------------------------------------------------------------------ the coordinator

    @property
    def coordinator(self) -> int | None:
        """The group coordinator's node (None: not known now)."""
        return self.state.coordinator

    def forget_coordinator(self) -> None:
        """The coordinator moved or cannot be reached: the coordination task looks it up
        (without a rejoin: the member is still in the group at its generation)."""
        self.state.coordinator_lost()
        self._changed.set()

    async def ensure_coordinator(self) -> int | None:
        """The coordinator's node, looked up until found (None only while stopping)."""
        backoff = self.settings.retry_backoff_ms / 1000
        state = self.state
        while state.coordinator is None and not self._stopping:
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
                state.coordinator_found(node)
                log.debug("group %s: coordinator is node %s", self.settings.group_id, node)
            else:
                await asyncio.sleep(backoff)
        return state.coordinator

    # ------------------------------------------------------------------ coordination

    async def _run(self, loop_body: Callable[[], Awaitable[None]]) -> None:
        try:
            await loop_body()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if not self._stopping:
                self._on_fatal(exc)

    async def _coordinate(self) -> None:
        backoff = self.settings.retry_backoff_ms / 1000
        state = self.state
        while not self._stopping:
            try:
                await self.ensure_coordinator()
                if not state.rejoin_needed:
                    await self._wait_for_change()
                    continue
                if not state.should_join():
                    return  # stopping: see stop_joining
                await self._rebalance()
            except _CoordinatorLost as exc:
                log.info("group coordinator unavailable (%s); looking it up again", exc)
                self.forget_coordinator()
                self.metrics.failed(self._clock())
                await asyncio.sleep(backoff)
            except _Rejoin:
                await asyncio.sleep(backoff)
            except KafkaError as exc:
                if isinstance(exc, REFUSALS):  # an ACL retrying cannot grant: exit code 3
                    raise type(exc)(self.settings.group_id) from exc  # (named)
                log.warning("group %s: %r; retrying", self.settings.group_id, exc)
                self.forget_coordinator()
                self.metrics.failed(self._clock())
                await asyncio.sleep(backoff)

    async def _wait_for_change(self) -> None:
        """Until a rejoin is requested, the coordinator is lost (it is looked up again, no
        rejoin) or the planned probing rebalance is due (the timer expires)."""
        state = self.state
        self._changed.clear()
        if state.wants_coordination:
            return
        timeout = None
        if state.probe_at is not None:
            timeout = max(0.0, state.probe_at - self._clock())
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            if state.probe_timer_expired():
                log.info(
                    "rejoining group %s: probing rebalance: are the warmup replicas caught up?",
                    self.settings.group_id,
                )

    async def _rebalance(self) -> None:
        state = self.state
        start = state.begin_rebalance()
        try:
            if start.lost:
                log.warning("giving up %d partitions (%s)", len(start.lost), start.lost_reason)
                await self._listening().on_partitions_lost(start.lost)
            self.metrics.started(self._clock())
            if start.revoke:
                # Eager: nothing may be processed past this point until the new assignment.
                await self._revoke(start.revoke)
            state.sending_join()
            try:
                joined = await self._join()
                # If the group fell back to eager here (a member that speaks only eager
                # joined) while we still own partitions, we cannot revoke them now: the group
                # is completing its rebalance and would refuse the commit. Our leaders
                # withhold what a member still owns whatever the protocol, so what moves is
                # revoked after SyncGroup as usual.
                assignments = await self._lead(joined) if state.leader else []
                assignment = await self._sync(assignments)
            except BaseException:
                # Not joined (coordinator lost, connection broken, ...): join again once the
                # coordinator is found, whatever made this attempt fail.
                state.join_failed()
                raise
            await self._apply(assignment)
        finally:
            state.end_rebalance()

    async def _join(self) -> Any:
        settings, state = self.settings, self.state
        while True:
            metadata = self._assignor.metadata(self._topics, state.owned).encode()
            request = JoinGroupRequest(
                settings.group_id,
                settings.session_timeout_ms,
                settings.rebalance_timeout_ms,
                state.member_id,
                settings.group_instance_id,
                PROTOCOL_TYPE,
                [(name, metadata) for name in settings.protocols],
            )
            response = await self._send_join(request)
            decision = state.join_answered(
                response.error_code,
                member_id=response.member_id,
                generation=response.generation_id,
                protocol=response.group_protocol,
                leader_id=response.leader_id,
            )
            if decision.step is Step.PROCEED:
                return response
            if decision.step is not Step.JOIN_AGAIN:
                await self._give_up(decision, "JoinGroup")
            await self._lose(decision.lost, decision.lost_reason)

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
        state = self.state
        request = SyncGroupRequest(
            self.settings.group_id,
            state.generation,
            state.member_id,
            self.settings.group_instance_id,
            assignments,
        )
        response = await self._send_join(request)
        decision = state.sync_answered(response.error_code)
        if decision.step is Step.PROCEED:
            return ConsumerProtocolMemberAssignment.decode(response.member_assignment)
        await self._give_up(decision, "SyncGroup")

    async def _give_up(self, decision: Decision, what: str) -> NoReturn:
        """A join or sync failed: give up what the decision says is lost, then unwind to the
        coordination loop (which backs off, or looks the coordinator up first)."""
        await self._lose(decision.lost, decision.lost_reason)
        if decision.warning is not None:
            log.warning("%s", decision.warning)
        if decision.step is Step.FATAL and decision.error is not None:
            raise decision.error
        if decision.step is Step.FIND_COORDINATOR:
            raise _CoordinatorLost(f"{what}: the coordinator moved or is not available")
        self.metrics.failed(self._clock())
        raise _Rejoin()

    async def _apply(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        state = self.state
        self._assignor.on_assignment(assignment)
        assigned = {(t, p) for t, ps in assignment.assignment for p in ps}
        changes = state.assignment_received(assigned)
        cooperative = state.protocol == COOPERATIVE_PROTOCOL
        if changes.revoked:
            await self._revoke(changes.revoked)
        owned = state.take_assignment(assigned)
        started = self._clock()
        await self._listening().on_partitions_assigned(changes.added, owned)
        self.metrics.assigned.add(self._clock() - started)
        self._assigned_once.set()
        self._quick_heartbeats_until = self._clock() + QUICK_HEARTBEAT_WINDOW
        self._rebalanced.set()
        if state.assignment_applied(
            revoked_any=bool(changes.revoked),
            followup=self._assignor.followup_rebalance,
            now=self._clock(),
            probing_interval=self.settings.probing_rebalance_interval,
        ):
            # KIP-429: what we gave up goes to its new owner in a follow-up rebalance.
            log.info(
                "rejoining group %s: partitions revoked for their new owner",
                self.settings.group_id,
            )
        record = self.metrics.completed(
            self._clock(),
            RebalanceRecord(
                generation=state.generation,
                protocol="cooperative" if cooperative else "eager",
                seconds=0.0,
                assigned=len(changes.added),
                revoked=len(changes.revoked),
                owned=len(state.owned),
                leader=state.leader,
                followup=state.probe_at is not None,
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

    async def _revoke(self, revoked: frozenset[TP]) -> None:
        started = self._clock()
        await self._listening().on_partitions_revoked(revoked)
        self.metrics.revoked.add(self._clock() - started)
        self.state.revoked(revoked)

    async def _lose(self, lost: frozenset[TP], reason: str) -> None:
        """The state machine dropped ``lost`` (the group gave them away): tell the listener."""
        if not lost:
            return
        log.warning(
            "lost %d partitions (%s): nothing of theirs is committed or flushed; their next "
            "owner replays from the last commit",
            len(lost),
            reason,
        )
        started = self._clock()
        await self._listening().on_partitions_lost(lost)
        self.metrics.lost.add(self._clock() - started)
        self.metrics.partitions_lost_total += len(lost)

    def _listening(self) -> RebalanceListener:
        listener = self._listener
        if listener is None:  # (the tasks that call it are started with one)
            raise InternalError("GroupMembership runs without a rebalance listener")
        return listener

    async def _send_join(self, request: Any) -> Any:
        """Send a JoinGroup or SyncGroup over the coordination connection."""
        state = self.state
        node = state.coordinator
        if node is None:
            raise _CoordinatorLost("not known")
        state.request_sent()
        try:
            return await self._client.send(node, request, group=ConnectionGroup.COORDINATION)
        except KafkaError as exc:
            if exc.retriable:
                raise _CoordinatorLost(repr(exc)) from exc
            raise
        finally:
            state.request_done()

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeats(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        session_timeout = self.settings.session_timeout_ms / 1000
        state = self.state
        while not self._stopping:
            await self._heartbeat_pause(interval)
            if state.generation < 0 or state.joining:
                continue
            if state.coordinator is None:
                # Look it up here too: the coordination task may be busy in a slow
                # revocation, and this member's session must not run out meanwhile.
                await self.ensure_coordinator()
                continue
            await self.heartbeat()
            silent = state.silent_for(self._clock(), session_timeout)
            if silent is not None:
                log.warning(
                    "no heartbeat reached the group coordinator for %.0fs (session timeout "
                    "%.0fs): the group has probably given this member's partitions away",
                    silent,
                    session_timeout,
                )

    async def _heartbeat_pause(self, interval: float) -> None:
        """Until the next heartbeat is due: ``interval`` seconds, at most
        QUICK_HEARTBEAT_INTERVAL for a while after a rebalance (and at once when one
        completes meanwhile), so that a follow-up rebalance is heard of quickly."""
        self._rebalanced.clear()
        if self._clock() < self._quick_heartbeats_until:
            interval = min(interval, QUICK_HEARTBEAT_INTERVAL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._rebalanced.wait(), interval)

    async def heartbeat(self) -> bool:
        """Send one heartbeat now; True while this member is in the group in good standing
        (a rebalance in progress still counts: the member keeps its partitions until it
        revokes them itself)."""
        state = self.state
        generation = state.heartbeat_generation()
        if generation is None:
            return False  # not in good standing for a commit either: the next one retries
        node = state.coordinator
        if node is None:
            decision = state.heartbeat_failed()
        else:
            request = HeartbeatRequest(self.settings.group_id, generation, state.member_id)
            session_timeout = self.settings.session_timeout_ms / 1000
            try:
                response = await asyncio.wait_for(self._client.send(node, request), session_timeout)
            except asyncio.TimeoutError:
                # a silent (half-open) connection: the client would wait out its request
                # timeout (the rebalance timeout + 5 s) on it, as would every commit
                clients = [self._client, *(c for c in self.other_clients() if c is not None)]
                closed = sum(drop_connections(client, node) for client in clients)
                log.warning(
                    "the group coordinator (node %s) answered no heartbeat in %.0fs (session "
                    "timeout): closed the worker's %d connections to it; looking it up again",
                    node,
                    session_timeout,
                    closed,
                )
                decision = state.heartbeat_failed()
            except KafkaError as exc:
                log.debug("heartbeat failed: %r", exc)
                decision = state.heartbeat_failed()
            else:
                decision = state.heartbeat_answered(
                    response.error_code, sent_at_generation=generation, now=self._clock()
                )
        if decision.rebalance_started:
            self.metrics.started(self._clock())
        if decision.warning is not None:
            log.warning("%s", decision.warning)
        if decision.step is Step.FIND_COORDINATOR:
            self._changed.set()
        await self._lose(decision.lost, decision.lost_reason)
        if decision.step is Step.REJOIN:
            # only now: the coordination task must not join while the loss is handled
            state.request_rejoin()
        if decision.step is Step.FATAL and decision.error is not None:
            self._stopping = True
            self._on_fatal(decision.error)
            self._changed.set()  # the coordination task sees it stops, and ends
        if state.rejoin_needed:
            self._changed.set()
        return decision.step is Step.PROCEED
