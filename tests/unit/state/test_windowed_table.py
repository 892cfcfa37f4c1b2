"""Windowed tables through the in-memory driver: per-window values, hopping updates, expiry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.errors import AgentFailed, IncompatibleWindowState, TableAccessError
from streamjoin.joins.core import JoinInput, JoinSpec, StreamStreamJoin
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state import window_layout as layout
from streamjoin.state.keys import encode_uint64, length_prefixed
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.windows import HoppingWindows, TumblingWindows
from streamjoin.testing.driver import TestDriver
from streamjoin.windowed import WindowedTable
from tests.declarations import fields_of


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


@settings(max_examples=40, deadline=None)
@given(
    timestamps=st.lists(st.integers(0, 200), min_size=1, max_size=40),
    hopping=st.booleans(),
    grace=st.sampled_from([0, 15]),
    flush_every=st.integers(1, 10),
)
async def test_counts_and_expiry_match_a_model_whatever_the_timestamps(
    timestamps: list[int], hopping: bool, grace: int, flush_every: int
) -> None:
    """Each event counts once in each of its windows still open (stream time before it <
    end + grace; it is late for the others), and a flush removes exactly the windows past
    retention of the largest timestamp so far, in order or not: the windows of the
    previous event are reused only while they are the event's, and the stream time kept
    in memory between flushes is their largest timestamp."""
    spec: TumblingWindows | HoppingWindows = (
        HoppingWindows(size_ms=20, step_ms=10, grace_ms=grace, retention_ms=30)
        if hopping
        else TumblingWindows(size_ms=20, grace_ms=grace, retention_ms=30)
    )
    app = streamjoin.App("win-model")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    table = app.table(
        "counts", default=int, key_serializer="str", window=spec, copartitioned_with=clicks
    )
    assert isinstance(table, WindowedTable)

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            table.update(event.key, lambda n: n + 1)

    model: dict[int, int] = {}
    async with TestDriver(app) as driver:
        for i, ts in enumerate(timestamps, start=1):
            await driver.put("clicks", key="k", value=1, timestamp_ms=ts)
            before = max(timestamps[: i - 1], default=None)
            for start, end in spec.windows_for(ts):
                if before is None or end + grace > before:
                    model[start] = model.get(start, 0) + 1
            if i % flush_every == 0 or i == len(timestamps):
                await driver.drain()  # (flushes: an expiry pass)
                stream_time = max(timestamps[:i])
                for start in [s for s in model if s + 20 + 30 <= stream_time]:
                    del model[start]
                assert table.windows_of("k", 0, 1_000) == sorted(model.items())


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
    size_ms: int = 10_000, retention_ms: int = 10_000, grace_ms: int = 0, keys: str = "str"
) -> tuple[streamjoin.App, WindowedTable]:
    """``table[event.key] += 1`` per event; ``keys``: the key codec of topic and table."""
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer=keys, partitions=1)
    table = app.table(
        "counts",
        default=int,
        key_serializer=keys,
        window=TumblingWindows(size_ms=size_ms, grace_ms=grace_ms, retention_ms=retention_ms),
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
    # (grace: every record is on time, however the keys' timestamps interleave)
    app, table = counting_app(size_ms=10, retention_ms=1_000_000, grace_ms=1_000_000)
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


async def test_expiry_scans_only_once_stream_time_crossed_a_window_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every flush runs an expiry pass; it reads the index only when a window can have
    expired since the last one that did (stream time crossed a window start). A late event
    for a window that old creates nothing (its window closed before it expired): dropped,
    and counted."""
    app, table = counting_app(size_ms=10, retention_ms=10)
    index_scans = 0
    real_scan = TablePartition.scan

    def counting_scan(
        view: TablePartition, start: bytes, end: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        nonlocal index_scans
        if start.startswith(layout.INDEX):
            index_scans += 1
        return real_scan(view, start, end)

    monkeypatch.setattr(TablePartition, "scan", counting_scan)

    async def at(ts: int, key: str = "a") -> None:
        await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()  # (flushes: an expiry pass)

    async with TestDriver(app) as driver:
        await at(1_000)
        assert index_scans == 1  # the first pass (cutoff 980) knows nothing yet
        for ts in range(1_001, 1_010):
            await at(ts)  # cutoffs 981..989: no window starts in (980, 989]
        assert index_scans == 1
        await at(1_010)  # cutoff 990: the window starting at 990 may have expired
        assert index_scans == 2
        await at(1_011)
        assert index_scans == 2
        # late: [970, 980) closed (and expired) long ago (970 + 10 + 10 <= 1011)
        await at(975, key="late")
        assert index_scans == 2
        assert table.windows_of("late", 0, 10_000) == []
        assert table.emission_stats().late == 1
        assert table.windows_of("a", 0, 10_000) == [(1_000, 10), (1_010, 2)]
        await at(1_012)
        assert index_scans == 2


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
        with pytest.raises(IncompatibleWindowState, match=r"'counts' partition 0.*reset"):
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


def _data_and_index(table: WindowedTable) -> tuple[set[tuple[bytes, int]], set[tuple[bytes, int]]]:
    """(key, window start) of every DATA entry and of every INDEX entry, flushed or not."""
    view = table.active_partition(0)
    data = {
        (entry.key, entry.time_ms)
        for entry in (
            layout.split_data_key(k) for k, _ in view.scan(*layout.namespace_range(layout.DATA))
        )
    }
    index = set()
    for k, _ in view.scan(*layout.namespace_range(layout.INDEX)):
        start, prefixed = layout.split_index_key(k)
        index.add((layout.strip_length_prefix(prefixed), start))
    return data, index


@pytest.mark.pure_python  # (patches TablePartition.put)
async def test_counting_into_an_existing_window_writes_its_index_entry_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, table = counting_app(size_ms=10_000, retention_ms=10_000)
    index_puts = 0
    real_put = TablePartition.put

    def counting_put(view: TablePartition, key: bytes, value: bytes | None) -> None:
        nonlocal index_puts
        if key.startswith(layout.INDEX):
            index_puts += 1
        real_put(view, key, value)

    monkeypatch.setattr(TablePartition, "put", counting_put)
    async with TestDriver(app) as driver:
        for ts in (1_000, 2_000, 3_000, 11_000, 12_000):
            await driver.put("clicks", key="k", value=1, timestamp_ms=ts)
        await driver.drain()
        assert table.windows_of("k", 0, 20_000) == [(0, 3), (10_000, 2)]
        assert index_puts == 2  # one per window, not one per event
        data, index = _data_and_index(table)
        assert data == index


async def test_every_window_stays_indexed_through_deletes_and_expiry() -> None:
    """The index entry is skipped only for a window just read as present: a window deleted
    or expired in between is indexed again, so expiry never leaves data behind."""
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    table = app.table(
        "counts",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=10, retention_ms=10),
        copartitioned_with=clicks,
    )
    assert isinstance(table, WindowedTable)

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            n = table[event.key]
            if event.value == "reset":
                del table[event.key]
            elif event.value == "expire":
                table.expire()  # drops the windows past retention (not this one)
            table[event.key] = n + 1

    async with TestDriver(app) as driver:
        events = [(0, "x"), (1, "reset"), (3, "x"), (15, "x"), (16, "reset")]
        # j at 30 moves stream time on; k at 5 is late: its window [0, 10) is read as
        # present, expired by table.expire(), then written again
        events += [(30, "j"), (5, "expire")]
        for ts, what in events:
            key = "j" if what == "j" else "k"
            await driver.put("clicks", key=key, value=what, timestamp_ms=ts)
        await driver.drain()
        # the flush expired k's windows again (stream time 30): data and index alike
        assert table.windows_of("k", 0, 100) == []
        data, index = _data_and_index(table)
        assert data == index == {(b"j", 30)}
        # far later: everything but the last window expires, data and index alike
        await driver.put("clicks", key="j", value="x", timestamp_ms=1_000)
        await driver.drain()
        data, index = _data_and_index(table)
        assert data == index == {(b"j", 1_000)}


