"""Windowed tables through the in-memory driver: per-window values, hopping updates, expiry."""

from __future__ import annotations

import pytest

import streamjoin
from streamjoin.runtime.streams import AgentFailed, Stream
from streamjoin.state.windows import HoppingWindows, TumblingWindows
from streamjoin.testing.driver import TestDriver
from streamjoin.windowed import WindowedTable


async def test_tumbling_counts_per_window_and_expiry() -> None:
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=2)
    per_minute = app.table(
        "per-minute",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=60_000, retention_ms=120_000),
        copartitioned_with=clicks,
    )
    assert isinstance(per_minute, WindowedTable)

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            per_minute[event.key] += 1

    async with TestDriver(app) as driver:
        for ts in (1_000, 2_000, 61_000, 62_000, 63_000):
            await driver.put("clicks", key="ad", value=1, timestamp_ms=ts)
        await driver.drain()
        assert per_minute.windows_of("ad", 0, 120_000) == [(0, 2), (60_000, 3)]
        # stream time 300s: window [0, 60s) expired (60s + 120s retention <= 300s),
        # window [60s, 120s) too; the new event's window stays
        await driver.put("clicks", key="ad", value=1, timestamp_ms=300_000)
        await driver.drain()
        assert per_minute.windows_of("ad", 0, 400_000) == [(300_000, 1)]
        changelog = driver.raw_records("win-unit-per-minute-changelog")
        assert any(r.value is None for r in changelog)  # expiry deletes reach the changelog


async def test_hopping_windows_need_update() -> None:
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    sliding = app.table(
        "sliding",
        default=int,
        key_serializer="str",
        window=HoppingWindows(size_ms=10_000, step_ms=5_000, retention_ms=60_000),
        copartitioned_with=clicks,
    )

    @app.agent(clicks, name="counter")
    async def count(stream: Stream) -> None:
        async for event in stream:
            sliding.update(event.key, lambda n: n + 1)  # type: ignore[attr-defined]

    async with TestDriver(app) as driver:
        for ts in (6_000, 7_000, 12_000):
            await driver.put("clicks", key="k", value=1, timestamp_ms=ts)
        await driver.drain()
        # windows [0,10s), [5s,15s), [10s,20s)
        assert sliding.windows_of("k", 0, 20_000) == [(0, 2), (5_000, 3), (10_000, 1)]  # type: ignore[attr-defined]


async def test_hopping_item_assignment_is_refused() -> None:
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    sliding = app.table(
        "sliding",
        default=int,
        window=HoppingWindows(size_ms=10_000, step_ms=5_000, retention_ms=60_000),
        copartitioned_with=clicks,
    )

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            sliding[event.key] += 1

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value=1, timestamp_ms=6_000)
        with pytest.raises(AgentFailed, match=r"use table.update"):
            await driver.drain()
