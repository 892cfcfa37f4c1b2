"""Punctuation per task (``@app.punctuate``) through the in-memory test driver: stream-time
boundaries, wall-clock ticks without records, table writes and sends as part of the task,
revoked tasks, error policies, batches; and the acknowledgement of the record that made a
stream-time punctuation due, through the agent runtime with sends settled by hand."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from streamjoin import App
from streamjoin.errors import AgentFailed, ConfigurationError
from streamjoin.punctuation import (
    PunctuationContext,
    interval_ms,
    next_stream_due,
    next_wall_clock_due,
)
from streamjoin.runtime.tasks.punctuation import PunctuationService
from streamjoin.stream import Stream
from streamjoin.testing.driver import TestDriver
from tests.unit.runtime.agent_support import ManualSender, running


def make_app(**kwargs: Any) -> App:
    return App("punctuation-app", topic_partitions=kwargs.pop("partitions", 2), **kwargs)


# ---------------------------------------------------------------- the schedule (pure)


def test_a_stream_time_jump_fires_once_for_the_latest_boundary() -> None:
    assert next_stream_due(0, 10) == (0, 10)
    assert next_stream_due(9, 10) == (0, 10)
    assert next_stream_due(10, 10) == (10, 20)
    assert next_stream_due(57, 10) == (50, 60)  # 20, 30, 40 were jumped over


def test_wall_clock_ticks_stay_on_their_grid_and_skip_missed_intervals() -> None:
    assert next_wall_clock_due(1_000, 1_000, 100) == 1_100
    assert next_wall_clock_due(1_000, 1_050, 100) == 1_100
    assert next_wall_clock_due(1_000, 1_350, 100) == 1_400
    assert next_wall_clock_due(1_000, 900, 100) == 1_000  # not due yet: unchanged


def test_the_interval_is_given_once_in_whole_milliseconds() -> None:
    assert interval_ms(timedelta(seconds=2), None, "x") == 2_000
    assert interval_ms(0.25, None, "x") == 250
    assert interval_ms(None, 7, "x") == 7
    for every, every_ms in [(None, None), (1, 1000), (0, None), (0.0001, None), ("1s", None)]:
        with pytest.raises(ConfigurationError):
            interval_ms(every, every_ms, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="every_ms"):
        interval_ms(None, 0, "x")


# ---------------------------------------------------------------- declarations


def test_punctuate_names_an_agent_by_function_name_topic_or_table() -> None:
    app = make_app()
    source = app.topic("events", key_serializer="str", value_serializer="json")
    counts = app.table("counts", copartitioned_with=source, default=int)

    @app.agent(source, name="counter")
    async def count(stream: Stream) -> None:
        async for _ in stream:
            pass

    for target in (count, "counter", source, "events", counts):

        @app.punctuate(target, every=1, name=f"p-{len(app.punctuations)}")
        def report(context: PunctuationContext) -> None:
            pass

    assert {p.agent for p in app.punctuations.values()} == {"counter"}
    assert app.topology().punctuations == tuple(app.punctuations.values())


def test_punctuate_refuses_what_names_no_single_agent() -> None:
    app = make_app()
    source = app.topic("events")

    async def not_an_agent(stream: Stream) -> None:
        pass

    with pytest.raises(ConfigurationError, match="not a declared agent"):
        app.punctuate(not_an_agent, every=1)
    with pytest.raises(ConfigurationError, match="no agent yet"):
        app.punctuate(source, every=1)

    for name in ("a", "b"):
        app.agent(source, name=name)(not_an_agent)
    with pytest.raises(ConfigurationError, match=r"2 agents \(a, b\)"):
        app.punctuate(source, every=1)
    with pytest.raises(ConfigurationError, match="type must be one of"):
        app.punctuate("a", every=1, type="event_time")(lambda context: None)  # type: ignore[arg-type]

    def f(context: PunctuationContext) -> None:
        pass

    app.punctuate("a", every=1, name="twice")(f)
    with pytest.raises(ConfigurationError, match="declared twice"):
        app.punctuate("b", every=1, name="twice")(f)


# ---------------------------------------------------------------- stream time


async def test_stream_time_punctuation_runs_before_the_record_that_reaches_a_boundary() -> None:
    app = make_app(partitions=1)
    source = app.topic("events", key_serializer="str", value_serializer="json")
    seen: list[Any] = []

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for event in stream:
            seen.append(("event", event.timestamp))

    @app.punctuate(process, every=timedelta(seconds=10))
    def tick(context: PunctuationContext) -> None:
        assert context.type == "stream_time" and context.partition == 0
        seen.append(("punctuation", context.timestamp_ms, context.stream_time_ms))

    async with TestDriver(app) as driver:
        for ts in (1_000, 5_000, 12_000, 9_000, 35_000, 36_000, 40_000):
            await driver.put("events", key="k", value=1, timestamp_ms=ts)
        await driver.drain()

    assert seen == [
        ("punctuation", 0, 1_000),  # the task's first record (as in Kafka Streams)
        ("event", 1_000),
        ("event", 5_000),
        ("punctuation", 10_000, 12_000),
        ("event", 12_000),
        ("event", 9_000),  # late: stream time stays at 12 000
        ("punctuation", 30_000, 35_000),  # 20 000 was jumped over: once, for the latest
        ("event", 35_000),
        ("event", 36_000),
        ("punctuation", 40_000, 40_000),
        ("event", 40_000),
    ]


async def test_each_task_has_its_own_stream_time() -> None:
    app = make_app(partitions=2)
    source = app.topic("events", key_serializer="str", value_serializer="json")
    fired: list[tuple[int, int]] = []

    @app.agent(source, concurrency=2)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(process, every_ms=100)
    async def tick(context: PunctuationContext) -> None:
        await asyncio.sleep(0)
        fired.append((context.partition, context.timestamp_ms))

    async with TestDriver(app) as driver:
        for partition, ts in [(0, 50), (1, 250), (0, 120), (1, 260), (0, 199), (1, 300)]:
            await driver.put("events", value=1, partition=partition, timestamp_ms=ts)
        await driver.drain()
        # stream time without a record (the driver's): partition 0 only
        assert await driver.advance_stream_time(process, 1_000, partition=0) == 1
        assert await driver.advance_stream_time(process, 1_050, partition=0) == 1

    assert sorted(fired) == [(0, 0), (0, 100), (0, 1_000), (1, 200), (1, 300)]


async def test_a_batch_ends_before_a_record_that_reaches_a_boundary() -> None:
    app = make_app(partitions=1)
    source = app.topic("events", key_serializer="str", value_serializer="json")
    seen: list[Any] = []
    gate = asyncio.Event()

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for batch in stream.take(100):
            await gate.wait()
            seen.append([event.timestamp for event in batch])

    @app.punctuate(process, every_ms=10)
    def tick(context: PunctuationContext) -> None:
        seen.append(("punctuation", context.timestamp_ms))

    async with TestDriver(app) as driver:
        # everything is buffered before the agent takes its first batch
        for ts in (1, 2, 5, 11, 12, 13, 35, 36):
            await driver.put("events", value=1, timestamp_ms=ts)
        gate.set()
        await driver.drain()

    assert seen == [
        ("punctuation", 0),
        [1, 2, 5],
        ("punctuation", 10),
        [11, 12, 13],
        ("punctuation", 30),
        [35, 36],
    ]


# ---------------------------------------------------------------- wall clock


async def test_wall_clock_punctuation_runs_per_running_task_without_records() -> None:
    app = make_app(partitions=3)
    source = app.topic("events")
    fired: list[tuple[int, int]] = []

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(process, every=timedelta(seconds=1), type="wall_clock")
    def tick(context: PunctuationContext) -> None:
        assert context.type == "wall_clock" and context.stream_time_ms is None
        fired.append((context.partition, context.timestamp_ms))

    async with TestDriver(app) as driver:
        start = driver.wall_clock_ms
        assert await driver.advance_wall_clock(999) == 0
        assert fired == []
        assert await driver.advance_wall_clock(1) == 3
        assert sorted(fired) == [(p, start + 1_000) for p in range(3)]
        # four intervals at once: once per task, and the grid is kept
        fired.clear()
        assert await driver.advance_wall_clock(4_500) == 3
        assert sorted(fired) == [(p, start + 5_500) for p in range(3)]
        fired.clear()
        await driver.advance_wall_clock(499)
        assert fired == []
        await driver.advance_wall_clock(1)
        assert len(fired) == 3


async def test_nothing_runs_for_revoked_tasks_and_given_back_tasks_start_again() -> None:
    app = make_app(partitions=2)
    source = app.topic("events")
    fired: list[int] = []

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(process, every_ms=100, type="wall_clock")
    def tick(context: PunctuationContext) -> None:
        fired.append(context.partition)

    async with TestDriver(app) as driver:
        await driver.advance_wall_clock(100)
        assert sorted(fired) == [0, 1]
        await driver.revoke([("events", 0)])
        fired.clear()
        await driver.advance_wall_clock(100)
        await driver.advance_wall_clock(100)
        assert fired == [1, 1]
        # a tick queued before the revocation does not run either
        await driver.advance_wall_clock(50)
        await driver.assign([("events", 0)])  # its schedule starts again now
        fired.clear()
        await driver.advance_wall_clock(50)
        assert fired == [1]
        await driver.advance_wall_clock(50)
        assert fired == [1, 0]


async def test_a_tick_queued_before_a_revocation_is_dropped() -> None:
    app = make_app(partitions=1)
    source = app.topic("events")
    fired: list[int] = []
    gate = asyncio.Event()

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            await gate.wait()

    @app.punctuate(process, every_ms=100, type="wall_clock")
    def tick(context: PunctuationContext) -> None:
        fired.append(context.partition)

    async with TestDriver(app) as driver:
        await driver.put("events", value=1)
        await asyncio.sleep(0.01)  # the agent waits inside this event
        punctuations = driver.punctuations
        assert punctuations is not None
        driver.wall_clock_ms += 100
        assert punctuations.fire_due(driver.wall_clock_ms) == 1
        revoking = asyncio.ensure_future(driver.revoke([("events", 0)]))
        await asyncio.sleep(0.01)
        gate.set()
        await revoking
        await driver.drain()
    assert fired == []


# ---------------------------------------------------------------- tables and sends


async def test_a_punctuation_reads_and_writes_its_tasks_tables_and_sends() -> None:
    app = make_app(partitions=2)
    source = app.topic("words", key_serializer="str", value_serializer="json")
    totals = app.topic("totals", key_serializer="str", value_serializer="json")
    counts = app.table("counts", key_serializer="str", copartitioned_with=source, default=int)
    reports = app.table("reports", key_serializer="str", copartitioned_with=source, default=int)

    @app.agent(source)
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    @app.punctuate(count, every=timedelta(minutes=1), type="wall_clock")
    async def report(context: PunctuationContext) -> None:
        local = dict(counts.local_items())  # this task's partition only
        reports["runs"] += 1
        await context.send(totals, key=f"p{context.partition}", value=sum(local.values()))
        await totals.send(key="words", value=sorted(local))

    async with TestDriver(app) as driver:
        words = ["a", "b", "c", "a", "d", "a"]
        for word in words:
            await driver.put("words", key=word, value=1)
        await driver.drain()
        await driver.advance_wall_clock(60_000)
        out = driver.records("totals")
        by_partition = {e.key: e.value for e in out if e.key != "words"}
        assert sum(by_partition.values()) == len(words)
        assert set(by_partition) == {"p0", "p1"}
        # each task saw its own partition's keys, and its records carry the punctuation time
        seen = [e.value for e in out if e.key == "words"]
        assert sorted(k for keys in seen for k in keys) == ["a", "b", "c", "d"]
        assert {e.timestamp for e in out if e.key != "words"} == {driver.wall_clock_ms}
        # a write goes to the task's own partition, whatever the key
        await driver.commit()
        assert sorted(reports.local_items()) == [("runs", 1), ("runs", 1)]
        assert [reports.active_partition(p).store.get(b"runs") for p in (0, 1)] == [b"1", b"1"]


async def test_a_stream_time_punctuations_sends_delay_the_records_acknowledgement() -> None:
    app = make_app(partitions=1)
    source = app.topic("events", value_serializer="json")
    out = app.topic("out", value_serializer="json")

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(process, every_ms=10)
    async def tick(context: PunctuationContext) -> None:
        await context.send(out, value=context.timestamp_ms)

    failures: list[BaseException] = []
    sender = ManualSender()
    async with running(app, sender, "events", failures.append) as (runtime, manager, task):
        service = PunctuationService(
            app.topology().punctuations, runtime, manager.live, on_crash=failures.append
        )
        assert runtime.runners[0].punctuations is not None
        for offset, ts in enumerate((3, 5)):
            await runtime.dispatch_many([_raw("events", offset, ts)], task)
        await asyncio.sleep(0.01)
        runtime.ack_finished()
        # the first record made the punctuation due: it is not processed until its send is
        assert sender.sent == [("out", b"0")]
        assert task.tracker.committable() == {}
        sender.settle_all()
        await asyncio.sleep(0.01)
        runtime.ack_finished()
        assert task.tracker.committable() == {("events", 0): 2}
        assert not service.busy()
    assert failures == []


async def test_a_transactions_snapshot_waits_for_a_punctuation_in_progress() -> None:
    app = make_app(partitions=1)
    source = app.topic("events")
    gate = asyncio.Event()
    finished: list[int] = []

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(process, every_ms=100, type="wall_clock")
    async def slow(context: PunctuationContext) -> None:
        await gate.wait()
        finished.append(context.partition)

    failures: list[BaseException] = []
    async with running(app, ManualSender(), "events", failures.append) as (runtime, manager, _):
        service = PunctuationService(
            app.topology().punctuations, runtime, manager.live, on_crash=failures.append
        )
        assert service.fire_due(0) == 0  # the task's schedule starts
        assert service.fire_due(100) == 1
        await asyncio.sleep(0.01)
        assert runtime.barrier.inside_events() == [runtime.runners[0].name]
        assert not await runtime.barrier.quiesce(0.05)  # held until the punctuation ends
        gate.set()
        assert await runtime.barrier.quiesce(1.0)
        runtime.barrier.resume()
        assert finished == [0]
        assert not service.busy()
    assert failures == []


# ---------------------------------------------------------------- errors


async def test_a_failing_punctuation_stops_the_worker_under_on_error_stop() -> None:
    app = make_app(partitions=1)
    source = app.topic("events")

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(process, every_ms=10)
    def tick(context: PunctuationContext) -> None:
        raise ValueError("broken punctuation")

    async with TestDriver(app) as driver:
        await driver.put("events", value=1, timestamp_ms=5)
        with pytest.raises(AgentFailed, match="broken punctuation"):
            await driver.drain()
        # the record that made it due is not counted processed: a restart runs it again
        assert driver.committable() == {}


async def test_a_failing_punctuation_is_skipped_and_counted_under_on_error_skip() -> None:
    app = make_app(partitions=1)
    source = app.topic("events")
    processed: list[int] = []
    calls: list[int] = []

    @app.agent(source, on_error="skip")
    async def process(stream: Stream) -> None:
        async for event in stream:
            processed.append(event.timestamp)

    @app.punctuate(process, every_ms=10)
    def tick(context: PunctuationContext) -> None:
        calls.append(context.timestamp_ms)
        raise ValueError("broken punctuation")

    @app.punctuate(process, every_ms=10, type="wall_clock", name="wall")
    def wall(context: PunctuationContext) -> None:
        calls.append(-1)
        raise ValueError("broken wall-clock punctuation")

    async with TestDriver(app) as driver:
        for ts in (5, 15):
            await driver.put("events", value=1, timestamp_ms=ts)
        await driver.drain()
        await driver.advance_wall_clock(10)
        assert processed == [5, 15]
        assert calls == [0, 10, -1]
        assert driver.committable() == {("events", 0): 2}
        assert driver.runtime is not None
        assert driver.runtime.counters.errors == {"punctuation": 3}


async def test_a_punctuation_outside_its_tasks_co_partitioned_tables_is_refused() -> None:
    app = make_app(partitions=1)
    source = app.topic("events")
    other = app.topic("other")
    elsewhere = app.table("elsewhere", copartitioned_with=other)

    @app.agent(source)
    async def process(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.agent(other)
    async def write(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(process, every_ms=10, type="wall_clock")
    def tick(context: PunctuationContext) -> None:
        elsewhere["k"] = 1

    async with TestDriver(app) as driver:
        with pytest.raises(AgentFailed, match="not co-partitioned"):
            await driver.advance_wall_clock(10)


def _raw(topic: str, offset: int, timestamp: int) -> Any:
    from streamjoin.events import RawRecord

    return RawRecord(topic, 0, offset, timestamp, None, b"1")