async def test_a_read_then_a_write_of_a_key_in_the_next_event_writes_that_events_window() -> None:
    """``+=`` reuses the key its read encoded; a read in one event (odd offsets) and a write
    in the next (even ones), in another window, must still write the new window and index
    it for expiry."""
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    last = app.table(
        "last",
        key_serializer="str",
        window=TumblingWindows(size_ms=60_000, retention_ms=60_000),
        copartitioned_with=clicks,
    )

    @app.agent(clicks)
    async def note(stream: Stream) -> None:
        async for event in stream:
            if event.value == "read":
                assert last.get(event.key) is None or event.timestamp < 60_000
            else:
                last[event.key] = event.timestamp

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value="read", timestamp_ms=1_000)
        await driver.put("clicks", key="k", value="write", timestamp_ms=70_000)
        await driver.drain()
        assert last.windows_of("k", 0, 200_000) == [(60_000, 70_000)]  # type: ignore[attr-defined]
        # the new window was indexed: it expires once stream time passes 60s + 60s + 60s
        await driver.put("clicks", key="other", value="write", timestamp_ms=200_000)
        await driver.drain()
        assert last.windows_of("k", 0, 200_000) == []  # type: ignore[attr-defined]


async def test_per_partition_state_lives_in_the_task_not_in_the_declaration() -> None:
    app = streamjoin.App("win-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=2)
    counts = app.table(
        "counts",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=10, retention_ms=10),
        copartitioned_with=clicks,
    )

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    declared = fields_of(counts)
    async with TestDriver(app) as driver:
        for ts, key in ((5, "a"), (7, "b"), (50, "a")):
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()
        assert driver.tasks is not None
        latest = []
        for task in driver.tasks.live():
            assert set(task.windows) <= {"counts"}
            if task.windows:
                part = task.windows["counts"]
                assert part.view is task.tables["counts"]
                latest.append(part.latest)
        assert len(latest) in (1, 2) and max(latest) == 50  # type: ignore[type-var]
        counts.expire()  # reaches each partition's state through its task
    assert fields_of(counts) == declared


