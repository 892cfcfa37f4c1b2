"""The sender's send path without awaiting (``send_now``, the compiled QuickAppend), over a
fake aiokafka producer: what it appends, counts and declines (the broker tests are in
tests/integration/test_producer.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.producer.message_accumulator import BatchBuilder

from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.group.transaction import TransactionalSender
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.transport.out_batches import Sent
from streamjoin.runtime.transport.producer import KafkaSender


class FakeProducer:
    """Enough of AIOKafkaProducer for a send: batches are kept, never sent."""

    def __init__(self, transactional: bool = False) -> None:
        self.transactional = transactional
        self.batches: list[tuple[str, int, BatchBuilder]] = []

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16384, 0, is_transactional=self.transactional)

    async def send_batch(self, builder: BatchBuilder, topic: str, *, partition: int) -> Any:
        self.batches.append((topic, partition, builder))
        return asyncio.get_running_loop().create_future()

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}

    async def begin_transaction(self) -> None:
        pass


def _sender() -> KafkaSender:
    sender = KafkaSender("127.0.0.1:1", client_options={}, producer_options={}, client_id="t")
    sender._producer = FakeProducer()  # type: ignore[assignment]
    return sender


async def test_send_now_appends_to_the_open_batch_and_counts_in_the_counters_set_last() -> None:
    sender = _sender()
    first = await sender.send(("out", b"k", b"v1", 0, (), 1))  # opens partition 0's batch
    counters = WorkerCounters()
    sender.counters = counters  # (the worker hands the sender its own counters)
    second = sender.send_now(("out", b"k", b"v2", 0, (), 2))
    assert isinstance(first, Sent) and isinstance(second, Sent)
    assert second.batch is first.batch and (first.index, second.index) == (0, 1)
    assert counters.records_out == {"out": 1}
    assert [record[2] for record in first.batch.records] == [b"v1", b"v2"]


async def test_send_now_picks_the_keys_partition_and_fills_in_a_missing_timestamp() -> None:
    sender = _sender()
    for partition in (0, 1):  # (both partitions known, each with an open batch)
        await sender.send(("out", b"x", b"v", partition, (), 1))
    sent = sender.send_now(("out", b"k", b"v", None, [("h", b"1")], None))
    assert isinstance(sent, Sent)
    record = sent.batch.records[sent.index]
    assert sent.batch.partition == partition_for_key(b"k", 2)
    assert record[:5] == ("out", b"k", b"v", None, [("h", b"1")])
    assert isinstance(record[5], int) and record[5] > 1_600_000_000_000
    assert sender.counters.records_out == {"out": 3}


async def test_send_now_declines_what_needs_the_long_way() -> None:
    sender = _sender()
    assert sender.send_now(("out", b"k", b"v", 0, (), 1)) is None  # partition not sent to yet
    await sender.send(("out", b"k", b"v", 0, (), 1))
    assert sender.send_now(("out", None, b"v", None, (), 1)) is None  # no key, no partition
    replacement = asyncio.get_running_loop().create_future()
    sender._replacing = replacement  # a producer being replaced after a refusal
    assert sender.send_now(("out", b"k", b"v", 0, (), 1)) is None
    sender._replacing = None
    assert sender.send_now(("out", b"k", b"v", 0, (), 1)) is not None
    assert sender.counters.records_out == {"out": 2}


async def test_a_transactional_sender_declines_while_a_commit_ends_its_transaction() -> None:
    sender = TransactionalSender(
        "127.0.0.1:1",
        client_options={},
        producer_options={},
        client_id="t",
        transactional_id="t-txn",
        transaction_timeout_ms=10_000,
        group_id="g",
    )
    sender._producer = FakeProducer(transactional=True)  # type: ignore[assignment]
    assert sender.send_now(("out", b"k", b"v", 0, (), 1)) is None  # closed until it begins
    sender._open_sends()
    await sender.send(("out", b"k", b"v", 0, (), 1))
    assert sender.send_now(("out", b"k", b"v", 0, (), 2)) is not None
    sender.close_sends()
    assert sender.send_now(("out", b"k", b"v", 0, (), 3)) is None
