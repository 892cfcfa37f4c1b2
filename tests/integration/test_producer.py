"""The producer's batch path (changelog flushes) on the real broker."""

from __future__ import annotations

from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from streamjoin.runtime.admin import TopicSpec, ensure_topics
from streamjoin.runtime.producer import KafkaSender


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


async def test_send_many_spans_batches_in_order_and_reports_the_last_offset(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic("changelog")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)])
    # small batches: 3,000 records take many of them
    sender = KafkaSender(
        kafka_bootstrap,
        client_options={},
        producer_options={"max_batch_size": 4096},
        client_id="send-many-test",
    )
    await sender.start()
    try:
        first = [(f"k{i % 700}".encode(), f"v{i}".encode()) for i in range(3000)]
        last = await (await sender.send_many(topic, 1, first))
        assert last == 2999
        tombstones: list[tuple[bytes, bytes | None]] = [(b"k1", None), (b"k2", None)]
        assert await (await sender.send_many(topic, 1, tombstones)) == 3001
        # a record bigger than a batch goes in a batch of its own
        big = [(b"a", b"1"), (b"big", bytes(10_000)), (b"b", b"2")]
        assert await (await sender.send_many(topic, 0, big)) == 2
    finally:
        await sender.stop()
    got = await _read_partition(kafka_bootstrap, TopicPartition(topic, 1))
    assert got == [(i, k, v) for i, (k, v) in enumerate(first + tombstones)]
    got = await _read_partition(kafka_bootstrap, TopicPartition(topic, 0))
    assert got == [(i, k, v) for i, (k, v) in enumerate(big)]
