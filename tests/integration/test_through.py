"""``app.through`` (Faust's ``stream.through``) on the real broker under exactly-once: every
record of a 2-partition topic forwarded once into a 5-partition one, keyed as before (so in
``murmur2(key) % 5``); an agent reading the new topic sees each once. (Headers and
timestamps: tests/unit/test_stream_ops.py.)"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer

import streamjoin
from streamjoin.partitioner import partition_for_key
from streamjoin.stream import Stream
from tests.integration.support import produce

RECORDS = 200


async def _read_committed(bootstrap: str, topic: str, n: int) -> list[tuple[int, str, str]]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        isolation_level="read_committed",
    )
    await consumer.start()
    got: list[tuple[int, str, str]] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                got += [(tp.partition, r.key.decode(), r.value.decode()) for r in records]
        got += [
            (tp.partition, r.key.decode(), r.value.decode())
            for tp, records in (await consumer.getmany(timeout_ms=1_000)).items()
            for r in records
        ]
    finally:
        await consumer.stop()
    return got


async def test_through_forwards_every_record_once_into_more_partitions(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    source, wide = unique_topic("through-src"), unique_topic("through-wide")
    app = streamjoin.App(
        unique_topic("through"),
        broker=f"kafka://{kafka_bootstrap}",
        processing_guarantee="exactly_once",
        commit_interval=0.2,
        state_dir=tmp_path,
        topic_partitions=2,
        key_serializer="str",
        value_serializer="str",
    )
    target = app.through(app.topic(source), wide, partitions=5)
    seen: Counter[str] = Counter()
    all_seen = asyncio.Event()

    @app.agent(target)
    async def read(stream: Stream) -> None:
        async for value in stream.values():
            seen[value] += 1
            if seen.total() >= RECORDS:
                all_seen.set()

    records = [(f"k{i % 13}", f"v{i}") for i in range(RECORDS)]
    async with app:
        await produce(kafka_bootstrap, source, records)
        forwarded = await _read_committed(kafka_bootstrap, wide, RECORDS)
        await asyncio.wait_for(all_seen.wait(), timeout=20)
    assert sorted(v for _, _, v in forwarded) == sorted(v for _, v in records)  # each once
    keys = {v: k for k, v in records}
    assert all(keys[v] == k for _, k, v in forwarded)
    assert all(p == partition_for_key(k.encode(), 5) for p, k, _ in forwarded)
    assert seen == Counter(v for _, v in records)
