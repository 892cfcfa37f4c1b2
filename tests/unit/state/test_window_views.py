"""Faust's windowed-table reading API through the in-memory driver: relative_to_now /
relative_to_stream / relative_to_field views and their window sets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import streamjoin
from streamjoin.errors import TableAccessError
from streamjoin.events import Event
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import HoppingWindows, TumblingWindows
from streamjoin.testing.driver import TestDriver
from streamjoin.windowed import WindowedTable

MINUTE = 60_000


def _app(window: Any) -> tuple[streamjoin.App, WindowedTable]:
    app = streamjoin.App("views-unit")
    app.topic("clicks", key_serializer="str", value_serializer="json", partitions=2)
    table = app.table(
        "per-minute",
        default=int,
        key_serializer="str",
        window=window,
        copartitioned_with=app.topics["clicks"],
    )
    assert isinstance(table, WindowedTable)
    return app, table


async def test_window_sets_read_the_windows_faust_reads() -> None:
    app, table = _app(TumblingWindows(timedelta(minutes=1), retention=None))
    seen: list[tuple[Any, ...]] = []

    @app.agent(app.topics["clicks"])
    async def count(stream: Stream) -> None:
        async for event in stream:
            table[event.key] += event.value["n"]
            now, stream_view = table.relative_to_now(), table.relative_to_stream()
            by_field = table.relative_to_field("at")
            windows = stream_view[event.key]
            seen.append(
                (
                    event.timestamp,
                    windows.current(),
                    windows.value(),
                    now[event.key].value(),
                    now[event.key].now(),
                    windows.delta(60),  # seconds, as in Faust
                    windows.delta(timedelta(minutes=2)),
                    by_field[event.key].value(),
                )
            )

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value={"n": 1, "at": 10}, timestamp_ms=1_000)
        await driver.put("clicks", key="a", value={"n": 2, "at": 20}, timestamp_ms=61_000)
        await driver.put("clicks", key="a", value={"n": 4, "at": 30}, timestamp_ms=125_000)
        # late: its window is [0, 1 min), stream time 125 s
        await driver.put("clicks", key="a", value={"n": 8, "at": 125_000}, timestamp_ms=5_000)
        await driver.drain()
    assert seen == [
        # ts, current, value (stream), relative_to_now value, now(), delta 1 min, 2 min, field
        (1_000, 1, 1, 1, 1, 0, 0, 1),
        (61_000, 2, 2, 2, 2, 1, 0, 1),
        (125_000, 4, 4, 4, 4, 2, 1, 1),
        (5_000, 1, 1, 4, 4, 0, 0, 4),  # (late: its += 8 is dropped, the window keeps 1)
    ]


async def test_now_is_the_earliest_window_and_value_the_latest_with_hopping_windows() -> None:
    app, table = _app(HoppingWindows(size_ms=2 * MINUTE, step_ms=MINUTE))
    seen: list[tuple[int, int]] = []

    @app.agent(app.topics["clicks"])
    async def count(stream: Stream) -> None:
        async for event in stream:
            table.update(event.key, lambda n: n + 1)
            windows = table.relative_to_now()[event.key]
            seen.append((windows.now(), windows.value()))

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value={}, timestamp_ms=10_000)  # [0, 2 min)
        await driver.put("clicks", key="a", value={}, timestamp_ms=70_000)  # and [1, 3 min)
        await driver.drain()
    # at 70 s: earliest window [0, 2 min) holds both, latest [1 min, 3 min) the second only
    assert seen == [(1, 1), (2, 1)]


async def test_outside_agents_now_reads_the_wall_clock_window_of_the_key() -> None:
    app, table = _app(TumblingWindows(size_ms=MINUTE, retention=None))

    @app.agent(app.topics["clicks"])
    async def count(stream: Stream) -> None:
        async for event in stream:
            table[event.key] += 1

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value={}, timestamp_ms=125_000)
        await driver.drain()
        view = table.relative_to_now()
        view.clock = lambda: 130_000
        assert view["a"].now() == 1
        assert view["a"].value() == 1
        view.clock = lambda: 190_000  # the next minute: nothing counted yet
        assert view["a"].now() == 0
        with pytest.raises(TableAccessError, match="inside agents only"):
            table.relative_to_stream()["a"].value()
        with pytest.raises(TableAccessError, match="inside agents only"):
            view["a"].current()
        # with the event passed, no agent is needed
        event = Event("a", {}, "clicks", 0, 0, 121_000)
        assert table.relative_to_stream()["a"].value(event) == 1
        assert table.relative_to_stream()["a"].delta(60, event) == 0


async def test_relative_to_field_takes_names_functions_and_datetimes() -> None:
    app, table = _app(TumblingWindows(size_ms=MINUTE, retention=None))
    seen: list[Any] = []

    def when(event: Event) -> datetime:
        return datetime.fromtimestamp(event.value["at"] / 1000, tz=UTC)

    @app.agent(app.topics["clicks"])
    async def count(stream: Stream) -> None:
        async for event in stream:
            table[event.key] += 1
            seen.append(table.relative_to_field(when)[event.key].value())
            try:
                seen.append(table.relative_to_field("missing")[event.key].value())
            except TableAccessError as exc:
                seen.append(str(exc))

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value={"at": 1_000}, timestamp_ms=1_000)
        await driver.put("clicks", key="a", value={"at": 1_000}, timestamp_ms=61_000)
        await driver.drain()
    assert seen[0] == 1
    assert "has no field 'missing'" in seen[1]
    assert seen[2] == 1  # the field says minute 0, where the count is still 1


def test_views_refuse_what_they_cannot_read() -> None:
    _, table = _app(TumblingWindows(size_ms=MINUTE))
    with pytest.raises(streamjoin.errors.ConfigurationError, match="field name or a function"):
        table.relative_to_field(42)  # type: ignore[arg-type]
    assert repr(table.relative_to_now()["k"]) == "<WindowSet 'k' of <'per-minute' relative to now>>"
