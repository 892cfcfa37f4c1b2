"""Windowed tables with ``emit="close"`` through the in-memory driver: one final result per
key and window when stream time passes its close time, late writes dropped and counted,
results surviving revocation and loss, idle partitions closing on the wall clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.errors import ConfigurationError
from streamjoin.events import Event
from streamjoin.runtime.metrics import samples
from streamjoin.runtime.table_state.flush import Sending, TakenWrites, send_writes
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import HoppingWindows, TumblingWindows, WindowSpec
from streamjoin.testing.driver import TestDriver
from streamjoin.windowed import WindowedTable

#: a final result as the tests compare them: (key, window start, window end, value)
Final = tuple[str, int, int, int]


class FakeClock:
    """A monotonic clock in seconds that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def counting_app(
    spec: WindowSpec,
    *,
    partitions: int = 1,
    emit_to: bool = True,
    callback: bool = True,
    **options: Any,
) -> tuple[streamjoin.App, WindowedTable, list[Final]]:
    """Counts per key and window, emitting on close to ``finals`` and a callback list."""
    app = streamjoin.App("emit-unit")
    clicks = app.topic("clicks", key_serializer="str", partitions=partitions)
    # (one partition: the driver lists records by partition, and the order is checked)
    finals = app.topic("finals", key_serializer="str", value_serializer="json", partitions=1)
    called: list[Final] = []

    def on_close(key: Any, window: tuple[int, int], value: Any) -> None:
        called.append((key, window[0], window[1], value))

    table = app.table(
        "counts",
        default=int,
        key_serializer="str",
        window=spec,
        copartitioned_with=clicks,
        emit="close",
        emit_to=finals if emit_to else None,
        on_window_close=on_close if callback else None,
        **options,
    )
    assert isinstance(table, WindowedTable)

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            table.update(event.key, lambda n: n + 1)

    return app, table, called


def sent(driver: TestDriver) -> list[Final]:
    """The final results sent to ``finals``, in the order they were sent."""
    out = []
    for event in driver.records("finals"):
        headers = dict(event.headers)
        start, end = int(headers["window-start"]), int(headers["window-end"])
        assert event.timestamp == end - 1
        out.append((event.key, start, end, event.value))
    return out


def model_finals(
    spec: WindowSpec, events: list[tuple[str, int]], stream_time: int
) -> tuple[list[Final], int]:
    """Brute force: each event counts in each of its windows still open as it arrives
    (stream time before it < the window's end + grace); the windows closed at
    ``stream_time`` are the final results, ordered by (start, key). Also: how many events
    were late for at least one window."""
    counts: dict[tuple[int, int, str], int] = {}
    late = 0
    seen: int | None = None
    for key, ts in events:
        dropped = False
        for start, end in spec.windows_for(ts):
            if seen is not None and spec.close_time(end) <= seen:
                dropped = True
                continue
            counts[(start, end, key)] = counts.get((start, end, key), 0) + 1
        late += dropped
        seen = ts if seen is None else max(seen, ts)
    closed = sorted(
        (start, key, end, n)
        for (start, end, key), n in counts.items()
        if spec.close_time(end) <= stream_time
    )
    return [(key, start, end, n) for start, key, end, n in closed], late


async def test_one_final_result_per_window_in_order_and_late_events_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = TumblingWindows(size_ms=10, grace_ms=5)
    app, table, called = counting_app(spec)
    events = [("a", 1), ("b", 2), ("a", 12), ("a", 3), ("b", 16), ("a", 4), ("b", 21), ("a", 9)]
    async with TestDriver(app) as driver:
        for key, ts in events[:4]:
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()
        assert sent(driver) == []  # stream time 12 < 10 + 5: nothing closed yet
        with caplog.at_level(logging.WARNING, "streamjoin.windows"):
            for key, ts in events[4:]:
                await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
            await driver.drain()
        # stream time 21: [0, 10) closed at 15 (event 4 at 16 made the one at ts 4 late;
        # the one at 9 too); [10, 20) closes at 25
        assert sent(driver) == [("a", 0, 10, 2), ("b", 0, 10, 1)]
        assert called == sent(driver)
        stats = table.emission_stats()  # type: ignore[attr-defined]
        assert (stats.closed, stats.late, stats.callback_errors) == (2, 2, 0)
        assert "is late for 1 of its windows" in caplog.text
        await driver.put("clicks", key="a", value=1, timestamp_ms=40)
        await driver.drain()
        assert sent(driver)[2:] == [("a", 10, 20, 1), ("b", 10, 20, 1), ("b", 20, 30, 1)]
        await driver.drain()  # nothing more: each window once
        assert len(sent(driver)) == 5
    assert called == sent(driver)


