"""The KIP-447 requests of streamjoin/runtime/group/txn_protocol.py against the real broker.

A consumer group member (an aiokafka consumer, whose generation and member id the commits
carry) and an aiokafka transactional producer, whose transactions commit the group's offsets
through our AddOffsetsToTxn and TxnOffsetCommit v3. Every transaction here commits offsets
only, no records: aiokafka then has to be told the group is in the transaction
(``producer._txn_manager.consumer_group_added``), or it sends no EndTxn at all.

1. Offsets committed in a transaction are pending: OffsetFetch with ``require_stable``
   answers UNSTABLE_OFFSET_COMMIT for their partitions (per partition, top level NONE), without
   it the previous offset (here none, -1); after the commit the offsets show.
2. An aborted transaction leaves the offsets committed before it.
3. Commits from a wrong generation or member, or without AddOffsetsToTxn, are refused per
   partition and leave nothing pending.
4. Without the mark, aiokafka's abort sends no EndTxn: the offsets stay pending and the next
   transaction commits them (the hazard the mark prevents).
5. Fetching all partitions (null topics) leaves out a partition whose only offset is pending.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamjoin.runtime.group.txn_protocol import (
    ErrorCode,
    add_offsets_to_txn,
    fetch_committed,
    find_group_coordinator,
    find_transaction_coordinator,
    txn_offset_commit,
)
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

TP = tuple[str, int]
PARTITIONS = 2
#: how long the transaction's marker may take to reach the offsets partition after EndTxn
SETTLE_TIMEOUT = 15.0

NONE = ErrorCode.NONE
UNSTABLE = ErrorCode.UNSTABLE_OFFSET_COMMIT


@dataclass
class Member:
    """One group member and one transactional producer committing offsets for it."""

    consumer: AIOKafkaConsumer
    producer: AIOKafkaProducer
    topic: str
    group: str
    transactional_id: str
    generation: int
    member_id: str
    txn_node: int = -1
    group_node: int = -1

    @property
    def tps(self) -> list[TP]:
        return [(self.topic, p) for p in range(PARTITIONS)]

    async def begin(self) -> None:
        await self.producer.begin_transaction()
        if self.txn_node < 0:
            client = self.producer.client
            self.txn_node = await find_transaction_coordinator(client, self.transactional_id)
            self.group_node = await find_group_coordinator(client, self.group)

    async def add_offsets(self) -> int:
        """AddOffsetsToTxn, retried while the previous transaction still writes its markers
        (CONCURRENT_TRANSACTIONS, as the runtime does: seen in CI right after a commit)."""
        manager = self.producer._txn_manager
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            code = await add_offsets_to_txn(
                self.producer.client,
                self.txn_node,
                transactional_id=self.transactional_id,
                producer_id=manager.producer_id,
                producer_epoch=manager.producer_epoch,
                group_id=self.group,
            )
            if code != ErrorCode.CONCURRENT_TRANSACTIONS or time.monotonic() > deadline:
                return code
            await asyncio.sleep(0.02)

    async def commit_offsets(
        self,
        offsets: Mapping[TP, int],
        *,
        generation: int | None = None,
        member_id: str | None = None,
        group_instance_id: str | None = None,
        producer_epoch: int | None = None,
    ) -> dict[TP, int]:
        manager = self.producer._txn_manager
        return await txn_offset_commit(
            self.producer.client,
            self.group_node,
            transactional_id=self.transactional_id,
            group_id=self.group,
            producer_id=manager.producer_id,
            producer_epoch=manager.producer_epoch if producer_epoch is None else producer_epoch,
            generation_id=self.generation if generation is None else generation,
            member_id=self.member_id if member_id is None else member_id,
            group_instance_id=group_instance_id,
            offsets=offsets,
        )

    def mark_group_added(self) -> None:
        """Make aiokafka send EndTxn for a transaction without records (see txn_protocol)."""
        self.producer._txn_manager.consumer_group_added(self.group)

    async def committed(
        self, *, require_stable: bool = True, all_partitions: bool = False
    ) -> tuple[int, dict[TP, tuple[int, int]]]:
        return await fetch_committed(
            self.producer.client,
            self.group_node,
            group_id=self.group,
            partitions=None if all_partitions else self.tps,
            require_stable=require_stable,
        )

    async def settled(self) -> dict[TP, int]:
        """The committed offsets once no partition answers UNSTABLE_OFFSET_COMMIT."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            top, answers = await self.committed()
            assert top == NONE
            if all(code != UNSTABLE for _offset, code in answers.values()):
                assert all(code == NONE for _offset, code in answers.values()), answers
                return {tp: offset for tp, (offset, _code) in answers.items()}
            assert time.monotonic() < deadline, f"offsets still unstable: {answers}"
            await asyncio.sleep(0.05)


@pytest.fixture
async def member(kafka_bootstrap: str, unique_topic: Callable[..., str]) -> AsyncIterator[Member]:
    topic = unique_topic("txn")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, PARTITIONS)])
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"{topic}-group",
        enable_auto_commit=False,
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic}-tx")
    await consumer.start()
    try:
        await producer.start()
        try:
            deadline = time.monotonic() + 30
            while len(consumer.assignment()) < PARTITIONS:
                assert time.monotonic() < deadline, "the consumer never got its partitions"
                await consumer.getmany(timeout_ms=100)
            coordinator = consumer._coordinator
            yield Member(
                consumer,
                producer,
                topic,
                f"{topic}-group",
                f"{topic}-tx",
                coordinator.generation,
                coordinator.member_id,
            )
        finally:
            await producer.stop()
    finally:
        await consumer.stop()


