"""The project-provisioned broker, exercised through aiokafka: topics, keyed produce, groups."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamjoin.errors import CopartitioningError
from streamjoin.local_kafka import LocalKafka, broker_answers_metadata, ephemeral_port_range
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import start_dev_command


async def test_broker_answers_metadata(kafka_bootstrap: str) -> None:
    assert await asyncio.to_thread(broker_answers_metadata, kafka_bootstrap)


async def test_keyed_records_round_trip_through_a_consumer_group(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic("orders")
    created = await ensure_topics(kafka_bootstrap, [TopicSpec(topic, partitions=4)])
    assert created == [topic]

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    sent: dict[bytes, set[int]] = {}
    try:
        for i in range(40):
            key = f"customer-{i % 10}".encode()
            meta = await producer.send_and_wait(topic, key=key, value=f"order-{i}".encode())
            sent.setdefault(key, set()).add(meta.partition)
    finally:
        await producer.stop()
    # The key partitioner is deterministic: one partition per key, several partitions used.
    assert all(len(parts) == 1 for parts in sent.values())
    assert len({p for parts in sent.values() for p in parts}) > 1

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=unique_topic("group"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    received: list[tuple[bytes, bytes, int]] = []
    try:
        while len(received) < 40:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                received.extend((r.key, r.value, r.partition) for r in records)
        await consumer.commit()
        assert consumer.assignment() and len(consumer.assignment()) == 4
    finally:
        await consumer.stop()
    assert sorted(v for _, v, _ in received) == sorted(f"order-{i}".encode() for i in range(40))
    for key, _, partition in received:
        assert sent[key] == {partition}


async def test_ensure_topics_is_idempotent_and_rejects_mismatched_counts(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic("clicks")
    assert await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 3)]) == [topic]
    assert await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 3)]) == []
    with pytest.raises(CopartitioningError, match=r"exists with 3 partitions.*declared with 6"):
        await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 6)])


def test_context_manager_starts_and_stops_its_own_broker() -> None:
    with LocalKafka() as kafka:
        assert kafka.running
        workdir = kafka.workdir
        assert workdir is not None and workdir.exists()
        assert broker_answers_metadata(kafka.bootstrap_servers)
        host = kafka.bootstrap_servers.split(":")[0]
        assert host == "127.0.0.1"
    assert not kafka.running
    assert not workdir.exists()


def test_dev_broker_cli_prints_address_and_stops_on_ctrl_c() -> None:
    proc, address = start_dev_command(["dev-broker"], "bootstrap servers: 127.0.0.1:")
    try:
        assert broker_answers_metadata(address)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_dev_broker(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    return start_dev_command(
        ["dev-broker", "--data-dir", str(data_dir)], "bootstrap servers: 127.0.0.1:"
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0


async def test_dev_broker_restarts_on_its_own_data_dir(tmp_path: Path) -> None:
    """Restarting on kept data used to fail formatting the storage with a new cluster id
    ("Invalid cluster.id in: .../meta.properties")."""
    data_dir = tmp_path / "kafka"
    low, high = ephemeral_port_range()
    proc, address = _start_dev_broker(data_dir)
    try:
        port = int(address.rsplit(":", 1)[1])
        assert not low <= port <= high, f"{port} is in the ephemeral range {low}-{high}"
        await ensure_topics(address, [TopicSpec("kept", partitions=2)])
        producer = AIOKafkaProducer(bootstrap_servers=address, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait("kept", b"still here", key=b"k", partition=1)
        finally:
            await producer.stop()
    finally:
        _stop(proc)
    proc, again = _start_dev_broker(data_dir)
    try:
        assert again == address  # the same ports, free again: clients reconnect as they were
        consumer = AIOKafkaConsumer(
            bootstrap_servers=again, group_id=None, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            tp = TopicPartition("kept", 1)
            consumer.assign([tp])
            batch = await consumer.getmany(tp, timeout_ms=10_000)
            values = [(r.key, r.value) for r in batch.get(tp, [])]
        finally:
            await consumer.stop()
        assert values == [(b"k", b"still here")]
    finally:
        _stop(proc)