async def test_reads_of_a_closed_window_find_nothing_and_writes_are_dropped() -> None:
    app = streamjoin.App("emit-read")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)
    finals = app.topic("finals", key_serializer="str", value_serializer="json")
    table = app.table(
        "last",
        key_serializer="str",
        value_serializer="json",
        window=TumblingWindows(size_ms=10),
        copartitioned_with=clicks,
        emit="close",
        emit_to=finals,
    )
    reads: list[tuple[Any, bool]] = []

    @app.agent(clicks)
    async def write(stream: Stream) -> None:
        async for event in stream:
            reads.append((table.get(event.key), event.key in table))
            table[event.key] = event.value

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value="first", timestamp_ms=1)
        await driver.put("clicks", key="k", value="second", timestamp_ms=2)
        await driver.put("clicks", key="k", value="next window", timestamp_ms=10)
        await driver.put("clicks", key="k", value="late", timestamp_ms=3)
        await driver.drain()
        assert reads == [(None, False), ("first", True), (None, False), (None, False)]
        assert [(e.key, e.value) for e in driver.records("finals")] == [("k", "second")]
        # the closed window still holds its final value (until it expires), not the late one
        assert table.windows_of("k", 0, 100) == [(0, "second"), (10, "next window")]  # type: ignore[attr-defined]


async def test_only_writes_count_an_event_as_late() -> None:
    """An event reading a closed window drops nothing: it is counted (and logged) as late
    only when it writes, once however many writes it makes (an agent that only reads a
    windowed table, lagging behind its writer, must not report late events)."""
    app = streamjoin.App("emit-late-reads")
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=1)
    table = app.table(
        "counts",
        key_serializer="str",
        value_serializer="json",
        default=int,
        window=HoppingWindows(size_ms=20, step_ms=10),
        copartitioned_with=clicks,
    )

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            if event.value == "read":
                table.get(event.key)
            else:
                table.update(event.key, lambda n: n + 1)
                table.update(event.key, lambda n: n + 1)

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="k", value="write", timestamp_ms=1)
        await driver.put("clicks", key="k", value="write", timestamp_ms=35)
        await driver.put("clicks", key="k", value="read", timestamp_ms=2)  # late: reads only
        await driver.drain()
        stats = table.emission_stats()  # type: ignore[attr-defined]
        assert stats.late == 0
        await driver.put("clicks", key="k", value="write", timestamp_ms=25)  # late for (10, 30)
        await driver.drain()
        assert stats.late == 1
        assert table.windows_of("k", 0, 100) == [(0, 2), (20, 4), (30, 2)]  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 120)), min_size=1, max_size=40
    ),
    hopping=st.booleans(),
    grace=st.sampled_from([0, 7, 25]),
    flush_every=st.integers(1, 8),
)
async def test_final_results_match_a_brute_force_model(
    events: list[tuple[str, int]], hopping: bool, grace: int, flush_every: int
) -> None:
    """Whatever the timestamps and however often it flushes: each window closed by the
    final stream time has exactly one result, equal to the model's, in (start, key) order;
    late events are counted as the model counts them."""
    spec: TumblingWindows | HoppingWindows = (
        HoppingWindows(size_ms=20, step_ms=10, grace_ms=grace)
        if hopping
        else TumblingWindows(size_ms=20, grace_ms=grace)
    )
    app, table, called = counting_app(spec)
    async with TestDriver(app) as driver:
        for i, (key, ts) in enumerate(events, start=1):
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
            if i % flush_every == 0:
                await driver.drain()
        await driver.drain()
        expected, late = model_finals(spec, events, max(ts for _, ts in events))
        assert sent(driver) == expected
        assert called == expected
        assert table.emission_stats().late == late  # type: ignore[attr-defined]