async def test_offsets_of_an_open_transaction_are_unstable_until_it_commits(
    member: Member,
) -> None:
    tp0, tp1 = member.tps
    await member.begin()
    assert await member.add_offsets() == NONE
    assert await member.commit_offsets({tp0: 5, tp1: 7}) == {tp0: NONE, tp1: NONE}

    # per partition, not top level; the offset answered is -1
    assert await member.committed() == (NONE, {tp0: (-1, UNSTABLE), tp1: (-1, UNSTABLE)})
    # without require_stable: the offsets before the transaction (none here)
    assert await member.committed(require_stable=False) == (NONE, {tp0: (-1, 0), tp1: (-1, 0)})

    member.mark_group_added()
    await member.producer.commit_transaction()
    assert await member.settled() == {tp0: 5, tp1: 7}
    assert await member.committed(require_stable=False) == (NONE, {tp0: (5, 0), tp1: (7, 0)})


async def test_an_aborted_transaction_leaves_the_previous_offsets(member: Member) -> None:
    tp0, tp1 = member.tps
    await member.begin()
    assert await member.add_offsets() == NONE
    assert await member.commit_offsets({tp0: 5, tp1: 7}) == {tp0: NONE, tp1: NONE}
    member.mark_group_added()
    await member.producer.commit_transaction()
    assert await member.settled() == {tp0: 5, tp1: 7}

    await member.begin()
    assert await member.add_offsets() == NONE
    assert await member.commit_offsets({tp0: 9, tp1: 11}) == {tp0: NONE, tp1: NONE}
    assert await member.committed() == (NONE, {tp0: (-1, UNSTABLE), tp1: (-1, UNSTABLE)})
    assert await member.committed(require_stable=False) == (NONE, {tp0: (5, 0), tp1: (7, 0)})
    member.mark_group_added()
    await member.producer.abort_transaction()
    assert await member.settled() == {tp0: 5, tp1: 7}


async def test_commits_from_a_wrong_generation_or_member_are_refused(member: Member) -> None:
    tp0, tp1 = member.tps
    await member.begin()
    # before AddOffsetsToTxn the group is not in the transaction
    assert await member.commit_offsets({tp0: 1}) == {tp0: ErrorCode.INVALID_TXN_STATE}
    assert await member.add_offsets() == NONE

    refused = {
        "next generation": await member.commit_offsets({tp0: 2}, generation=member.generation + 1),
        "unknown member": await member.commit_offsets({tp0: 3}, member_id="nobody"),
        "unknown member, next generation": await member.commit_offsets(
            {tp0: 4}, generation=member.generation + 1, member_id="nobody"
        ),
        "an instance id the member does not have": await member.commit_offsets(
            {tp0: 5}, group_instance_id="someone"
        ),
        "another producer epoch": await member.commit_offsets(
            {tp0: 6}, producer_epoch=member.producer._txn_manager.producer_epoch + 1
        ),
    }
    assert refused == {
        "next generation": {tp0: ErrorCode.ILLEGAL_GENERATION},
        "unknown member": {tp0: ErrorCode.UNKNOWN_MEMBER_ID},
        "unknown member, next generation": {tp0: ErrorCode.UNKNOWN_MEMBER_ID},
        "an instance id the member does not have": {tp0: ErrorCode.UNKNOWN_MEMBER_ID},
        "another producer epoch": {tp0: ErrorCode.INVALID_PRODUCER_EPOCH},
    }
    # nothing refused is pending
    assert await member.committed() == (NONE, {tp0: (-1, 0), tp1: (-1, 0)})

    # generation -1 and no member id: the pre-KIP-447 form, accepted without any fencing
    assert await member.commit_offsets({tp1: 8}, generation=-1, member_id="") == {tp1: NONE}
    assert await member.committed() == (NONE, {tp0: (-1, 0), tp1: (-1, UNSTABLE)})
    member.mark_group_added()
    await member.producer.abort_transaction()
    assert await member.settled() == {tp0: -1, tp1: -1}


async def test_without_the_mark_aiokafka_sends_no_end_txn(member: Member) -> None:
    tp0, tp1 = member.tps
    await member.begin()
    assert await member.add_offsets() == NONE
    assert await member.commit_offsets({tp0: 3}) == {tp0: NONE}
    await member.producer.abort_transaction()  # looks empty to aiokafka: no EndTxn
    await asyncio.sleep(1.0)  # far longer than a marker takes (see settled())
    assert await member.committed() == (NONE, {tp0: (-1, UNSTABLE), tp1: (-1, 0)})

    # the producer's next transaction is the same one on the broker: it commits the offset
    # the abort above was meant to drop
    await member.begin()
    assert await member.add_offsets() == NONE
    assert await member.commit_offsets({tp1: 4}) == {tp1: NONE}
    member.mark_group_added()
    await member.producer.commit_transaction()
    assert await member.settled() == {tp0: 3, tp1: 4}


async def test_fetching_all_partitions_leaves_out_the_ones_only_pending(member: Member) -> None:
    tp0, tp1 = member.tps
    await member.begin()
    assert await member.add_offsets() == NONE
    assert await member.commit_offsets({tp0: 5}) == {tp0: NONE}
    assert await member.committed(all_partitions=True) == (NONE, {})
    member.mark_group_added()
    await member.producer.commit_transaction()
    assert await member.settled() == {tp0: 5, tp1: -1}
    assert await member.committed(all_partitions=True) == (NONE, {tp0: (5, 0)})

    # a pending offset over a committed one is reported
    await member.begin()
    assert await member.add_offsets() == NONE
    assert await member.commit_offsets({tp0: 9}) == {tp0: NONE}
    assert await member.committed(all_partitions=True) == (NONE, {tp0: (-1, UNSTABLE)})
    member.mark_group_added()
    await member.producer.abort_transaction()
    assert await member.settled() == {tp0: 5, tp1: -1}
