"""Windowed tables through the in-memory driver: per-window values, hopping updates, expiry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import streamjoin
from streamjoin.errors import TableAccessError
from streamjoin.joins.core import JoinInput, JoinSpec, StreamStreamJoin
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.runtime.streams import AgentFailed, Stream
from streamjoin.state import window_layout as layout
from streamjoin.state.keys import encode_uint64, length_prefixed
from streamjoin.state.table_partition import TablePartition
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


def counting_app(
    size_ms: int = 10_000, retention_ms: int = 10_000
) -> tuple[streamjoin.App, WindowedTable]:
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    table = app.table(
        "counts",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=size_ms, retention_ms=retention_ms),
        copartitioned_with=clicks,
    )
    assert isinstance(table, WindowedTable)

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            table[event.key] += 1

    return app, table


async def test_a_window_is_kept_until_stream_time_reaches_end_plus_retention() -> None:
    app, table = counting_app(size_ms=10_000, retention_ms=10_000)
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value=1, timestamp_ms=0)
        await driver.put("clicks", key="other", value=1, timestamp_ms=19_999)
        await driver.drain()
        assert table.windows_of("k", 0, 100_000) == [(0, 1)]  # 19_999 < 10_000 + 10_000
        await driver.put("clicks", key="other", value=1, timestamp_ms=20_000)
        await driver.drain()
        assert table.windows_of("k", 0, 100_000) == []
        assert table.windows_of("other", 0, 100_000) == [(10_000, 1), (20_000, 1)]


async def test_keys_that_extend_each_other_keep_their_own_windows() -> None:
    app, table = counting_app(size_ms=10, retention_ms=1_000_000)
    async with TestDriver(app) as driver:
        for key in ("a", "ab", "", "a\x00", "b"):
            for ts in (50, 0, 10, 15, 10_000):
                await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()
        assert table.windows_of("a", 0, 2**64 - 1) == [(0, 1), (10, 2), (50, 1), (10_000, 1)]
        assert table.windows_of("a", 10, 50) == [(10, 2), (50, 1)]
        assert table.windows_of("a", 11, 49) == []
        assert table.windows_of("a", 50, 10) == []
        assert table.windows_of("", -5, 0) == [(0, 1)]
        assert table.windows_of("zz", 0, 2**64 - 1) == []
        assert sorted(table.local_items()) == sorted(
            ((key, start), n)
            for key in ("a", "ab", "", "a\x00", "b")
            for start, n in ((0, 1), (10, 2), (50, 1), (10_000, 1))
        )


async def test_stored_keys_follow_the_window_layout() -> None:
    app, table = counting_app(size_ms=10_000, retention_ms=10_000)
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value=1, timestamp_ms=12_345)
        await driver.drain()
        stored = dict(table.active_partition(0).store.items())
        key = table.key_codec.dumps("k")
        assert stored == {
            layout.STREAM_TIME_KEY: encode_uint64(12_345),  # u64, not ASCII
            layout.index_key(10_000, length_prefixed(key)): b"",
            layout.data_key(key, 10_000): table.value_codec.dumps(1),
        }
        # and what the changelog carries: the same keys
        changelog = driver.raw_records("win-unit-counts-changelog")
        assert {r.key for r in changelog} == set(stored)


async def test_expiry_reads_only_the_expired_index_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, table = counting_app(size_ms=10, retention_ms=10)
    async with TestDriver(app) as driver:
        for ts in range(0, 1_000, 10):
            for key in ("a", "b"):
                await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()
        assert len(table.windows_of("a", 0, 10_000)) == 2  # 980, 990: the others expired

        index_rows = 0
        real_scan = TablePartition.scan

        def counting_scan(
            view: TablePartition, start: bytes, end: bytes | None
        ) -> Iterator[tuple[bytes, bytes]]:
            nonlocal index_rows
            for row in real_scan(view, start, end):
                if start.startswith(layout.INDEX):
                    index_rows += 1
                yield row

        monkeypatch.setattr(TablePartition, "scan", counting_scan)
        # stream time 1000: the windows starting at 980 expire (980 + 10 + 10 <= 1000)
        await driver.put("clicks", key="c", value=1, timestamp_ms=1_000)
        await driver.drain()
        assert table.windows_of("a", 0, 10_000) == [(990, 1)]
        assert index_rows == 2  # the two windows starting at 980, nothing else


async def test_windowed_tables_and_join_buffers_share_the_namespaces() -> None:
    app, table = counting_app()
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value=1, timestamp_ms=5_000)
        await driver.drain()
        table_keys = [k for k, _ in table.active_partition(0).store.items()]
    join_view = MemoryKeyValueView()
    join = StreamStreamJoin(JoinSpec(window_ms=10, grace_ms=0), join_view)
    join.process(JoinInput("left", b"k", b"v", 5_000, 1))
    join_keys = list(join_view.snapshot())

    def namespaces(keys: list[bytes]) -> dict[bytes, bytes]:
        """What each namespace byte holds: metadata, the index, the data."""
        out: dict[bytes, bytes] = {}
        for key in keys:
            if key in (layout.STREAM_TIME_KEY, layout.JOIN_STATE_KEY):
                out[key[:1]] = b"meta"
            elif key.startswith(layout.INDEX):
                layout.split_index_key(key)
                out[key[:1]] = b"index"
            else:
                space = 1 if key in join_keys else 0
                layout.split_data_key(key, space, 8 * space)
                out[key[:1]] = b"data"
        return out

    expected = {layout.META: b"meta", layout.INDEX: b"index", layout.DATA: b"data"}
    assert namespaces(table_keys) == namespaces(join_keys) == expected


async def test_state_of_the_earlier_layout_is_refused() -> None:
    """Before the shared layout, stream time was ASCII under b"\\x02stream-time"."""
    app, table = counting_app()
    async with TestDriver(app) as driver:
        table.view(0).put(layout.LEGACY_TABLE_STREAM_TIME_KEY, b"300000")
        with pytest.raises(layout.IncompatibleWindowState, match=r"'counts' partition 0.*reset"):
            table.expire()
        await driver.put("clicks", key="k", value=1, timestamp_ms=5_000)
        with pytest.raises(AgentFailed, match=r"must be reset"):
            await driver.drain()


async def test_reading_a_window_outside_an_agent_points_to_windows_of() -> None:
    app, table = counting_app()
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value=1, timestamp_ms=1_000)
        await driver.drain()
        for read in (lambda: table["k"], lambda: table.get("k"), lambda: "k" in table):
            with pytest.raises(TableAccessError) as caught:
                read()
            message = str(caught.value)
            assert "table.windows_of(key, from_ms, to_ms)" in message, message
            assert "windows(" not in message.replace("windows_of(", ""), message
        # ... and what it points to answers
        assert table.windows_of("k", 0, 20_000) == [(0, 1)]


async def test_get_and_in_read_the_current_events_window_inside_agents() -> None:
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    table = app.table(
        "counts",
        key_serializer="str",
        window=TumblingWindows(size_ms=10_000, retention_ms=10_000),
        copartitioned_with=clicks,
    )
    seen: list[tuple[bool, object]] = []

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            seen.append((event.key in table, table.get(event.key, "none")))
            if event.value == "del":
                del table[event.key]
            else:
                table[event.key] = event.value

    async with TestDriver(app) as driver:
        events = [(1_000, "a"), (2_000, "b"), (3_000, "del"), (4_000, "c"), (11_000, "d")]
        for ts, value in events:
            await driver.put("clicks", key="k", value=value, timestamp_ms=ts)
        await driver.drain()
        assert table.windows_of("k", 0, 20_000) == [(0, "c"), (10_000, "d")]
    # each event finds the value its window holds: deleted by "del", none in a new window
    assert seen == [(False, "none"), (True, "a"), (True, "b"), (False, "none"), (False, "none")]
