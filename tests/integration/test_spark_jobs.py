"""Spark jobs on the real broker: the demo join's backfill equals expected_joins; a
bootstrapped table is served by a worker that replays nothing from its changelog."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

import streamjoin
from examples.ad_monetization import ad_clicks
from examples.ad_traffic import GRACE_MS, WINDOW_MS, Traffic, generate
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

pytestmark = pytest.mark.spark
PARTITIONS = 10


def demo_app(
    bootstrap: str, unique_topic: Callable[..., str], how: str = "inner", fun: Any = ad_clicks
) -> streamjoin.App:
    """The ad-monetization join (same function, window, grace) on this test's topics."""
    app = streamjoin.App(unique_topic("adm"), broker=f"kafka://{bootstrap}")
    imp = app.topic(unique_topic("imp"), key_serializer="str", partitions=PARTITIONS)
    clk = app.topic(unique_topic("clk"), key_serializer="str", partitions=PARTITIONS)
    out = app.topic(unique_topic("att"), key_serializer="str", partitions=PARTITIONS)
    app.join(
        imp,
        clk,
        window=timedelta(milliseconds=WINDOW_MS),
        grace=timedelta(milliseconds=GRACE_MS),
        how=how,
        output=out,
        name="ad_clicks",
    )(fun)
    return app


def impression_clicks(
    auction_id: str, impression: dict[str, Any], click: dict[str, Any] | None
) -> dict[str, Any]:
    """The left join's output: every impression, with its click or None."""
    return {
        "auction_id": auction_id,
        "impression_id": impression["impression_id"],
        "click_id": click and click["click_id"],
    }