@settings(max_examples=40, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.one_of(
                st.text(max_size=3),
                st.integers(min_value=-3, max_value=3),
                st.booleans(),
                st.floats(min_value=0, max_value=2).filter(lambda f: f == int(f)),
            ),
            st.integers(min_value=0, max_value=100),
        ),
        min_size=1,
        max_size=40,
    ),
    remembered=st.sampled_from([1, 2, 8192]),
)
async def test_remembered_key_bytes_read_and_write_what_encoding_each_key_would(
    events: list[tuple[object, int]], remembered: int
) -> None:
    """`+=` with keys of every type whose values can equal another type's (1, True, 1.0):
    a key remembered with its bytes never answers for an equal key of another type, and
    forgetting them all (at the bound) changes nothing; the stored keys are the layout's."""
    from streamjoin.state import window_partition

    events = sorted(events, key=lambda event: event[1])  # (in order: none is late)
    bound = window_partition.KEY_ENTRIES
    window_partition.KEY_ENTRIES = remembered
    try:
        app, table = counting_app(size_ms=10, retention_ms=10_000, keys="json")
        model: dict[tuple[bytes, int], int] = {}
        async with TestDriver(app) as driver:
            for key, ts in events:
                await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
                encoded = table.key_codec.dumps(key)
                assert encoded is not None
                start = ts - ts % 10
                model[(encoded, start)] = model.get((encoded, start), 0) + 1
            await driver.drain()
            stored = {
                k: v
                for k, v in table.active_partition(0).store.items()
                if k.startswith(layout.DATA)
            }
    finally:
        window_partition.KEY_ENTRIES = bound
    assert stored == {
        layout.data_key(key, start): table.value_codec.dumps(n) for (key, start), n in model.items()
    }
