"""The tracker app's trace through real rebalances: what the rebalance benchmark relies on.

Workers of tests/integration/apps/tracker.py count a live stream while a worker joins and
another leaves cleanly (dynamic members, so the leave is a LeaveGroup, not a session
timeout). The trace must show every produced event processed, no two processes on one
partition at once, no event processed twice and exact counts.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.rebalance_analysis import (
    by_partition,
    count_errors,
    duplicates,
    missing,
    overlaps,
    read_trace_dir,
    runs,
)
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import tracker_workers, wait_for_group

PARTITIONS = 6
RATE = 300  # events/s


async def produce_for(bootstrap: str, topic: str, seconds: float) -> None:
    """A steady, keyed stream for ``seconds``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    rng = random.Random(3)
    sent = 0
    started = time.monotonic()
    try:
        while (elapsed := time.monotonic() - started) < seconds:
            while sent < elapsed * RATE:
                await producer.send(topic, b"1", key=f"k{rng.randrange(300)}".encode())
                sent += 1
            await asyncio.sleep(0.01)
        await producer.flush()
    finally:
        await producer.stop()


async def end_offsets(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {(tp.topic, tp.partition): o for tp, o in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def test_clean_rebalances_leave_a_trace_without_overlaps_gaps_or_duplicates(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    workers = tracker_workers(kafka_bootstrap, unique_topic, tmp_path, PARTITIONS, SJT_STANDBYS="1")
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    await ensure_topics(kafka_bootstrap, [TopicSpec(source, PARTITIONS)])
    try:
        for name in ("a", "b"):
            workers.start(name, static=False)
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 2, workers)
        stream = asyncio.create_task(produce_for(kafka_bootstrap, source, 12.0))
        await asyncio.sleep(3)
        workers.start("c", static=False)
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 3, workers)
        await asyncio.sleep(2)
        assert await asyncio.to_thread(workers.stop, "a") == 0
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 2, workers)
        await stream
        ends = await end_offsets(kafka_bootstrap, source)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            records = read_trace_dir(tmp_path / "trace")
            done = {(r.tp, r.offset) for r in records}
            if all((tp, end - 1) in done for tp, end in ends.items() if end):
                break
            await asyncio.sleep(0.5)
    finally:
        workers.close()
    assert sum(ends.values()) >= 10 * RATE  # the producer kept (roughly) its rate
    assert len(by_partition(records)) == PARTITIONS
    assert missing(records, {tp: (0, end) for tp, end in ends.items()}) == {}, workers.logs()
    assert overlaps(runs(records)) == []
    assert duplicates(records) == []
    assert count_errors(records) == {}
    # the three processes (named by pid: dynamic members) all processed something
    assert len({r.member for r in records}) == 3