async def test_a_revoked_and_reassigned_partition_closes_each_window_once() -> None:
    spec = TumblingWindows(size_ms=10)
    app, _, called = counting_app(spec, callback=True)
    async with TestDriver(app) as driver:
        for ts in (1, 2, 11):
            await driver.put("clicks", key="a", value=1, timestamp_ms=ts)
        await driver.drain()
        await driver.revoke([("clicks", 0)])  # commits: [0, 10) closed and recorded
        await driver.assign([("clicks", 0)])
        await driver.put("clicks", key="a", value=1, timestamp_ms=25)
        await driver.drain()
        await driver.revoke([("clicks", 0)])
        await driver.assign([("clicks", 0)])
        await driver.drain()
    assert sent(driver) == [("a", 0, 10, 2), ("a", 10, 20, 1)]
    assert called == sent(driver)


async def test_a_lost_partition_replays_its_closes() -> None:
    """Lost before its flush: the new owner replays from the last commit and emits the
    results the lost owner never flushed, once."""
    spec = TumblingWindows(size_ms=10)
    app, _, _ = counting_app(spec, callback=False)
    replay = [("a", 12), ("b", 13), ("a", 25)]
    async with TestDriver(app) as driver:
        for key, ts in [("a", 1), ("b", 2)]:
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()
        assert await driver.commit() == {("clicks", 0): 2}
        for key, ts in replay:
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.lose([("clicks", 0)])  # (before any flush)
        assert sent(driver) == []
        await driver.assign([("clicks", 0)])
        for key, ts in replay:  # what the next owner reads again from the committed offsets
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()
    assert sent(driver) == [("a", 0, 10, 1), ("b", 0, 10, 1), ("a", 10, 20, 1), ("b", 10, 20, 1)]


async def test_a_crash_between_the_results_and_the_changelog_repeats_them() -> None:
    """Results are sent (and acknowledged) before the changelog writes of their flush: a
    flush that fails in between leaves them sent but not recorded, so the next owner sends
    them again (at-least-once: repeated, never missing)."""
    spec = TumblingWindows(size_ms=10)
    app, _, _ = counting_app(spec, callback=False)
    events = [("a", 1), ("b", 2), ("a", 12)]
    async with TestDriver(app) as driver:
        changelog_sends = driver.send_many
        failures: list[str] = []

        async def broken_changelog(topic: str, partition: int, records: Any) -> Any:
            failures.append(topic)
            raise RuntimeError("the broker went away")

        driver.send_many = broken_changelog  # type: ignore[method-assign]
        for key, ts in events:
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        with pytest.raises(RuntimeError, match="went away"):
            await driver.drain()
        assert failures == ["emit-unit-counts-changelog"]
        assert sent(driver) == [("a", 0, 10, 1), ("b", 0, 10, 1)]  # sent before the failure
        driver.send_many = changelog_sends  # type: ignore[method-assign]
        await driver.lose([("clicks", 0)])
        await driver.assign([("clicks", 0)])
        for key, ts in events:
            await driver.put("clicks", key=key, value=1, timestamp_ms=ts)
        await driver.drain()
        await driver.put("clicks", key="a", value=1, timestamp_ms=20)
        await driver.drain()
    assert sent(driver) == [
        ("a", 0, 10, 1),
        ("b", 0, 10, 1),
        ("a", 0, 10, 1),  # again
        ("b", 0, 10, 1),
        ("a", 10, 20, 1),
    ]


async def test_a_loss_after_the_close_was_flushed_does_not_repeat_it() -> None:
    """The flush that sent a window's result also wrote the closed-through marker: a new
    owner restoring that state neither emits it again nor accepts late writes to it."""
    spec = TumblingWindows(size_ms=10)
    app, table, _ = counting_app(spec, callback=False)
    async with TestDriver(app) as driver:
        for ts in (1, 2, 15):
            await driver.put("clicks", key="a", value=1, timestamp_ms=ts)
        await driver.drain()
        assert sent(driver) == [("a", 0, 10, 2)]
        await driver.lose([("clicks", 0)])
        await driver.assign([("clicks", 0)])
        await driver.put("clicks", key="a", value=1, timestamp_ms=3)  # late for [0, 10)
        await driver.drain()
        assert sent(driver) == [("a", 0, 10, 2)]
        assert table.emission_stats().late == 1  # type: ignore[attr-defined]


