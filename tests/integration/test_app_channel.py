"""An in-memory channel on the real broker: an agent on a topic sends every event to a
channel (small, so senders wait for room), whose agent writes it to an output topic. Every
record arrives, with its key, once (no fault here: a channel is at-most-once under faults,
see docs/app.md)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import streamjoin
from streamjoin.stream import Stream
from tests.integration.support import produce, read_to_end

RECORDS = 300


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_topic_agent_feeds_a_channel_agent_writing_a_topic(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    source_name, out_name = unique_topic("source"), unique_topic("out")
    app = streamjoin.App(
        unique_topic("chan"),
        broker=f"kafka://{kafka_bootstrap}",
        processing_guarantee=guarantee,
        commit_interval=0.2,
        state_dir=tmp_path,
        topic_partitions=2,
        key_serializer="str",
        value_serializer="str",
    )
    source = app.topic(source_name)
    out = app.topic(out_name, partitions=1)
    channel = app.channel("work", maxsize=8)

    @app.agent(channel)
    async def write(stream: Stream) -> None:
        async for event in stream:
            await out.send(key=event.key, value=f"{event.value}@{event.topic}")

    @app.agent(source)
    async def feed(stream: Stream) -> None:
        async for event in stream:
            await channel.send(key=event.key, value=event.value)

    records = [(f"k{i % 7}", f"v-{i}") for i in range(RECORDS)]
    expected = {(key, f"{value}@work") for key, value in records}
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    async with app:
        await produce(kafka_bootstrap, source_name, records)
        deadline = time.monotonic() + 15
        while True:
            got = await read_to_end(kafka_bootstrap, out_name, 1, isolation, timeout=10)
            if expected <= set(got) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
    counts = Counter(got)
    missing = expected - set(counts)
    duplicated = sum(n - 1 for n in counts.values())
    print(f"{guarantee}: {len(got)} records out, {len(missing)} missing, {duplicated} duplicated")
    assert not missing, f"{len(missing)} missing, e.g. {sorted(missing)[:5]}"
    assert set(counts) == expected and duplicated == 0
    assert channel.sent == RECORDS and channel.processed == RECORDS and channel.dropped == 0
