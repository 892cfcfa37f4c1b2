"""``stream.take(n, within=s)``: batches of one task's events, with per-event context,
per-event error policies and acknowledgement of the whole batch once its sends are."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import streamjoin
from streamjoin import App
from streamjoin.errors import AgentFailed, ConfigurationError
from streamjoin.events import RawRecord
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import TumblingWindows
from streamjoin.stream import EventBatch
from streamjoin.testing.driver import TestDriver
from tests.unit.runtime.agent_support import ManualSender, running


def make_app() -> App:
    return App("take-app", topic_partitions=4)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_batches_hold_one_partitions_events_in_order_and_all_count() -> None:
    app = make_app()
    source = app.topic("words", key_serializer="str", value_serializer="json")
    batches: list[list[tuple[int, int]]] = []

    @app.agent(source)
    async def collect(stream: Stream) -> None:
        async for batch in stream.take(3):
            assert isinstance(batch, EventBatch) and isinstance(batch, streamjoin.EventBatch)
            batches.append([(event.partition, event.offset) for event in batch])

    async with TestDriver(app) as driver:
        for i in range(40):
            await driver.put("words", key=f"k{i % 7}", value=i)
        await driver.drain()
        assert sum(driver.committable().values()) == 40
    assert all(1 <= len(b) <= 3 for b in batches)
    assert all(len({p for p, _ in b}) == 1 for b in batches)  # one task (partition) each
    seen = [event for b in batches for event in b]
    assert len(seen) == len(set(seen)) == 40
    for p in range(4):
        offsets = [o for part, o in seen if part == p]
        assert offsets == sorted(offsets)


async def test_table_reads_and_writes_in_a_batch_use_each_events_partition_and_window() -> None:
    app = make_app()
    source = app.topic("clicks", key_serializer="str", value_serializer="json")
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)
    windowed = app.table(
        "per-minute",
        default=int,
        key_serializer="str",
        copartitioned_with=source,
        window=TumblingWindows(size_ms=60_000, retention_ms=3_600_000),
    )

    @app.agent(source)
    async def count(stream: Stream) -> None:
        async for batch in stream.take(50):
            for event in batch:
                counts[event.key] += 1
                windowed[event.key] += 1

    expected: dict[str, int] = {}
    per_minute: dict[tuple[str, int], int] = {}
    async with TestDriver(app) as driver:
        for i in range(200):
            key, ts = f"u{i % 9}", 1_000_000 + i * 1_000  # 200 s: four windows
            await driver.put("clicks", key=key, value=i, timestamp_ms=ts)
            expected[key] = expected.get(key, 0) + 1
            window = ts - ts % 60_000
            per_minute[(key, window)] = per_minute.get((key, window), 0) + 1
        await driver.drain()
        got = {key: n for p in range(4) for key, n in counts.local_items(p)}
        got_windows = {
            (key, start): n for p in range(4) for (key, start), n in windowed.local_items(p)
        }
    assert got == expected
    assert got_windows == per_minute


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
async def test_with_per_event_errors_a_failing_event_gets_the_policy_alone(policy: str) -> None:
    app = make_app()
    source = app.topic("t", partitions=1)
    sink = app.topic("out", partitions=1)
    done: list[int] = []
    sizes: list[int] = []

    @app.agent(source, on_error=policy, name="fragile")  # type: ignore[arg-type]
    async def fragile(stream: Stream) -> None:
        async for batch in stream.take(10, per_event_errors=True):
            sizes.append(len(batch))
            for event in batch:
                await sink.send(value=event.value)
                if event.value == 4:
                    raise ValueError("cannot handle 4")
                done.append(event.value)

    async with TestDriver(app) as driver:
        for v in range(10):
            await driver.put("t", value=v)
        await driver.drain()
        # the events after the failed one were handed out again, once
        assert done == [0, 1, 2, 3, 5, 6, 7, 8, 9]
        assert sizes == [10, 5]
        assert driver.committable() == {("t", 0): 10}
        if policy == "dead_letter":
            dead = driver.raw_records("take-app-fragile-dead-letters")
            assert [r.value for r in dead] == [b"4"]
            assert dict(dead[0].headers)["streamjoin-source"] == b"t[0]@4"


@pytest.mark.parametrize("per_event", [True, False])
async def test_stop_in_a_batch_commits_what_came_before(per_event: bool) -> None:
    app = make_app()
    source = app.topic("t", partitions=1)

    @app.agent(source)
    async def fragile(stream: Stream) -> None:
        async for batch in stream.take(10, per_event_errors=per_event):
            for event in batch:
                if event.value == 3:
                    raise ValueError("cannot handle 3")

    async with TestDriver(app) as driver:
        for v in range(6):
            await driver.put("t", value=v)
        if per_event:  # the events before the failed one were processed
            with pytest.raises(AgentFailed, match=r"failed on t\[0\]@3: .*cannot handle 3"):
                await driver.drain()
            assert driver.committable() == {("t", 0): 3}
        else:  # none of the batch counts
            with pytest.raises(
                AgentFailed, match=r"the batch of 6 events t\[0\]@0 to t\[0\]@5: .*handle 3"
            ):
                await driver.drain()
            assert driver.committable() == {}


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
async def test_a_failing_batch_gets_the_policy_as_a_whole(policy: str) -> None:
    app = make_app()
    source = app.topic("t", partitions=1)
    sink = app.topic("out", partitions=1, value_serializer="json")
    handed: list[list[int]] = []

    @app.agent(source, on_error=policy, name="bulk")  # type: ignore[arg-type]
    async def bulk(stream: Stream) -> None:
        async for batch in stream.take(4):
            values = [event.value for event in batch]
            handed.append(values)
            if 5 in values:
                raise ValueError("the bulk write refused 5")
            await sink.send(value=values)  # the 'bulk write', after the loop

    async with TestDriver(app) as driver:
        for v in range(4):
            await driver.put("t", value=v)
        await driver.drain()
        for v in range(4, 10):
            await driver.put("t", value=v)
        await driver.drain()
        assert handed == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # nothing handed out twice
        assert [e.value for e in driver.records("out")] == [[0, 1, 2, 3], [8, 9]]
        assert driver.committable() == {("t", 0): 10}
        assert driver.runtime is not None
        assert driver.runtime.counters.errors == {"processing": 1}
        if policy == "dead_letter":
            dead = driver.raw_records("take-app-bulk-dead-letters")
            assert [r.value for r in dead] == [b"4", b"5", b"6", b"7"]  # nothing lost
            sources = [dict(r.headers)["streamjoin-source"] for r in dead]
            assert sources == [b"t[0]@4", b"t[0]@5", b"t[0]@6", b"t[0]@7"]


@pytest.mark.parametrize("policy", ["stop", "skip", "dead_letter"])
async def test_undecodable_records_in_a_batch_follow_the_policy(policy: str) -> None:
    app = make_app()
    topic = app.topic("t", partitions=1, value_serializer="json")
    good: list[Any] = []

    @app.agent(topic, on_error=policy, name="decoder")  # type: ignore[arg-type]
    async def decoder(stream: Stream) -> None:
        async for batch in stream.take(10):
            good.extend(event.value for event in batch)

    async with TestDriver(app) as driver:
        await driver.put("t", value={"ok": 1})
        await driver.put_raw("t", None, b"\xff not json")
        await driver.put("t", value={"ok": 2})
        if policy == "stop":
            with pytest.raises(AgentFailed, match=r"could not decode t\[0\]@1"):
                await driver.drain()
            assert good == []
            return
        await driver.drain()
        assert good == [{"ok": 1}, {"ok": 2}]
        assert driver.committable() == {("t", 0): 3}


async def test_within_waits_to_fill_a_batch_but_never_for_its_first_event() -> None:
    app = make_app()
    source = app.topic("t", partitions=1)
    sizes: list[int] = []
    got_first = asyncio.Event()

    @app.agent(source)
    async def collect(stream: Stream) -> None:
        async for batch in stream.take(3, within=30.0):
            sizes.append(len(batch))
            got_first.set()

    async with TestDriver(app) as driver:
        await driver.put("t", value=0)
        await settle()
        assert sizes == []  # waiting for more within the 30 s
        await driver.put("t", value=1)
        await driver.put("t", value=2)  # full: handed out without waiting the 30 s
        await asyncio.wait_for(got_first.wait(), 10)
        assert sizes == [3]


async def test_without_within_a_batch_is_what_is_buffered() -> None:
    app = make_app()
    source = app.topic("t", partitions=1)
    sizes: list[int] = []

    @app.agent(source)
    async def collect(stream: Stream) -> None:
        async for batch in stream.take(100):
            sizes.append(len(batch))

    async with TestDriver(app) as driver:
        await driver.put("t", value=0)
        await driver.drain()
        assert sizes == [1]


async def test_a_batch_counts_once_every_send_it_made_is_acknowledged() -> None:
    app = make_app()
    source = app.topic("in", partitions=1)
    sink = app.topic("out", partitions=1)
    batches: list[int] = []

    @app.agent(source)
    async def summarize(stream: Stream) -> None:
        async for batch in stream.take(10):
            batches.append(len(batch))
            await sink.send(value=sum(int(event.value) for event in batch))  # after the loop

    sender = ManualSender()
    async with running(app, sender, "in", pytest.fail) as (runtime, _manager, task):
        raws = [RawRecord("in", 0, offset, 0, None, b"1") for offset in range(5)]
        await runtime.dispatch_many(raws, task)
        await settle()
        await runtime.dispatch_many([RawRecord("in", 0, 5, 0, None, b"1")], task)
        await settle()  # the next batch finishes the first one: its send is not yet acked
        assert batches == [5, 1]
        assert task.tracker.committable() == {}
        sender.futures[0].set_result(None)
        await settle()
        assert task.tracker.committable() == {("in", 0): 5}  # the whole first batch


def _bad_output(topic: str, value: bytes | None) -> bool:
    """The 'broker' refuses values sent to ``out`` that start with ``bad``."""
    return topic == "out" and value is not None and value.startswith(b'"bad')


@pytest.mark.parametrize("per_event", [True, False])
async def test_a_refused_send_gets_the_policy_for_its_event_or_its_batch(per_event: bool) -> None:
    app = make_app()
    source = app.topic("in", partitions=1)
    sink = app.topic("out", partitions=1)

    @app.agent(source, on_error="dead_letter", name="fwd")
    async def forward(stream: Stream) -> None:
        async for batch in stream.take(10, per_event_errors=per_event):
            for event in batch:
                await sink.send(value=event.value)

    sender = ManualSender()
    crashes: list[BaseException] = []
    async with running(app, sender, "in", crashes.append) as (runtime, _manager, task):
        values = ["ok0", "bad1", "ok2", "bad3", "ok4"]
        raws = [RawRecord("in", 0, i, 0, None, f'"{v}"'.encode()) for i, v in enumerate(values)]
        await runtime.dispatch_many(raws, task)
        await settle()
        await runtime.dispatch_many([RawRecord("in", 0, 5, 0, None, b'"ok5"')], task)
        await settle()
        for _ in range(5):  # the refusals, then the dead letters they cause
            sender.settle_all(refuse=_bad_output)
            await settle()
        dead = [value for topic, value in sender.sent if topic != "out"]
        if per_event:  # each event whose send was refused, alone
            assert dead == [b'"bad1"', b'"bad3"']
        else:  # the whole batch, once
            assert dead == [f'"{v}"'.encode() for v in values]
        assert task.tracker.committable() == {("in", 0): 6}  # both batches, each offset once
        assert sum(runtime.counters.dead_lettered.values()) == len(dead)
        assert not crashes


async def test_a_revoked_tasks_collected_records_are_not_handed_out() -> None:
    app = make_app()
    source = app.topic("t", partitions=1)
    seen: list[int] = []

    @app.agent(source)
    async def collect(stream: Stream) -> None:
        async for batch in stream.take(10, within=30.0):
            seen.extend(event.offset for event in batch)

    sender = ManualSender()
    async with running(app, sender, "t", pytest.fail) as (runtime, manager, task):
        await runtime.dispatch_many([RawRecord("t", 0, 0, 0, None, b"0")], task)
        await settle()  # collected, waiting within 30 s for more
        manager.suspend([task])
        # waiting to fill is not inside an event
        assert await runtime.barrier.wait_idle([task], 1.0)
        await runtime.dispatch_many([RawRecord("t", 0, 1, 0, None, b"0")], task)
        await settle()
        assert seen == []
        assert manager.committable([task]) == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0,), "max_events must be an int >= 1"),
        ((2.5,), "max_events must be an int >= 1"),
        ((5, -1), "within must be a finite number of seconds >= 0"),
        ((5, float("inf")), "within must be a finite number of seconds >= 0"),
        ((5, "1s"), "within must be a finite number of seconds >= 0"),
    ],
)
def test_bad_take_arguments_are_refused(args: tuple[Any, ...], message: str) -> None:
    class _Source:
        pass

    stream = Stream(_Source())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=message):
        stream.take(*args)


def test_per_event_errors_must_be_a_bool() -> None:
    # (the actor's step is compiled: a truthy 1 would reach it as a TypeError)
    class _Source:
        pass

    stream = Stream(_Source())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="per_event_errors must be True or False"):
        stream.take(5, per_event_errors=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_size", [None, 1, 10, 1000])
async def test_a_backlog_gives_the_event_loop_a_turn_every_64_events(
    batch_size: int | None,
) -> None:
    # without the turns, a backlog would starve the producer's sender and the commit loop
    app = make_app()
    source = app.topic("t", partitions=1)
    processed: list[int] = []
    all_done = asyncio.Event()

    @app.agent(source)
    async def busy(stream: Stream) -> None:
        if batch_size is None:
            async for event in stream:
                processed.append(event.offset)
                if len(processed) == 2_000:
                    all_done.set()
        else:
            async for batch in stream.take(batch_size):
                processed.extend(event.offset for event in batch)
                if len(processed) == 2_000:
                    all_done.set()

    turns = 0

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())

    async with running(app, ManualSender(), "t", pytest.fail) as (runtime, _, task):
        try:
            await runtime.dispatch_many(
                [RawRecord("t", 0, offset, 0, None, b"0") for offset in range(2_000)], task
            )
            await asyncio.wait_for(all_done.wait(), 10)
            assert processed == list(range(2_000))
            # a turn once 64 events were handed out since the last one (batches: at the next
            # batch, so up to 64 + one batch apart)
            assert turns >= 2_000 // (64 + (batch_size or 0)) - 1
            assert turns <= 2_000 // 8  # ...but not one per event
        finally:
            tick.cancel()
