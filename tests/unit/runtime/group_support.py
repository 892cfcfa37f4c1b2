"""What the group membership and group offsets tests share: a scripted fake of aiokafka's
client, the group's answers, and fakes of the assignor and the rebalance listener.

The fake client answers each request type from a script (a queue of responses, exceptions
or callables) and records everything sent; a JoinGroup or SyncGroup with nothing scripted
is held forever, as a broker holds a JoinGroup until the group's rebalance completes, so a
test sees exactly the joins it scripted. Heartbeats answer NONE unless scripted, commits
succeed and offset fetches find no committed offset.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka.client import ConnectionGroup
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.protocol.commit import (
    OffsetCommitRequest,
    OffsetCommitResponse_v3,
    OffsetFetchRequest,
    OffsetFetchResponse_v3,
)
from aiokafka.protocol.group import (
    HeartbeatRequest,
    HeartbeatResponse_v1,
    JoinGroupRequest,
    JoinGroupResponse_v5,
    LeaveGroupRequest,
    LeaveGroupResponse_v1,
    SyncGroupRequest,
    SyncGroupResponse_v3,
)

from streamjoin.runtime.group.membership import COOPERATIVE_PROTOCOL
from streamjoin.runtime.group.txn_protocol import (
    OffsetFetchResponse_v7,
    StableOffsetFetchRequest,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse_v3,
)

TP = tuple[str, int]

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
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
INVALID_PRODUCER_EPOCH = 47
CONCURRENT_TRANSACTIONS = 51
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90

TOPIC = "t"
GROUP = "g"


def tps(*partitions: int) -> frozenset[TP]:
    return frozenset((TOPIC, p) for p in partitions)


# --------------------------------------------------------------------------- answers


def join_ok(
    member_id: str = "m1",
    *,
    generation: int = 1,
    leader: str = "leader",
    protocol: str = COOPERATIVE_PROTOCOL,
    members: Iterable[tuple[str, str | None, bytes]] = (),
) -> JoinGroupResponse_v5:
    return JoinGroupResponse_v5(0, NONE, generation, protocol, leader, member_id, list(members))


def join_error(code: int, member_id: str = "") -> JoinGroupResponse_v5:
    return JoinGroupResponse_v5(0, code, -1, "", "", member_id, [])


def assignment(
    partitions: Iterable[int], user_data: bytes = b""
) -> ConsumerProtocolMemberAssignment:
    return ConsumerProtocolMemberAssignment(0, [(TOPIC, sorted(partitions))], user_data)


def sync_ok(partitions: Iterable[int], user_data: bytes = b"") -> SyncGroupResponse_v3:
    return SyncGroupResponse_v3(0, NONE, assignment(partitions, user_data).encode())


def sync_error(code: int) -> SyncGroupResponse_v3:
    return SyncGroupResponse_v3(0, code, b"")


def heartbeat(code: int) -> HeartbeatResponse_v1:
    return HeartbeatResponse_v1(0, code)


def commit_answer(code: int) -> Callable[[Any], OffsetCommitResponse_v3]:
    """Every partition of the commit request answered ``code``."""

    def answer(request: Any) -> OffsetCommitResponse_v3:
        built = build(request)
        return OffsetCommitResponse_v3(
            0, [(topic, [(p, code) for p, _o, _m in parts]) for topic, parts in built.topics]
        )

    return answer


def fetch_answer(
    offsets: Mapping[TP, int], error_code: int = NONE, codes: Mapping[TP, int] | None = None
) -> OffsetFetchResponse_v3:
    """An OffsetFetch answer (v3, as aiokafka reads it); ``codes``: per-partition errors."""
    codes = codes or {}
    by_topic: dict[str, list[tuple[int, int, str, int]]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        code = codes.get((topic, partition), NONE)
        by_topic.setdefault(topic, []).append((partition, offset, "", code))
    return OffsetFetchResponse_v3(0, sorted(by_topic.items()), error_code)


def stable_fetch_answer(
    offsets: Mapping[TP, int], error_code: int = NONE, codes: Mapping[TP, int] | None = None
) -> OffsetFetchResponse_v7:
    """An OffsetFetch v7 answer (what a ``require_stable`` fetch reads)."""
    codes = codes or {}
    by_topic: dict[str, list[tuple[int, int, int, str, int, dict[int, bytes]]]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        code = codes.get((topic, partition), NONE)
        by_topic.setdefault(topic, []).append((partition, offset, -1, "", code, {}))
    return OffsetFetchResponse_v7(
        0, [(t, ps, {}) for t, ps in sorted(by_topic.items())], error_code, {}
    )


def txn_commit_answer(code: int) -> Callable[[Any], TxnOffsetCommitResponse_v3]:
    """Every partition of the TxnOffsetCommit answered ``code``."""

    def answer(request: Any) -> TxnOffsetCommitResponse_v3:
        by_topic: dict[str, list[tuple[int, int, dict[int, bytes]]]] = {}
        for topic, partition in sorted(request.offsets):
            by_topic.setdefault(topic, []).append((partition, code, {}))
        return TxnOffsetCommitResponse_v3(0, [(t, ps, {}) for t, ps in by_topic.items()], {})

    return answer


def build(request: Any) -> Any:
    """The request as the newest version aiokafka can build of it (what a broker gets)."""
    return request.build(type(request)._CLASSES[-1])


def owned_in(join: Any) -> list[list[Any]]:
    """What a JoinGroup request told the leader this member owns (FakeAssignor's metadata)."""
    metadata = ConsumerProtocolMemberMetadata.decode(join.group_protocols[0][1])
    owned: list[list[Any]] = json.loads(metadata.user_data)
    return owned


# --------------------------------------------------------------------------- fakes


class FakeCluster:
    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.partitions.get(topic)
        return set(range(n)) if n else None


class FakeClient:
    """What GroupMembership and GroupOffsets use of AIOKafkaClient, answering from a script."""

    def __init__(self, events: list[tuple[Any, ...]], partitions: dict[str, int]) -> None:
        self.events = events
        self.scripts: dict[type, deque[Any]] = {}
        self.sent: list[tuple[int, Any, ConnectionGroup]] = []
        self.lookups = 0
        self.node = 1
        #: topics the metadata learns at its next update (not known before)
        self.unknown: dict[str, int] = {}
        self.cluster = FakeCluster(dict(partitions))
        self.added_topics: list[str] = []
        self.metadata_updates = 0
        #: set after every request sent (a test waits for it instead of sleeping)
        self.sent_one = asyncio.Event()

    def script(self, request_type: type, *answers: Any) -> None:
        self.scripts.setdefault(request_type, deque()).extend(answers)

    async def coordinator_lookup(self, _type: Any, key: str) -> int:
        assert key == GROUP
        self.lookups += 1
        self.events.append(("lookup",))
        return self.node

    async def ready(self, node: int, *, group: ConnectionGroup = ConnectionGroup.DEFAULT) -> bool:
        return True

    def add_topic(self, topic: str) -> None:
        self.added_topics.append(topic)

    async def force_metadata_update(self) -> bool:
        self.metadata_updates += 1
        self.cluster.partitions.update(self.unknown)
        return True

    async def send(
        self, node: int, request: Any, *, group: ConnectionGroup = ConnectionGroup.DEFAULT
    ) -> Any:
        self.sent.append((node, request, group))
        self.events.append(("send", type(request).__name__))
        self.sent_one.set()
        queue = self.scripts.get(type(request))
        answer = queue.popleft() if queue else self._default(request)
        if callable(answer) and not hasattr(answer, "SCHEMA"):
            answer = answer(request)
            if asyncio.iscoroutine(answer):
                answer = await answer
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _default(self, request: Any) -> Any:
        if isinstance(request, (JoinGroupRequest, SyncGroupRequest)):
            return _held
        if isinstance(request, HeartbeatRequest):
            return heartbeat(NONE)
        if isinstance(request, OffsetCommitRequest):
            return commit_answer(NONE)
        if isinstance(request, OffsetFetchRequest):
            return fetch_answer({(t, p): -1 for t, ps in build(request).topics for p in ps})
        if isinstance(request, StableOffsetFetchRequest):
            return stable_fetch_answer(dict.fromkeys(request.partitions or [], -1))
        if isinstance(request, TxnOffsetCommitRequest):
            return txn_commit_answer(NONE)
        if isinstance(request, LeaveGroupRequest):
            return LeaveGroupResponse_v1(0, NONE)
        raise AssertionError(f"unexpected request {request!r}")

    def requests(self, request_type: type) -> list[Any]:
        """What was sent of ``request_type``, as built structs, oldest first."""
        return [build(r) for _node, r, _group in self.sent if isinstance(r, request_type)]

    def count(self, request_type: type) -> int:
        return sum(isinstance(r, request_type) for _node, r, _group in self.sent)


async def _held(_request: Any) -> Any:
    await asyncio.Event().wait()  # the broker holds it (until the test stops the member)


class FakeAssignor:
    """Records the membership's calls; a SyncGroup whose user data is b"followup" plans a
    probing rebalance (as the real assignor does while warmups catch up)."""

    def __init__(self) -> None:
        self.followup_rebalance = False
        self.metadata_calls: list[tuple[list[str], frozenset[TP]]] = []
        self.assign_calls: list[
            tuple[dict[str, int], dict[str, ConsumerProtocolMemberMetadata], bool]
        ] = []
        self.assignments: list[ConsumerProtocolMemberAssignment] = []
        self.plan: dict[str, ConsumerProtocolMemberAssignment] = {}

    def metadata(
        self, topics: Iterable[str], owned: Iterable[TP]
    ) -> ConsumerProtocolMemberMetadata:
        owned = frozenset(owned)
        self.metadata_calls.append((list(topics), owned))
        return ConsumerProtocolMemberMetadata(0, list(topics), json.dumps(sorted(owned)).encode())

    def assign_members(
        self,
        topics: Mapping[str, int],
        members: Mapping[str, ConsumerProtocolMemberMetadata],
        *,
        cooperative: bool,
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        self.assign_calls.append((dict(topics), dict(members), cooperative))
        return dict(self.plan)

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.assignments.append(assignment)
        self.followup_rebalance = assignment.user_data == b"followup"


class FakeListener:
    """Records the partition changes; a revocation (a loss) waits for
    :attr:`release_revocation` (:attr:`release_loss`) when a test holds them, to see what
    goes on while one runs."""

    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.events = events
        self.hold_revocations = False
        self.release_revocation = asyncio.Event()
        self.hold_losses = False
        self.release_loss = asyncio.Event()

    async def on_partitions_revoked(self, revoked: frozenset[TP]) -> None:
        self.events.append(("revoked", revoked))
        if self.hold_revocations:
            await self.release_revocation.wait()
        self.events.append(("revoked-done", revoked))

    async def on_partitions_assigned(self, added: frozenset[TP], owned: frozenset[TP]) -> None:
        self.events.append(("assigned", added, owned))

    async def on_partitions_lost(self, lost: frozenset[TP]) -> None:
        self.events.append(("lost", lost))
        if self.hold_losses:
            await self.release_loss.wait()
            self.events.append(("lost-done", lost))


async def eventually(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Until ``condition`` holds (checked at every turn of the event loop); fails after
    ``timeout`` seconds. Waits for something to happen, never proves that nothing did."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)
