"""Aggregations on Spark through the real broker: a backfill equals what a worker sent for
the same topic, and a worker starting on a bootstrapped windowed table carries on exactly
(its final results are those of one run over the whole history, minus those the history
alone had closed)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

import streamjoin
from streamjoin.aggregations import Collect, Count, Sum
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.spark.aggregation_runner import AggregationRunner
from streamjoin.state.windows import SessionWindows, TumblingWindows

pytestmark = pytest.mark.spark
PARTITIONS = 3

#: a sent record: (partition, key, value, timestamp, headers)
Sent = tuple[int, bytes, bytes, int, tuple[tuple[str, bytes], ...]]


def orders(seed: int, count: int, base: int) -> list[tuple[str, bytes, int]]:
    """(key, value, timestamp) of ``count`` orders of 8 users, out of order by up to 6 s
    (some later than the grace)."""
    rng = random.Random(seed)
    return [
        (
            f"user-{rng.randrange(8)}",
            json.dumps({"amount": rng.randrange(100)}).encode(),
            base + i * 300 - rng.randrange(6_000),
        )
        for i in range(count)
    ]


async def produce(bootstrap: str, topic: str, records: list[tuple[str, bytes, int]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for key, value, ts in records:
            await producer.send(topic, value, key=key.encode(), timestamp_ms=ts)
        await producer.flush()
    finally:
        await producer.stop()


async def read_sent(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[Sent]:
    """Everything in ``topic`` once it holds ``expected`` records, and a moment longer (so
    an extra record would be seen too)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    out: list[Sent] = []
    deadline = time.monotonic() + timeout
    quiet_until: float | None = None
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                out.extend(
                    (r.partition, r.key, r.value, r.timestamp, tuple(r.headers)) for r in records
                )
            if len(out) >= expected:
                quiet_until = quiet_until or time.monotonic() + 1.5
                if time.monotonic() >= quiet_until:
                    break
        return out
    finally:
        await consumer.stop()


def make_app(
    bootstrap: str, unique_topic: Callable[..., str], window: Any, emit: str, **settings: Any
) -> streamjoin.App:
    app = streamjoin.App(
        unique_topic("aggspark"), broker=f"kafka://{bootstrap}", commit_interval=0.2, **settings
    )
    source, results = unique_topic("orders"), unique_topic("results")
    for name in (source, results):
        app.topic(name, key_serializer="str", value_serializer="json", partitions=PARTITIONS)
    app.aggregate(
        source,
        window=window,
        agg={"n": Count(), "total": Sum("amount"), "amounts": Collect("amount")},
        name="totals",
        emit=emit,  # type: ignore[arg-type]
        emit_to=results,
    )
    return app


async def test_backfill_equals_what_a_worker_sent(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.spark import KafkaSink, backfill
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.spark.testing import shared_test_session

    app = make_app(
        kafka_bootstrap,
        unique_topic,
        SessionWindows(gap_ms=1_000, grace_ms=2_000),
        "update",
        state_dir=tmp_path / "state",
    )
    decl = app.aggregations["totals"]
    assert decl.emit_to is not None
    source, results = decl.source.name, decl.emit_to.name
    history = orders(seed=5, count=300, base=1_700_000_000_000)
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(source, PARTITIONS), TopicSpec(results, PARTITIONS)]
    )
    await produce(kafka_bootstrap, source, history)

    spark = await asyncio.to_thread(shared_test_session)
    backfilled = unique_topic("backfilled")
    result = await asyncio.to_thread(
        backfill,
        app,
        "totals",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(backfilled),
        spark=spark,
    )
    assert result.records_read == len(history) and result.late > 0
    want = await read_sent(kafka_bootstrap, backfilled, result.outputs)
    assert len(want) == result.outputs
    async with app:
        got = await read_sent(kafka_bootstrap, results, len(want))
    assert Counter(got) == Counter(want)
    # in the order the worker sent them, per key
    for key in {k for _, k, _, _, _ in want}:
        assert [r for r in got if r[1] == key] == [r for r in want if r[1] == key]


async def test_a_worker_carries_on_from_a_bootstrapped_table(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.spark import bootstrap
    from streamjoin.spark.sources import KafkaSource
    from streamjoin.spark.testing import shared_test_session

    window = TumblingWindows(size_ms=5_000, grace_ms=2_000)
    state_dir = tmp_path / "state"
    app = make_app(kafka_bootstrap, unique_topic, window, "close", state_dir=state_dir)
    decl = app.aggregations["totals"]
    assert decl.table.emit_to is not None
    source, results = decl.source.name, decl.table.emit_to.name
    base = 1_700_000_000_000
    history = orders(seed=6, count=200, base=base)
    later = orders(seed=7, count=100, base=base + 200 * 300)
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(source, PARTITIONS), TopicSpec(results, PARTITIONS)]
    )
    await produce(kafka_bootstrap, source, history)

    spark = await asyncio.to_thread(shared_test_session)
    result = await asyncio.to_thread(
        bootstrap,
        app,
        "totals",
        source=KafkaSource(kafka_bootstrap),
        mode="rocksdb",
        state_dir=state_dir,
        spark=spark,
    )
    assert result.records_read == len(history) and result.keys > 0
    assert sum(result.committed_source_offsets.values()) == len(history)

    # what one worker would send over the whole history, minus what the history closed
    runner = AggregationRunner.for_aggregation(app.config, decl, PARTITIONS)

    def final_results(records: list[tuple[str, bytes, int]]) -> Counter[Sent]:
        sent: Counter[Sent] = Counter()
        for p in range(PARTITIONS):
            log = [r for r in records if partition_for_key(r[0].encode(), PARTITIONS) == p]
            mine = [(k.encode(), v, ts, offset) for offset, (k, v, ts) in enumerate(log)]
            for out in runner.run(p, mine):
                assert out.key is not None and out.value is not None
                sent[(out.partition, out.key, out.value, out.timestamp_ms, out.headers)] += 1
        return sent

    want = final_results(history + later) - final_results(history)
    assert want, "the later records close some windows"
    async with app:
        worker = app._worker
        assert worker is not None and worker.state_service is not None
        await produce(kafka_bootstrap, source, later)
        got = await read_sent(kafka_bootstrap, results, sum(want.values()))
        assert worker.state_service.restored_records == 0
    assert Counter(got) == want