async def test_an_idle_partition_closes_its_windows_on_the_wall_clock() -> None:
    clock = FakeClock()
    spec = TumblingWindows(size_ms=60_000, grace_ms=10_000)
    app, table, called = counting_app(spec, close_idle_after=timedelta(seconds=30))
    table.clock = clock
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value=1, timestamp_ms=5_000)
        await driver.drain()  # active: idle from this flush on, at stream time 5 s
        clock.advance(29)
        await driver.flush()
        assert called == []  # idle 29 s < 30 s
        clock.advance(1)
        await driver.flush()  # idle 30 s: stream time 5 s + 30 s = 35 s < 60 + 10 s
        assert called == []
        clock.advance(35)
        await driver.flush()  # idle 65 s: stream time 70 s: [0, 60 s) closed
        assert called == [("a", 0, 60_000, 1)]
        # stream time moved on: an event for the closed window is late; activity resets
        await driver.put("clicks", key="a", value=1, timestamp_ms=59_000)
        await driver.put("clicks", key="b", value=1, timestamp_ms=61_000)
        await driver.drain()
        assert table.emission_stats().late == 1  # type: ignore[attr-defined]
        clock.advance(60)
        await driver.flush()  # idle since the last drain: 70 s + 60 s = 130 s >= 130 s
        assert called[1:] == [("b", 60_000, 120_000, 1)]
    assert sent(driver) == called


async def test_a_partition_without_events_since_assignment_still_closes() -> None:
    """Restored after a crash that came before the close was flushed: no event arrives,
    yet the window closes (its partition state is made by the flush)."""
    clock = FakeClock()
    spec = TumblingWindows(size_ms=10)
    app, table, called = counting_app(spec, close_idle_after=5.0)
    table.clock = clock
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value=1, timestamp_ms=1)
        await driver.drain()
        await driver.revoke([("clicks", 0)])
        await driver.assign([("clicks", 0)])
        await driver.flush()  # the partition state is made here; its idle clock starts
        clock.advance(10)
        await driver.flush()  # idle 10 s: stream time 1 + 10_000 ms
        assert called == [("a", 0, 10, 1)]


async def test_hopping_windows_close_one_by_one() -> None:
    spec = HoppingWindows(size_ms=20, step_ms=10)
    app, _, called = counting_app(spec, emit_to=False)
    async with TestDriver(app) as driver:
        for ts in (5, 15, 25):
            await driver.put("clicks", key="k", value=1, timestamp_ms=ts)
        await driver.drain()
        assert called == [("k", 0, 20, 2)]
        await driver.put("clicks", key="k", value=1, timestamp_ms=12)  # late for [0, 20)
        await driver.put("clicks", key="k", value=1, timestamp_ms=45)
        await driver.drain()
    assert called == [("k", 0, 20, 2), ("k", 10, 30, 3), ("k", 20, 40, 1)]


async def test_a_failing_callback_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    app = streamjoin.App("emit-fail")
    clicks = app.topic("clicks", key_serializer="str", partitions=1)

    def explode(key: Any, window: tuple[int, int], value: Any) -> None:
        raise RuntimeError(f"no room for {key}")

    table = app.table(
        "counts",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=10),
        copartitioned_with=clicks,
        emit="close",
        on_window_close=explode,
    )

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            table[event.key] += 1

    async with TestDriver(app) as driver:
        with caplog.at_level(logging.ERROR, "streamjoin.windows"):
            for ts in (1, 11):
                await driver.put("clicks", key="k", value=1, timestamp_ms=ts)
            await driver.drain()
        stats = table.emission_stats()  # type: ignore[attr-defined]
        assert (stats.closed, stats.callback_errors) == (1, 1)
        assert "on_window_close('k', (0, 10), ...) raised" in caplog.text


async def test_a_timestamp_extractor_picks_the_windows() -> None:
    app = streamjoin.App("emit-ts")
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=1)
    called: list[Final] = []

    def event_time(event: Event) -> int:
        at: int = event.value["at"]
        return at

    table = app.table(
        "counts",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=10),
        copartitioned_with=clicks,
        emit="close",
        on_window_close=lambda k, w, v: called.append((k, w[0], w[1], v)),
        timestamp=event_time,
    )

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            table[event.key] += 1

    async with TestDriver(app) as driver:
        for at in (3, 4, 13):  # the record timestamps say otherwise
            await driver.put("clicks", key="k", value={"at": at}, timestamp_ms=1000 - at)
        await driver.drain()
    assert called == [("k", 0, 10, 2)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"emit": "close"}, r"emit='close' needs somewhere to put final results"),
        ({"emit": "final", "on_window_close": print}, r"emit must be 'update' or 'close'"),
        ({"emit_to": "finals"}, r"emit_to only apply with emit='close'"),
        ({"close_idle_after": 5}, r"close_idle_after only apply with emit='close'"),
        (
            {"emit": "close", "on_window_close": print, "close_idle_after": 0},
            r"close_idle_after must be > 0",
        ),
        (
            {"emit": "close", "on_window_close": print, "close_idle_after": "5s"},
            r"a timedelta or a number of seconds",
        ),
        ({"emit": "close", "emit_to": 3}, r"emit_to must be a topic"),
        ({"timestamp": 5}, r"timestamp must be a function of the event"),
    ],
)
def test_emission_settings_are_checked_at_declaration(
    options: dict[str, Any], message: str
) -> None:
    app = streamjoin.App("emit-bad")
    with pytest.raises(ConfigurationError, match=message):
        app.table("counts", window=TumblingWindows(size_ms=10), **options)
    assert "counts" not in app.tables


