"""The local 3-broker cluster through real brokers: replication of what streamjoin creates,
and an acknowledged record surviving the kill of its partition leader."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

import streamjoin
from streamjoin.errors import KafkaProvisioningError
from streamjoin.local_cluster import LocalKafkaCluster
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics


async def _min_insync_replicas(bootstrap: str, topics: list[str]) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, t, {"min.insync.replicas": None})
                for t in topics
            ]
        )
    finally:
        await admin.close()
    out = {}
    for response in responses:
        for _code, _message, _type, name, entries in response.resources:
            for config_name, value, *_ in entries:
                if config_name == "min.insync.replicas":
                    out[name] = value
    return out


async def _new_leader(cluster: LocalKafkaCluster, topic: str, old: int, timeout: float) -> int:
    """The partition's leader once it is not ``old`` (the controller fences a killed broker
    after its session timeout, then elects a leader among the in-sync replicas)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            leader = await asyncio.to_thread(cluster.leader_of, topic, 0)
            if leader != old:
                return leader
        except KafkaProvisioningError:
            pass  # no leader for a moment
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}-0 still led by killed node {old} after {timeout}s")
        await asyncio.sleep(0.2)


async def test_an_acknowledged_record_survives_the_kill_of_its_leader(
    kafka_cluster: LocalKafkaCluster, unique_topic: Callable[..., str]
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = unique_topic("survivor")
    await ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    assert sorted(await asyncio.to_thread(kafka_cluster.replicas_of, topic, 0)) == [1, 2, 3]
    assert await _min_insync_replicas(bootstrap, [topic]) == {topic: "2"}

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"before", key=b"k")
    finally:
        await producer.stop()
    leader = await asyncio.to_thread(kafka_cluster.leader_of, topic, 0)
    killed = kafka_cluster.nodes[leader]
    try:
        await asyncio.to_thread(killed.kill)
        assert not killed.running
        new_leader = await _new_leader(kafka_cluster, topic, leader, timeout=30)
        running = ",".join(n.bootstrap_servers for n in kafka_cluster.nodes.values() if n.running)
        # two replicas left, min.insync.replicas=2: acks=all writes still succeed
        producer = AIOKafkaProducer(bootstrap_servers=running, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"after", key=b"k")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=running, group_id=None, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            values: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(values) < 2 and time.monotonic() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                values.extend(r.value for r in batch.get(tp, []) if r.value is not None)
        finally:
            await consumer.stop()
        assert values == [b"before", b"after"], f"read from new leader {new_leader}"
    finally:
        if not killed.running:
            await asyncio.to_thread(killed.start)  # the same ports and data
        await asyncio.to_thread(kafka_cluster.wait_until_healthy, 60)
    assert killed.running  # and wait_until_healthy saw it back in sync for every partition


async def test_a_workers_internal_topics_get_three_replicas_and_min_isr_two(
    kafka_cluster: LocalKafkaCluster,
    unique_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    app_id = unique_topic("repl")
    events = unique_topic("events")
    app = streamjoin.App(app_id, broker=f"kafka://{bootstrap}", state_dir=tmp_path / "state")
    source = app.topic(events, key_serializer="str", value_serializer="str", partitions=2)
    by_value = app.group_by(source, lambda e: e.value, name="by-value", partitions=2)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=by_value)
    legacy = app.table("legacy", default=int, key_serializer="str", copartitioned_with=by_value)

    @app.agent(by_value, name="count")
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1
            legacy[event.key] += 1

    # a changelog made earlier with one copy: the worker says so (and leaves it alone)
    await ensure_topics(
        bootstrap,
        [
            TopicSpec(
                legacy.changelog.name, 2, replication_factor=1, config={"cleanup.policy": "compact"}
            )
        ],
    )
    with caplog.at_level(logging.WARNING, logger="streamjoin.worker"):
        await app.start()
        await app.stop()
    created = [counts.changelog.name, by_value.name]
    for name in created:
        for partition in (0, 1):
            replicas = await asyncio.to_thread(kafka_cluster.replicas_of, name, partition)
            assert len(replicas) == 3, (name, replicas)
    assert await _min_insync_replicas(bootstrap, created) == {name: "2" for name in created}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if legacy.changelog.name in w] == [
        f"topic {legacy.changelog.name!r} has replication factor 1 on a cluster of 3 brokers: "
        "losing one broker loses its data. Stop the app's workers, delete the topic "
        "(streamjoin creates it again with 3 replicas) or add replicas with "
        "kafka-reassign-partitions"
    ]