async def produce(
    bootstrap: str, records: list[tuple[str, str, bytes | None, int | None, int | None]]
) -> None:
    """(topic, key, value, timestamp_ms, partition) in order; partition None: keyed (murmur2)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for topic, key, value, ts, partition in records:
            await producer.send(
                topic, value, key=key.encode(), timestamp_ms=ts, partition=partition
            )
        await producer.flush()
    finally:
        await producer.stop()


async def produce_demo_traffic(bootstrap: str, decl: Any, auctions: int, seed: int) -> Traffic:
    """The demo's generated traffic, produced to the join's (new) input topics."""
    await ensure_topics(bootstrap, [TopicSpec(t.name, PARTITIONS) for t in (decl.left, decl.right)])
    traffic = generate(auctions, seed=seed)
    names = {"impressions": decl.left.name, "clicks": decl.right.name}
    await produce(
        bootstrap,
        [
            (names[r.topic], r.key, json.dumps(r.value).encode(), r.timestamp_ms, None)
            for r in traffic.records
        ],
    )
    return traffic


async def read_topic(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes, int]]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    out: list[tuple[int, bytes, bytes, int]] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=1500)
            if not batch:
                return out
            for records in batch.values():
                out.extend((r.partition, r.key, r.value, r.timestamp) for r in records)
    finally:
        await consumer.stop()


async def test_backfill_of_the_demo_join_produces_exactly_the_expected_joins(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    from streamjoin.spark import KafkaSink, backfill
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.spark.testing import shared_test_session

    app = demo_app(kafka_bootstrap, unique_topic)
    decl = app.joins["ad_clicks"]
    traffic = await produce_demo_traffic(kafka_bootstrap, decl, 1500, seed=11)
    spark = await asyncio.to_thread(shared_test_session)
    result = await asyncio.to_thread(
        backfill,
        app,
        "ad_clicks",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(decl.output.name),
        spark=spark,
    )
    out = await read_topic(kafka_bootstrap, decl.output.name)
    got = Counter(
        (v["auction_id"], v["impression_id"], v["click_id"])
        for v in (json.loads(value) for _, _, value, _ in out)
    )
    assert set(got) == traffic.expected_joins
    assert sum(got.values()) == len(traffic.expected_joins)  # no duplicates
    assert all(p == partition_for_key(k, PARTITIONS) for p, k, _, _ in out)
    assert result.records_read == len(traffic.records) and result.late == 0


async def test_left_join_backfill_split_beyond_the_partitions_equals_one_task_per_partition(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    """From Kafka, a left join run in 3 parts per partition writes the same records, in the same
    order per key, as one task per partition: its unmatched impressions included."""
    from streamjoin.spark import KafkaSink, backfill
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.spark.testing import shared_test_session

    app = demo_app(kafka_bootstrap, unique_topic, how="left", fun=impression_clicks)
    decl = app.joins["ad_clicks"]
    traffic = await produce_demo_traffic(kafka_bootstrap, decl, 1000, seed=13)
    spark = await asyncio.to_thread(shared_test_session)
    written: dict[int, list[tuple[int, bytes, bytes, int]]] = {}
    for parallelism in (1, 3 * PARTITIONS):
        topic = unique_topic(f"out{parallelism}")
        result = await asyncio.to_thread(
            backfill,
            app,
            "ad_clicks",
            source=KafkaSource(kafka_bootstrap),
            output=KafkaSink(topic),
            spark=spark,
            parallelism=parallelism,
        )
        assert result.tasks == max(parallelism, PARTITIONS)
        written[parallelism] = await read_topic(kafka_bootstrap, topic)

    def per_key(out: list[tuple[int, bytes, bytes, int]]) -> dict[bytes, list[tuple[Any, ...]]]:
        keys: dict[bytes, list[tuple[Any, ...]]] = {}
        for partition, key, value, ts in out:  # in offset order within each partition
            keys.setdefault(key, []).append((partition, value, ts))
        return keys

    one, split = written[1], written[3 * PARTITIONS]
    assert Counter(split) == Counter(one)
    assert per_key(split) == per_key(one)
    joined = [json.loads(value) for _, _, value, _ in one]
    matched = {
        (v["auction_id"], v["impression_id"], v["click_id"]) for v in joined if v["click_id"]
    }
    assert matched == traffic.expected_joins
    assert sum(1 for v in joined if v["click_id"] is None) > 0  # unmatched impressions emitted


@pytest.mark.parametrize("parallelism", [None, 2 * PARTITIONS])
async def test_backfill_refuses_topics_not_partitioned_by_murmur2(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, parallelism: int | None
) -> None:
    from streamjoin.errors import CopartitioningError
    from streamjoin.spark import FileSink, backfill
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.spark.testing import shared_test_session

    app = demo_app(kafka_bootstrap, unique_topic)
    decl = app.joins["ad_clicks"]
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(t.name, PARTITIONS) for t in (decl.left, decl.right)]
    )
    key = "auction-x"
    wrong = (partition_for_key(key.encode(), PARTITIONS) + 1) % PARTITIONS
    await produce(kafka_bootstrap, [(decl.left.name, key, b"{}", None, wrong)])
    spark = await asyncio.to_thread(shared_test_session)
    with pytest.raises(CopartitioningError, match="murmur2 places in partition"):
        await asyncio.to_thread(
            backfill,
            app,
            "ad_clicks",
            source=KafkaSource(kafka_bootstrap),
            output=FileSink(str(tmp_path / "out")),
            spark=spark,
            parallelism=parallelism,
        )


async def test_bootstrapped_table_is_served_without_changelog_replay(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.spark import bootstrap
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.spark.testing import shared_test_session

    partitions = 4
    state_dir = tmp_path / "state"
    app = streamjoin.App(
        unique_topic("boot"),
        broker=f"kafka://{kafka_bootstrap}",
        state_dir=state_dir,
        commit_interval=0.2,
    )
    source = app.topic(unique_topic("profiles"), key_serializer="str", partitions=partitions)
    table = app.topic_table(source, name="profiles")
    await ensure_topics(kafka_bootstrap, [TopicSpec(source.name, partitions)])
    history: list[tuple[str, str, bytes | None, int | None, int | None]] = []
    expected: dict[str, dict[str, int]] = {}
    for version in range(3):
        for i in range(60):
            user = f"user-{i}"
            if version == 2 and i % 5 == 0:
                history.append((source.name, user, None, None, None))  # deleted
                expected.pop(user, None)
            else:
                value = {"user": i, "version": version}
                history.append((source.name, user, json.dumps(value).encode(), None, None))
                expected[user] = value
    await produce(kafka_bootstrap, history)

    spark = await asyncio.to_thread(shared_test_session)
    result = await asyncio.to_thread(
        bootstrap,
        app,
        "profiles",
        source=KafkaSource(kafka_bootstrap),
        mode="rocksdb",
        state_dir=state_dir,
        spark=spark,
    )
    assert result.records_read == len(history) and result.keys == len(expected)
    assert sum(result.committed_source_offsets.values()) == len(history)

    async with app:
        deadline = time.monotonic() + 60
        while set(table.active_partitions()) != set(range(partitions)):
            assert time.monotonic() < deadline, "table partitions never became ready"
            await asyncio.sleep(0.2)
        worker = app._worker
        assert worker is not None and worker.state_service is not None
        assert worker.state_service.restored_records == 0
        for user, value in expected.items():
            assert table.get(user) == value
        for i in range(0, 60, 5):
            assert table.get(f"user-{i}") is None
