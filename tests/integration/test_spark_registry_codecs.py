"""The Spark twin with schema-registry codecs, real broker and real registry: a stream-table
backfill reading Avro clicks and Protobuf profiles and writing Avro writes what a worker
writes over the same topics (the codecs, their registry clients and a Protobuf class built
at run time pickled to the executors, their caches filled again there)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import streamjoin
from streamjoin.codecs import Codec
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.schema_registry import AvroCodec, ProtobufCodec, SchemaRegistryClient
from tests.integration.test_spark_table_joins import BASE_MS, PARTITIONS

pytestmark = pytest.mark.spark

CLICK = '{"type": "record", "name": "Click", "fields": [{"name": "n", "type": "long"}]}'
ENRICHED = (
    '{"type": "record", "name": "Enriched", "fields": [{"name": "user", "type": "string"}, '
    '{"name": "click", "type": "long"}, {"name": "tier", "type": ["null", "long"]}]}'
)


def _profile_class() -> Any:
    """A Protobuf ``Profile {int64 tier = 1;}`` built at run time (no importable module)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="sparkreg/profile.proto", package="sparkreg", syntax="proto3"
    )
    message = file.message_type.add(name="Profile")
    message.field.add(name="tier", number=1, type=3, label=1)  # int64
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("sparkreg.Profile"))


def enrich(user: str, click: dict[str, Any], profile: Any) -> dict[str, Any]:
    return {"user": user, "click": click["n"], "tier": None if profile is None else profile.tier}


async def _read(bootstrap: str, topic: str, codec: Codec) -> list[tuple[int, str, Any, bytes]]:
    """(partition, key, decoded value, raw value) of every record."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[tuple[int, str, Any, bytes]] = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out += [
                    (r.partition, r.key.decode(), codec.loads(r.value), r.value) for r in records
                ]
        return out
    finally:
        await consumer.stop()


async def test_backfill_with_avro_and_protobuf_values_writes_what_a_worker_writes(
    kafka_bootstrap: str, schema_registry_url: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.spark import KafkaSink, KafkaSource, backfill
    from streamjoin.spark.testing import shared_test_session

    registry = SchemaRegistryClient(schema_registry_url)
    profile_class = _profile_class()
    app = streamjoin.App(
        unique_topic("sreg"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path / "state",
    )
    clicks = app.topic(
        unique_topic("clicks"),
        key_serializer="str",
        value_serializer=AvroCodec(CLICK, registry),
        partitions=PARTITIONS,
    )
    profiles = app.topic(
        unique_topic("profiles"),
        key_serializer="str",
        value_serializer=ProtobufCodec(profile_class, registry),
        partitions=PARTITIONS,
    )
    out = app.topic(
        unique_topic("enriched"),
        key_serializer="str",
        value_serializer=AvroCodec(ENRICHED, registry),
        partitions=PARTITIONS,
    )
    table = app.topic_table(profiles, name="profiles")
    app.join(clicks, table, how="left", output=out, name="enrich")(enrich)
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(t.name, PARTITIONS) for t in (clicks, profiles, out)]
    )

    rng = random.Random(5)
    records: list[tuple[str, str, bytes | None, int]] = []
    ts, n = BASE_MS, 0
    for _ in range(300):
        ts += rng.choice([0, 1, 5, 20])
        user = f"u{rng.randrange(20)}"
        if rng.random() < 0.3:
            profile = None if rng.random() < 0.2 else profile_class(tier=rng.randrange(3))
            records.append((profiles.name, user, profiles.value_codec.dumps(profile), ts))
        else:
            n += 1
            records.append((clicks.name, user, clicks.value_codec.dumps({"n": n}), ts))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for topic, key, value, stamp in records:
            await producer.send(topic, value, key=key.encode(), timestamp_ms=stamp)
        await producer.flush()
    finally:
        await producer.stop()

    async with app:
        await wait_for_outputs_framed(kafka_bootstrap, out.name, n, out.value_codec)
    worker_out = await _read(kafka_bootstrap, out.name, out.value_codec)
    assert len(worker_out) == n
    assert any(v["tier"] is None for _, _, v, _ in worker_out)
    assert any(v["tier"] is not None for _, _, v, _ in worker_out)

    spark = await asyncio.to_thread(shared_test_session)
    target = unique_topic("enriched-backfill")
    result = await asyncio.to_thread(
        backfill,
        app,
        "enrich",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(target),
        spark=spark,
    )
    assert result.records_read == len(records) and result.outputs == n
    backfilled = await _read(kafka_bootstrap, target, out.value_codec)
    # the same records, byte for byte (same schema id), in the same partitions
    assert Counter((p, k, raw) for p, k, _, raw in backfilled) == Counter(
        (p, k, raw) for p, k, _, raw in worker_out
    )


async def wait_for_outputs_framed(
    bootstrap: str, topic: str, count: int, codec: Codec, timeout: float = 90
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(await _read(bootstrap, topic, codec)) < count:
        assert loop.time() < deadline, f"{topic}: fewer than {count} outputs"
        await asyncio.sleep(0.5)
