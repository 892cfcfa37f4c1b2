"""The producer's batch paths (sends, changelog flushes) on the real broker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streamjoin.codecs import JsonCodec, StrCodec
from streamjoin.errors import ConfigurationError, RecordTooLargeError
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.transport.out_batches import Sent
from streamjoin.runtime.transport.producer import KafkaSender
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.topics import Topic


async def _read_partition(
    bootstrap: str, tp: TopicPartition
) -> list[tuple[int, bytes, bytes | None]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[tuple[int, bytes, bytes | None]] = []
        while (await consumer.position(tp)) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                out.extend((r.offset, r.key, r.value) for r in records)
        return out
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def _running_sender(
    bootstrap: str, client_id: str, **producer_options: Any
) -> AsyncIterator[KafkaSender]:
    """A started ``KafkaSender`` with ``producer_options``, stopped when the block ends."""
    sender = KafkaSender(
        bootstrap, client_options={}, producer_options=producer_options, client_id=client_id
    )
    await sender.start()
    try:
        yield sender
    finally:
        await sender.stop()


async def test_send_many_spans_batches_in_order_and_reports_the_last_offset(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic("changelog")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)])
    # small batches: 3,000 records take many of them
    async with _running_sender(kafka_bootstrap, "send-many-test", max_batch_size=4096) as sender:
        first = [(f"k{i % 700}".encode(), f"v{i}".encode()) for i in range(3000)]
        last = await (await sender.send_many(topic, 1, first))
        assert last == 2999
        tombstones: list[tuple[bytes, bytes | None]] = [(b"k1", None), (b"k2", None)]
        assert await (await sender.send_many(topic, 1, tombstones)) == 3001
        # a record bigger than a batch goes in a batch of its own
        big = [(b"a", b"1"), (b"big", bytes(10_000)), (b"b", b"2")]
        assert await (await sender.send_many(topic, 0, big)) == 2
    got = await _read_partition(kafka_bootstrap, TopicPartition(topic, 1))
    assert got == [(i, k, v) for i, (k, v) in enumerate(first + tombstones)]
    got = await _read_partition(kafka_bootstrap, TopicPartition(topic, 0))
    assert got == [(i, k, v) for i, (k, v) in enumerate(big)]


async def test_sends_of_one_turn_share_a_batch_and_each_reads_its_own_metadata(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic("out")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 3)])
    # small batches: 2,000 records take many of them
    async with _running_sender(kafka_bootstrap, "send-test", max_batch_size=4096) as sender:
        first = await sender.send((topic, b"k", b"first", 1, [("h", b"1")], 1_000))
        assert isinstance(first, Sent) and not first.done()
        assert (await first).offset == 0  # awaiting a record gives its metadata
        sends = [
            await sender.send((topic, f"k{i}".encode(), f"v{i}".encode(), 1, (), 2_000 + i))
            for i in range(2000)
        ]
        batches = {id(sent.acknowledged) for sent in sends}
        assert 1 < len(batches) < 100  # records share batches: one future per batch
        seen: list[Sent] = []
        sends[5].add_done_callback(seen.append)
        metas = [await sent for sent in sends]
        assert [m.offset for m in metas] == list(range(1, 2001))
        assert {m.partition for m in metas} == {1}
        assert [m.timestamp for m in metas] == [2_000 + i for i in range(2000)]
        assert sends[7].done() and sends[7].exception() is None
        assert sends[7].result().offset == 8
        await asyncio.sleep(0)
        assert seen == [sends[5]]
        # keyed records without a partition go where every client puts them
        keyed = await sender.send((topic, b"user-1", b"x", None, (), None))
        keyed_meta = await keyed
        assert keyed_meta.partition == partition_for_key(b"user-1", 3)
        # records without key or partition stick to one partition for a batch
        loose = [await sender.send((topic, None, b"y", None, (), None)) for _ in range(20)]
        loose_metas = [await sent for sent in loose]
        assert len({meta.partition for meta in loose_metas}) == 1
        before_last = 2001 + sum(m.partition == 1 for m in [keyed_meta, *loose_metas])
        with pytest.raises(ConfigurationError, match="partition 7 is invalid"):
            await sender.send((topic, b"k", b"v", 7, (), None))
        with pytest.raises(RecordTooLargeError, match="max_request_size"):
            await sender.send((topic, b"k", bytes(2_000_000), 0, (), None))
        # a task awaiting a send can be cancelled without cancelling the record's batch
        pending = await sender.send((topic, b"k", b"last", 1, (), 0))
        waiter = asyncio.ensure_future(_await(pending))
        await asyncio.sleep(0)
        waiter.cancel()
        assert (await pending).offset == before_last
        await sender.flush()
    got = await _read_partition(kafka_bootstrap, TopicPartition(topic, 1))
    assert got[0] == (0, b"k", b"first")
    assert got[1:2001] == [(i + 1, f"k{i}".encode(), f"v{i}".encode()) for i in range(2000)]
    assert got[-1] == (len(got) - 1, b"k", b"last")


async def _await(sent: Sent) -> object:
    return await sent


async def test_try_send_appends_at_once_or_leaves_the_record_to_send(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    """``topic.try_send`` appends a record to its partition's open batch without awaiting;
    the first record of a batch, a full batch or an unknown partition count take the long
    way (``await topic.send``). Mixed, 2,000 keyed records arrive once each, in order."""
    name = unique_topic("try-send")
    await ensure_topics(kafka_bootstrap, [TopicSpec(name, 2)])
    unknown = Topic(name, StrCodec(), JsonCodec())
    topic = Topic(name, StrCodec(), JsonCodec(), partitions=2)
    # small batches: 2,000 records take many of them
    async with _running_sender(kafka_bootstrap, "try-send-test", max_batch_size=4096) as sender:
        for declared in (unknown, topic):
            declared.link.connect(sender, None)  # type: ignore[arg-type]  (no tables)
        assert unknown.partitions is None
        assert unknown.try_send(key="u0", value=0, timestamp_ms=1) is None  # count unknown
        deliveries = []
        at_once = 0
        for i in range(2000):
            key, value = f"u{i % 50}", {"n": i}
            sent = topic.try_send(key=key, value=value, timestamp_ms=1_000 + i)
            if sent is None:
                sent = await topic.send(key=key, value=value, timestamp_ms=1_000 + i)
            else:
                at_once += 1
            deliveries.append(sent)
        assert 1_800 < at_once < 2_000  # most join an open batch; each batch's first does not
        metas = [await sent for sent in deliveries]
    expected: dict[int, list[tuple[bytes, bytes]]] = {0: [], 1: []}
    for i in range(2000):
        key = f"u{i % 50}".encode()
        expected[partition_for_key(key, 2)].append((key, b'{"n":%d}' % i))
    for partition in (0, 1):
        got = await _read_partition(kafka_bootstrap, TopicPartition(name, partition))
        assert [(k, v) for _, k, v in got] == expected[partition]
        assert sorted(m.offset for m in metas if m.partition == partition) == [o for o, _, _ in got]


async def test_a_flush_and_a_changelog_flush_do_not_wait_out_the_linger(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    """A commit's flushes send what the producer holds at once: a linger far longer than
    the test's patience would otherwise hold each of them for its whole length."""
    topic = unique_topic("lingering")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)])
    async with _running_sender(kafka_bootstrap, "linger-test", linger_ms=60_000) as sender:
        sent = [await sender.send((topic, b"k", f"v{i}".encode(), 0, (), None)) for i in range(3)]
        await asyncio.wait_for(sender.flush(), timeout=20)
        assert [(await s).offset for s in sent] == [0, 1, 2]
        records: list[tuple[bytes, bytes | None]] = [(b"c", b"1"), (b"c", b"2")]
        last = await asyncio.wait_for(await sender.send_many(topic, 1, records), timeout=20)
        assert last == 1
    got = await _read_partition(kafka_bootstrap, TopicPartition(topic, 0))
    assert got == [(i, b"k", f"v{i}".encode()) for i in range(3)]
