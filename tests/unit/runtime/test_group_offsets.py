"""GroupOffsets (runtime/group/group_offsets.py): what each answer means, as tables of the
pure verdicts, then the requests through the scripted fake client, with a fake of the
membership's link (generation, member id, coordinator). The one OffsetFetch loop is run
for both guarantees: at least once (aiokafka's OffsetFetch) and exactly once (OffsetFetch
v7 with ``require_stable``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest

from streamjoin.errors import GroupMembershipError, TransactionFailed
from streamjoin.runtime.group.group_offsets import (
    CommitVerdict,
    FetchStep,
    GroupOffsets,
    TxnCommitStep,
    read_commit_answer,
    read_fetch_answer,
    read_txn_commit_answer,
)
from streamjoin.runtime.group.transaction import TransactionIds
from streamjoin.runtime.group.txn_protocol import StableOffsetFetchRequest, TxnOffsetCommitRequest
from tests.unit.runtime.group_support import (
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_LOAD_IN_PROGRESS,
    FENCED_INSTANCE_ID,
    GROUP,
    GROUP_AUTHORIZATION_FAILED,
    ILLEGAL_GENERATION,
    INVALID_PRODUCER_EPOCH,
    NOT_COORDINATOR,
    PRODUCER_FENCED,
    REBALANCE_IN_PROGRESS,
    TOPIC,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSTABLE_OFFSET_COMMIT,
    FakeClient,
    commit_answer,
    fetch_answer,
    stable_fetch_answer,
    txn_commit_answer,
)

TP = tuple[str, int]
T0, T1, T2 = (TOPIC, 0), (TOPIC, 1), (TOPIC, 2)
IDS = TransactionIds("tx-1", producer_id=7, producer_epoch=3)


# --------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("codes", "verdict"),
    [
        ([], CommitVerdict(committed=True)),
        ([0, 0], CommitVerdict(committed=True)),
        ([REBALANCE_IN_PROGRESS], CommitVerdict(committed=False, deferred=True)),
        ([0, REBALANCE_IN_PROGRESS], CommitVerdict(committed=False, deferred=True)),
        ([REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION], CommitVerdict(False, member_gone=True)),
        ([ILLEGAL_GENERATION], CommitVerdict(committed=False, member_gone=True)),
        ([UNKNOWN_MEMBER_ID], CommitVerdict(committed=False, member_gone=True)),
        ([NOT_COORDINATOR], CommitVerdict(committed=False, forget_coordinator=True)),
        (
            [COORDINATOR_LOAD_IN_PROGRESS, UNKNOWN_MEMBER_ID],
            CommitVerdict(committed=False, forget_coordinator=True, member_gone=True),
        ),
        ([GROUP_AUTHORIZATION_FAILED], CommitVerdict(committed=False)),
    ],
)
def test_commit_answers(codes: list[int], verdict: CommitVerdict) -> None:
    assert read_commit_answer(codes) == verdict


@pytest.mark.parametrize(
    ("codes", "out_of_time", "step", "member_gone", "forget"),
    [
        ([0], False, TxnCommitStep.DONE, False, False),
        ([ILLEGAL_GENERATION], False, TxnCommitStep.FENCED, True, False),
        ([UNKNOWN_MEMBER_ID], False, TxnCommitStep.FENCED, True, False),
        ([FENCED_INSTANCE_ID], False, TxnCommitStep.FENCED, True, False),
        ([ILLEGAL_GENERATION, CONCURRENT_TRANSACTIONS], True, TxnCommitStep.FENCED, True, False),
        ([INVALID_PRODUCER_EPOCH], False, TxnCommitStep.FENCED, False, False),
        ([PRODUCER_FENCED], False, TxnCommitStep.FENCED, False, False),
        ([CONCURRENT_TRANSACTIONS], False, TxnCommitStep.RETRY, False, False),
        ([REBALANCE_IN_PROGRESS], False, TxnCommitStep.RETRY, False, False),
        ([UNKNOWN_TOPIC_OR_PARTITION], False, TxnCommitStep.RETRY, False, False),
        ([NOT_COORDINATOR, 0], False, TxnCommitStep.RETRY, False, True),
        ([NOT_COORDINATOR], True, TxnCommitStep.FAILED, False, False),
        ([GROUP_AUTHORIZATION_FAILED], False, TxnCommitStep.FAILED, False, False),
    ],
)
def test_txn_commit_answers(
    codes: list[int], out_of_time: bool, step: TxnCommitStep, member_gone: bool, forget: bool
) -> None:
    verdict = read_txn_commit_answer(codes, out_of_time=out_of_time)
    assert (verdict.step, verdict.member_gone, verdict.forget_coordinator) == (
        step,
        member_gone,
        forget,
    )


def answered(**codes: int) -> dict[TP, tuple[int, int]]:
    """Partition 0 committed at 5, partition 1 never, partition 2 at 9; ``p<n>=code``
    makes partition n answer that error (offset -1)."""
    out = {T0: (5, 0), T1: (-1, 0), T2: (9, 0)}
    for name, code in codes.items():
        out[(TOPIC, int(name[1:]))] = (-1, code)
    return out


@pytest.mark.parametrize("stable", [False, True], ids=["at least once", "exactly once"])
@pytest.mark.parametrize(
    ("top", "partitions", "step_at_least_once", "step_exactly_once"),
    [
        (0, answered(), FetchStep.DONE, FetchStep.DONE),
        (NOT_COORDINATOR, {}, FetchStep.COORDINATOR_GONE, FetchStep.COORDINATOR_GONE),
        (COORDINATOR_LOAD_IN_PROGRESS, {}, FetchStep.COORDINATOR_GONE, FetchStep.COORDINATOR_GONE),
        (0, answered(p1=NOT_COORDINATOR), FetchStep.COORDINATOR_GONE, FetchStep.COORDINATOR_GONE),
        (GROUP_AUTHORIZATION_FAILED, {}, FetchStep.FAILED, FetchStep.FAILED),
        # exactly once must not guess where a partition starts; at least once skips it
        (0, answered(p1=UNKNOWN_TOPIC_OR_PARTITION), FetchStep.DONE, FetchStep.FAILED),
        (0, answered(p2=UNSTABLE_OFFSET_COMMIT), FetchStep.UNSTABLE, FetchStep.UNSTABLE),
        (
            0,
            answered(p1=UNSTABLE_OFFSET_COMMIT, p2=NOT_COORDINATOR),
            FetchStep.COORDINATOR_GONE,
            FetchStep.COORDINATOR_GONE,
        ),
        (
            0,
            answered(p1=UNSTABLE_OFFSET_COMMIT, p2=UNKNOWN_TOPIC_OR_PARTITION),
            FetchStep.UNSTABLE,
            FetchStep.FAILED,
        ),
    ],
)
def test_fetch_answers(
    stable: bool,
    top: int,
    partitions: dict[TP, tuple[int, int]],
    step_at_least_once: FetchStep,
    step_exactly_once: FetchStep,
) -> None:
    verdict = read_fetch_answer(top, partitions, stable=stable)
    assert verdict.step is (step_exactly_once if stable else step_at_least_once)
    if verdict.step is FetchStep.DONE:
        # a partition without a committed offset, or answered an error, is left out
        expected = {tp: off for tp, (off, code) in partitions.items() if off >= 0 and not code}
        assert verdict.offsets == expected
        assert verdict.skipped == {tp: c for tp, (_o, c) in partitions.items() if c}


# --------------------------------------------------------------------------- the requests


@dataclass
class FakeLink:
    """The membership as GroupOffsets sees it."""

    generation: int = 1
    member_id: str = "m1"
    coordinator: int | None = 1
    owned: frozenset[tuple[str, int]] = frozenset({(TOPIC, 0), (TOPIC, 1)})
    lookups: int = 0
    rejoins: list[str] = field(default_factory=list)

    async def ensure_coordinator(self) -> int | None:
        if self.coordinator is None:
            self.lookups += 1
            self.coordinator = 1
        return self.coordinator

    def forget_coordinator(self) -> None:
        self.coordinator = None

    def request_rejoin(self, reason: str) -> None:
        self.rejoins.append(reason)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Offsets:
    offsets: GroupOffsets
    client: FakeClient
    link: FakeLink
    clock: Clock


def make(*, exactly_once: bool = False, static: bool = False) -> Offsets:
    client, link, clock = FakeClient([], {TOPIC: 4}), FakeLink(), Clock()
    offsets = GroupOffsets(
        client,
        link,
        group_id=GROUP,
        group_instance_id="i1" if static else None,
        exactly_once=exactly_once,
        retry_backoff=0.001,
        clock=clock,
    )
    return Offsets(offsets, client, link, clock)


GUARANTEES = pytest.mark.parametrize(
    "exactly_once", [False, True], ids=["at least once", "exactly once"]
)


def fetch_request_type(exactly_once: bool) -> Any:
    return StableOffsetFetchRequest if exactly_once else OffsetFetchRequest


def fetch_reply(
    exactly_once: bool,
    offsets: dict[TP, int],
    error_code: int = 0,
    codes: dict[TP, int] | None = None,
) -> Any:
    """The answer of the OffsetFetch version each guarantee sends."""
    build = stable_fetch_answer if exactly_once else fetch_answer
    return build(offsets, error_code, codes)


@GUARANTEES
async def test_committed_leaves_out_partitions_without_a_committed_offset(
    exactly_once: bool,
) -> None:
    o = make(exactly_once=exactly_once)
    kind = fetch_request_type(exactly_once)
    o.client.script(kind, fetch_reply(exactly_once, {T0: 42, T1: -1, T2: 0}))
    got = await o.offsets.committed([T2, T0, T1, T0])
    assert got == {T0: 42, T2: 0}
    [(_node, request, _group)] = o.client.sent
    assert type(request) is kind
    if exactly_once:
        assert request.partitions == [T0, T1, T2] and request.require_stable is True
    else:
        [built] = o.client.requests(OffsetFetchRequest)
        assert built.consumer_group == GROUP and built.topics == [(TOPIC, [0, 1, 2])]
    assert await o.offsets.committed([]) == {}
    assert len(o.client.sent) == 1


@GUARANTEES
@pytest.mark.parametrize("code", [COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR])
async def test_committed_retries_a_fetch_the_coordinator_refused_as_a_whole(
    exactly_once: bool, code: int
) -> None:
    """OffsetFetch v2+ reports a coordinator that is loading or moved in its top-level error
    code, with no partitions at all: that is not "nothing committed" (which would restart
    every partition from the reset policy's offset), the fetch must be retried."""
    o = make(exactly_once=exactly_once)
    o.client.script(
        fetch_request_type(exactly_once),
        fetch_reply(exactly_once, {}, error_code=code),
        fetch_reply(exactly_once, {T0: 42}),
    )
    assert await o.offsets.committed([T0]) == {T0: 42}
    assert len(o.client.sent) == 2 and o.link.lookups == 1


@GUARANTEES
async def test_committed_retries_after_a_broken_connection(exactly_once: bool) -> None:
    o = make(exactly_once=exactly_once)
    o.client.script(
        fetch_request_type(exactly_once),
        KafkaConnectionError("reset by peer"),
        fetch_reply(exactly_once, {T0: 3}),
    )
    assert await o.offsets.committed([T0]) == {T0: 3}
    assert o.link.lookups == 1


@GUARANTEES
async def test_committed_refused_for_good_raises(exactly_once: bool) -> None:
    o = make(exactly_once=exactly_once)
    o.client.script(
        fetch_request_type(exactly_once),
        fetch_reply(exactly_once, {}, error_code=GROUP_AUTHORIZATION_FAILED),
    )
    with pytest.raises(GroupMembershipError, match="GROUP_AUTHORIZATION_FAILED") as raised:
        await o.offsets.committed([T0])
    assert "not authorized" in str(raised.value) and repr(GROUP) in str(raised.value)


@GUARANTEES
async def test_a_partition_answered_an_error_is_skipped_only_at_least_once(
    exactly_once: bool,
) -> None:
    o = make(exactly_once=exactly_once)
    reply = fetch_reply(exactly_once, {T0: 4, T1: -1}, codes={T1: UNKNOWN_TOPIC_OR_PARTITION})
    o.client.script(fetch_request_type(exactly_once), reply)
    if exactly_once:
        with pytest.raises(GroupMembershipError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            await o.offsets.committed([T0, T1])
    else:
        assert await o.offsets.committed([T0, T1]) == {T0: 4}


async def test_exactly_once_waits_while_a_transaction_holds_the_offsets() -> None:
    """A previous owner's open transaction holds offsets of the partition: starting from the
    offset before it would process its events twice if it commits. The fetch is repeated
    (the coordinator is not looked up again) until the transaction ended."""
    o = make(exactly_once=True)
    unstable = stable_fetch_answer({T0: -1, T1: 8}, codes={T0: UNSTABLE_OFFSET_COMMIT})
    o.client.script(
        StableOffsetFetchRequest, unstable, unstable, stable_fetch_answer({T0: 12, T1: 8})
    )
    assert await o.offsets.committed([T0, T1]) == {T0: 12, T1: 8}
    assert len(o.client.sent) == 3 and o.link.lookups == 0


async def test_commit_sends_the_members_generation_and_id() -> None:
    o = make()
    o.link.generation, o.link.member_id = 4, "m4"
    assert await o.offsets.commit({T1: 7, T0: 5}) is True
    [commit] = o.client.requests(OffsetCommitRequest)
    assert (commit.consumer_group, commit.consumer_group_generation_id) == (GROUP, 4)
    assert commit.consumer_id == "m4"
    assert commit.topics == [(TOPIC, [(0, 5, ""), (1, 7, "")])]


async def test_only_offsets_of_owned_partitions_are_committed() -> None:
    o = make()
    o.link.owned = frozenset({T1})
    assert await o.offsets.commit({T1: 7, T0: 5}) is True
    [commit] = o.client.requests(OffsetCommitRequest)
    assert commit.topics == [(TOPIC, [(1, 7, "")])]
    o.link.owned = frozenset()
    assert await o.offsets.commit({T1: 8}) is True  # nothing of ours to commit
    assert len(o.client.requests(OffsetCommitRequest)) == 1


async def test_commit_without_a_generation_or_coordinator_sends_nothing() -> None:
    o = make()
    assert await o.offsets.commit({}) is True
    o.link.generation = -1
    assert await o.offsets.commit({T0: 1}) is False
    o.link.generation, o.link.coordinator = 1, None
    assert await o.offsets.commit({T0: 1}) is False
    assert o.client.sent == [] and o.link.lookups == 0


@pytest.mark.parametrize(
    ("answer", "forgets", "rejoins"),
    [
        (commit_answer(NOT_COORDINATOR), True, False),
        (KafkaConnectionError("broken pipe"), True, False),
        (commit_answer(ILLEGAL_GENERATION), False, True),
        (commit_answer(UNKNOWN_MEMBER_ID), False, True),
        (commit_answer(REBALANCE_IN_PROGRESS), False, False),
        (commit_answer(GROUP_AUTHORIZATION_FAILED), False, False),
    ],
    ids=["not coordinator", "broken", "illegal generation", "unknown member", "rebalance", "auth"],
)
async def test_a_refused_commit_returns_false_and_tells_the_membership(
    answer: Any, forgets: bool, rejoins: bool
) -> None:
    o = make()
    o.client.script(OffsetCommitRequest, answer)
    assert await o.offsets.commit({T0: 5}) is False
    assert (o.link.coordinator is None) == forgets
    assert bool(o.link.rejoins) == rejoins


async def test_commit_in_transaction_sends_the_member_and_the_producer() -> None:
    o = make(exactly_once=True, static=True)
    o.link.generation, o.link.member_id = 6, "m6"
    await o.offsets.commit_in_transaction(IDS, {T0: 5, T1: 6})
    [(_node, request, _group)] = o.client.sent
    assert type(request) is TxnOffsetCommitRequest
    assert (request.transactional_id, request.producer_id, request.producer_epoch) == (
        "tx-1",
        7,
        3,
    )
    assert (request.generation_id, request.member_id, request.group_instance_id) == (6, "m6", "i1")
    assert request.offsets == {T0: 5, T1: 6}


@pytest.mark.parametrize("code", [ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID])
async def test_offsets_in_a_transaction_refused_as_a_zombies_are_fenced_and_rejoin(
    code: int,
) -> None:
    o = make(exactly_once=True)
    o.client.script(TxnOffsetCommitRequest, txn_commit_answer(code))
    with pytest.raises(TransactionFailed, match="partitions moved") as raised:
        await o.offsets.commit_in_transaction(IDS, {T0: 5})
    assert raised.value.fenced and len(o.link.rejoins) == 1


@pytest.mark.parametrize("code", [INVALID_PRODUCER_EPOCH, PRODUCER_FENCED])
async def test_offsets_of_a_fenced_producer_are_refused_without_a_rejoin(code: int) -> None:
    o = make(exactly_once=True)
    o.client.script(TxnOffsetCommitRequest, txn_commit_answer(code))
    with pytest.raises(TransactionFailed, match="producer was fenced") as raised:
        await o.offsets.commit_in_transaction(IDS, {T0: 5})
    assert raised.value.fenced and o.link.rejoins == []


async def test_offsets_in_a_transaction_are_retried_while_retriable() -> None:
    o = make(exactly_once=True)
    o.client.script(
        TxnOffsetCommitRequest,
        txn_commit_answer(CONCURRENT_TRANSACTIONS),
        txn_commit_answer(NOT_COORDINATOR),
        KafkaConnectionError("reset"),
        txn_commit_answer(0),
    )
    await o.offsets.commit_in_transaction(IDS, {T0: 5})
    assert o.client.count(TxnOffsetCommitRequest) == 4
    assert o.link.lookups == 2  # after NOT_COORDINATOR, and after the broken connection


async def test_offsets_in_a_transaction_fail_once_retries_run_out() -> None:
    o = make(exactly_once=True)

    def late(request: Any) -> Any:
        o.clock.now += 10.0  # past the retry deadline
        return txn_commit_answer(CONCURRENT_TRANSACTIONS)(request)

    o.client.script(TxnOffsetCommitRequest, late)
    with pytest.raises(TransactionFailed, match="CONCURRENT_TRANSACTIONS") as raised:
        await o.offsets.commit_in_transaction(IDS, {T0: 5})
    assert not raised.value.fenced and o.client.count(TxnOffsetCommitRequest) == 1


async def test_offsets_in_a_transaction_outside_the_group_are_fenced_unsent() -> None:
    o = make(exactly_once=True)
    o.link.member_id = ""
    with pytest.raises(TransactionFailed, match="not in the group") as raised:
        await o.offsets.commit_in_transaction(IDS, {T0: 5})
    assert raised.value.fenced and o.client.sent == []