def test_an_async_callback_and_a_plain_table_are_refused() -> None:
    app = streamjoin.App("emit-bad")

    async def later(key: Any, window: tuple[int, int], value: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"cannot await"):
        app.table("counts", window=TumblingWindows(size_ms=10), emit="close", on_window_close=later)
    with pytest.raises(ConfigurationError, match=r"only apply to windowed tables"):
        app.table("plain", emit="close", on_window_close=print)


def test_retention_shorter_than_grace_is_refused_for_close() -> None:
    """(The window spec refuses it too; a spec of another kind is checked here.)"""

    class ShortLived:
        size_ms = 10
        grace_ms = 50
        retention_ms = 20

        def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
            start = timestamp_ms - timestamp_ms % 10
            return [(start, start + 10)]

        def close_time(self, window_end_ms: int) -> int:
            return window_end_ms + 50

        def expired(self, window_end_ms: int, stream_time_ms: int) -> bool:
            return stream_time_ms >= window_end_ms + 20

    app = streamjoin.App("emit-bad")
    with pytest.raises(ConfigurationError, match=r"retention \(20 ms\) < grace \(50 ms\)"):
        app.table(
            "counts",
            window=ShortLived(),  # type: ignore[arg-type]
            emit="close",
            on_window_close=print,
        )


class RecordingTransaction:
    """Exactly-once's transaction, in memory: notes what was sent while it took sends."""

    def __init__(self, driver: TestDriver) -> None:
        self.driver = driver
        self.sends_open = True
        self.has_data = False
        self.log: list[str] = []

    def close_sends(self) -> None:
        self.sends_open = False
        self.log.append("close_sends")

    async def reopen(self) -> None:
        self.sends_open = True

    async def send_writes(self, taken: list[TakenWrites]) -> list[Sending]:
        self.log.append("changelog")
        topology = self.driver.topology
        assert topology is not None
        return await send_writes(taken, topology.tables, self.driver)

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.log.append("commit")

    async def begin(self) -> None:
        self.sends_open = True

    async def abort(self) -> None:
        await self.begin()


async def test_exactly_once_sends_the_results_inside_the_commits_transaction() -> None:
    """The snapshot's flush sends the results while the transaction still takes sends (so
    they are committed with the closed-through marker and the offsets, or aborted with
    them), before its changelog writes."""
    spec = TumblingWindows(size_ms=10)
    app, _, _ = counting_app(spec, callback=False)
    async with TestDriver(app) as driver:
        processing = driver.processing
        assert processing is not None and driver.runtime is not None
        txn = RecordingTransaction(driver)
        driver.runtime.transactional = True
        processing.transaction = txn
        send = driver.send

        async def noting(record: Any) -> Any:
            if record[0] == "finals":
                txn.log.append(f"result (sends open: {txn.sends_open})")
            return await send(record)

        driver.send = noting  # type: ignore[method-assign]
        for ts in (1, 2, 12):
            await driver.put("clicks", key="a", value=1, timestamp_ms=ts)
        for _ in range(50):  # (processed, not flushed)
            await asyncio.sleep(0)
        assert await processing.commit() == {("clicks", 0): 3}
    assert txn.log[:4] == ["result (sends open: True)", "close_sends", "changelog", "commit"]
    assert sent(driver) == [("a", 0, 10, 2)]


def test_the_counters_reach_the_prometheus_export() -> None:
    values = samples({"windows": {"counts": {"closed": 5, "late": 2, "callback_errors": 1}}})
    assert values["streamjoin_window_results"] == [(("counts",), 5)]
    assert values["streamjoin_window_late"] == [(("counts",), 2)]
    assert values["streamjoin_window_result_errors"] == [(("counts",), 1)]
