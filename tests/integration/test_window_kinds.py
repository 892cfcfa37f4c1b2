"""Window units, retention and Faust's reading API on the real broker: a windowed table
declared with timedeltas that never expires, read through relative_to_* views in an agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import TumblingWindows
from tests.integration.support import committed_offsets

HOUR = 3_600_000


async def test_windows_that_never_expire_read_as_faust_reads_them(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app_id, source = unique_topic("win-kinds"), unique_topic("clicks")
    app = streamjoin.App(
        app_id,
        broker=f"kafka://{kafka_bootstrap}",
        state_dir=str(tmp_path / "state"),
        commit_interval=0.2,
    )
    clicks = app.topic(source, key_serializer="str", value_serializer="json", partitions=2)
    per_minute = app.table(
        "per-minute",
        default=int,
        key_serializer="str",
        window=TumblingWindows(timedelta(minutes=1), retention=None),
        copartitioned_with=clicks,
    )
    reads: list[tuple[Any, ...]] = []

    @app.agent(clicks, name="count")
    async def count(stream: Stream) -> None:
        async for event in stream:
            per_minute[event.key] += 1
            windows = per_minute.relative_to_stream()[event.key]
            reads.append(
                (
                    event.key,
                    event.timestamp,
                    windows.current(),
                    windows.delta(timedelta(hours=10)),
                    per_minute.relative_to_field("minute_ago")[event.key].value(),
                )
            )

    sent = [("a", 1_000), ("a", 2_000), ("b", 3_000), ("a", 10 * HOUR + 1_000)]
    async with app:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for key, ts in sent:
                value = b'{"minute_ago": %d}' % max(ts - 60_000, 0)
                await producer.send_and_wait(source, value, key=key.encode(), timestamp_ms=ts)
        finally:
            await producer.stop()
        for _ in range(240):
            if sum(await committed_offsets(kafka_bootstrap, app_id, source, 2)) >= len(sent):
                break
            await asyncio.sleep(0.25)
        else:
            raise AssertionError("the clicks were never committed")
        # retention=None: ten hours of stream time later, minute 0 is still there (the
        # default retention, size + grace, would have deleted it at the first flush)
        assert per_minute.windows_of("a", 0, 11 * HOUR) == [(0, 2), (10 * HOUR, 1)]
        assert (
            per_minute.relative_to_stream()["a"].value(
                streamjoin.Event("a", {}, source, 0, 0, 30_000)
            )
            == 2
        )
    assert sorted(reads) == [
        ("a", 1_000, 1, 0, 1),
        ("a", 2_000, 2, 0, 2),
        ("a", 10 * HOUR + 1_000, 1, 2, 0),
        ("b", 3_000, 1, 0, 1),
    ]
