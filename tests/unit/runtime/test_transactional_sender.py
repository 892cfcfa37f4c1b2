"""The transactional sender's records around an abort, over a fake aiokafka producer (the
broker tests are in tests/integration/test_exactly_once*.py and test_broker_restart.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.producer.message_accumulator import BatchBuilder

from streamjoin.runtime.group.transaction import TransactionalSender


class FakeProducer:
    """Enough of AIOKafkaProducer for the sender: batches are kept, never sent; topic
    metadata waits for ``metadata`` (a topic the sender has not written to yet)."""

    def __init__(self) -> None:
        self.metadata = asyncio.Event()
        self.batches: list[tuple[str, int, BatchBuilder]] = []
        self.transactions: list[str] = []

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16384, 0, is_transactional=True)

    async def send_batch(self, builder: BatchBuilder, topic: str, *, partition: int) -> Any:
        self.batches.append((topic, partition, builder))
        return asyncio.get_running_loop().create_future()  # never acknowledged here

    async def partitions_for(self, topic: str) -> set[int]:
        await self.metadata.wait()
        return {0, 1}

    async def begin_transaction(self) -> None:
        self.transactions.append("begin")

    async def abort_transaction(self) -> None:
        self.transactions.append("abort")


def _sender(producer: FakeProducer) -> TransactionalSender:
    sender = TransactionalSender(
        "127.0.0.1:1",
        client_options={},
        producer_options={},
        client_id="test",
        transactional_id="test-txn",
        transaction_timeout_ms=10_000,
        group_id="test-group",
    )
    sender._producer = producer  # type: ignore[assignment]
    sender._open_sends()
    return sender


async def test_a_send_waiting_across_an_abort_is_dropped_not_put_in_the_next_transaction() -> None:
    """An agent's send waits (the topic's metadata) while the transaction is aborted: its
    event's task is lost and will be processed again, so the record must not land in the
    transaction that begins next (it would be committed twice)."""
    producer = FakeProducer()
    sender = _sender(producer)
    waiting = asyncio.create_task(sender.send(("out", b"k", b"v", 0, (), 1)))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await sender.abort()
    assert producer.transactions == ["abort", "begin"]
    producer.metadata.set()
    delivery = await waiting
    assert delivery.cancelled()
    await sender.send(("out", b"k2", b"v2", 1, (), 2))
    await sender._submit_all()
    sent = [
        (topic, partition, builder.record_count()) for topic, partition, builder in producer.batches
    ]
    assert sent == [("out", 1, 1)], "the dropped record reached the next transaction"


async def test_a_send_that_waited_without_an_abort_goes_into_the_transaction() -> None:
    producer = FakeProducer()
    sender = _sender(producer)
    waiting = asyncio.create_task(sender.send(("out", b"k", b"v", 0, (), 1)))
    await asyncio.sleep(0.01)
    producer.metadata.set()
    delivery = await waiting
    assert not delivery.cancelled()
    await sender._submit_all()
    assert [(t, p, b.record_count()) for t, p, b in producer.batches] == [("out", 0, 1)]


async def test_a_record_sent_while_a_commit_ends_the_transaction_goes_into_the_next() -> None:
    """The transactional sender's one hook into the send path: while sends are closed,
    send_now declines and send() holds the record; the next transaction sends it first."""
    producer = FakeProducer()
    producer.metadata.set()
    sender = _sender(producer)
    sender.close_sends()
    record = ("out", b"k", b"v", 1, (), 5)
    assert sender.send_now(record) is None
    held = await sender.send(record)
    assert not held.done() and producer.batches == []
    assert sender.counters.records_out == {"out": 1}
    await sender.begin()
    await sender._submit_all()
    assert [(t, p, b.record_count()) for t, p, b in producer.batches] == [("out", 1, 1)]
    assert producer.transactions == ["begin"]
    assert sender.send_now(("out", b"k2", b"v2", 1, (), 6)) is not None  # open again


class SilentAbortProducer(FakeProducer):
    """Its abort never finishes (a producer whose commit was given up, wedged)."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    async def abort_transaction(self) -> None:
        self.transactions.append("abort")
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.stopped = True


async def test_an_abort_the_producer_never_answers_replaces_the_producer(
    monkeypatch: Any,
) -> None:
    """After its transaction timeout an abort stops waiting: a new producer (whose
    InitProducerId fences the old one and ends what it left open) begins the next one."""
    wedged, fresh = SilentAbortProducer(), FakeProducer()

    async def started(options: Any) -> FakeProducer:
        return fresh

    monkeypatch.setattr("streamjoin.runtime.group.transaction.started_producer", started)
    sender = _sender(wedged)
    sender._abort_timeout = 0.05
    await asyncio.wait_for(sender.abort(), timeout=5)
    assert wedged.transactions == ["abort"] and wedged.stopped
    assert sender._producer is fresh and fresh.transactions == ["begin"]


async def test_an_abort_right_after_a_batch_opened_leaves_its_partition_able_to_send() -> None:
    """A record opens a partition's batch, which starts the partition's pump for the end of
    this event-loop turn; an abort in the same turn cancels that pump before it ever ran
    (so its own cleanup never ran either). The partition must still send in the next
    transaction: found in CI, where a worker that rejoined after a stall saw every
    transaction wait for "handing its record batches to the producer" until it was given
    up, again and again (tests/integration/test_exactly_once.py, the zombie test)."""
    producer = FakeProducer()
    producer.metadata.set()
    sender = _sender(producer)
    await sender.send(("out", b"k0", b"v0", 0, (), 0))  # (the partition's metadata)
    await sender._submit_all()
    producer.batches.clear()
    first = sender.send_now(("out", b"k", b"v", 0, (), 1))
    assert first is not None  # appended: the pump is due, not yet run
    await sender.abort()
    assert first.cancelled()
    second = sender.send_now(("out", b"k2", b"v2", 0, (), 2))
    assert second is not None
    await asyncio.wait_for(sender._submit_all(), timeout=5)
    assert [(t, p, b.record_count()) for t, p, b in producer.batches] == [("out", 0, 1)]


class StuckProducer(FakeProducer):
    """Never takes a batch (aiokafka waiting for room behind an unanswered one)."""

    async def send_batch(self, builder: BatchBuilder, topic: str, *, partition: int) -> Any:
        await asyncio.Event().wait()


async def test_a_commit_waiting_on_a_partition_says_which_and_where_its_pump_is() -> None:
    producer = StuckProducer()
    producer.metadata.set()
    sender = _sender(producer)
    await sender.send(("out", b"k", b"v", 1, (), 1))
    submitting = asyncio.create_task(sender._submit_all())
    await asyncio.sleep(0.01)
    assert not submitting.done()
    described = sender.describe_unhanded()
    assert described.startswith("out[1]: 0 full and 0 open batches")
    assert "one being handed over" in described
    assert "pump waiting in _pump:" in described and "> send_batch:" in described
    await sender.abort()  # (drops it: the commit that waited is over)
    await asyncio.wait_for(submitting, timeout=5)
    assert sender.describe_unhanded() == "none"
