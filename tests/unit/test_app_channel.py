"""In-memory channels (``app.channel()``): declarations, and their agents in the test driver."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamjoin import App, Keyed
from streamjoin.errors import AgentFailed, ConfigurationError, LifecycleError, TableAccessError
from streamjoin.events import Event
from streamjoin.stream import Stream
from streamjoin.testing.driver import TestDriver


def make_app() -> App:
    return App("mem-app", topic_partitions=2, key_serializer="str", value_serializer="json")


async def _forever(stream: Stream) -> None:
    async for _ in stream:
        pass


# ---------------------------------------------------------------- declarations


def test_channel_names_are_numbered_and_unique() -> None:
    app = make_app()
    assert app.channel().name == "channel-1"
    assert app.channel("orders", maxsize=5).maxsize == 5
    with pytest.raises(ConfigurationError, match="'orders' is declared twice"):
        app.channel("orders")


@pytest.mark.parametrize("maxsize", [0, -1, 1.5, "10"])
def test_maxsize_must_be_a_positive_int(maxsize: Any) -> None:
    with pytest.raises(ConfigurationError, match="maxsize must be an int >= 1"):
        make_app().channel("c", maxsize=maxsize)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_error": "dead_letter"}, "dead_letter' is refused for a channel"),
        ({"dead_letter": "parked"}, "dead_letter' is refused for a channel"),
        ({"on_error": "explode"}, "on_error must be 'stop' or 'skip'"),
        ({"concurrency": 2}, "concurrency must be 1"),
    ],
)
def test_what_a_channel_agent_refuses(options: dict[str, Any], message: str) -> None:
    app = make_app()
    channel = app.channel("c")
    with pytest.raises(ConfigurationError, match=message):
        app.agent(channel, **options)(_forever)
    assert channel.reader is None and app.app_tasks == {}


def test_a_channel_feeds_one_agent_and_is_not_mixed_with_topics() -> None:
    app = make_app()
    channel = app.channel("c")
    app.agent(channel, name="first")(_forever)
    with pytest.raises(ConfigurationError, match="already read by agent 'first'"):
        app.agent(channel, name="second")(_forever)
    with pytest.raises(ConfigurationError, match="not both"):
        app.agent([app.topic("t"), channel])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="'first' is declared twice"):
        app.agent(app.channel("d"), name="first")(_forever)


def test_sinks_need_a_generator() -> None:
    app = make_app()
    with pytest.raises(ConfigurationError, match="async generator"):
        app.agent(app.channel("c"), sink=[print])(_forever)


async def test_send_outside_a_running_app_is_a_lifecycle_error() -> None:
    app = make_app()
    channel = app.channel("c")
    app.agent(channel)(_forever)
    with pytest.raises(LifecycleError, match="channel 'c': the app is not running"):
        await channel.send(value=1)


async def test_send_to_a_channel_without_agent_says_so() -> None:
    app = make_app()
    channel = app.channel("lonely")
    async with TestDriver(app):
        with pytest.raises(ConfigurationError, match="'lonely' has no agent"):
            await channel.send(value=1)


# ---------------------------------------------------------------- running


async def test_a_topic_agent_feeds_a_channel_agent_that_writes_a_topic() -> None:
    app = make_app()
    source = app.topic("in")
    out = app.topic("out")
    channel = app.channel("work")
    seen: list[Event] = []

    @app.agent(channel)
    async def worker(stream: Stream) -> None:
        async for event in stream:
            seen.append(event)
            await out.send(key=event.key, value=event.value * 10)

    @app.agent(source)
    async def feeder(stream: Stream) -> None:
        async for event in stream:
            await channel.send(key=event.key, value=event.value)

    async with TestDriver(app) as driver:
        for n in range(5):
            await driver.put("in", key="k", value=n, timestamp_ms=1_000 + n)
        await driver.drain()
        assert [(e.key, e.value) for e in driver.records("out")] == [
            ("k", n * 10) for n in range(5)
        ]
    # the events: the channel's name, partition 0, a running offset, the sender's timestamp
    assert [(e.topic, e.partition, e.offset, e.timestamp) for e in seen] == [
        ("work", 0, n, 1_000 + n) for n in range(5)
    ]
    assert (channel.sent, channel.processed, channel.dropped) == (5, 5, 0)


async def test_drain_waits_until_channels_are_empty_and_their_agents_idle() -> None:
    app = make_app()
    out = app.topic("out", partitions=1)
    channel = app.channel("c")

    @app.agent(channel)
    async def unhurried(stream: Stream) -> None:
        async for value in stream.values():
            for _ in range(10):
                await asyncio.sleep(0)  # (many steps of the loop per event)
            await out.send(value=value)

    async with TestDriver(app) as driver:
        for n in range(20):
            await channel.send(value=n)
        await driver.drain()
        assert [e.value for e in driver.records("out")] == list(range(20))


async def test_values_operators_and_agent_send() -> None:
    app = make_app()
    out = app.topic("out", partitions=1)
    channel = app.channel("numbers")

    @app.agent(channel)
    async def evens(stream: Stream) -> None:
        chain = stream.values().filter(lambda v: v % 2 == 0).map(lambda v: v * v).enumerate(1)
        async for i, square in chain:
            await out.send(key=str(i), value=square)

    async with TestDriver(app) as driver:
        for n in range(7):
            await evens.send(value=n, timestamp_ms=5)
        await driver.drain()
        got = [(e.key, e.value) for e in driver.records("out")]
        assert got == [("1", 0), ("2", 4), ("3", 16), ("4", 36)]


async def test_take_hands_out_batches_of_what_is_queued() -> None:
    app = make_app()
    channel = app.channel("c", maxsize=100)
    batches: list[list[Any]] = []

    @app.agent(channel)
    async def bulk(stream: Stream) -> None:
        async for batch in stream.take(4):
            batches.append([event.value for event in batch])

    async with TestDriver(app) as driver:
        for n in range(10):
            await channel.send(value=n)
        await driver.drain()
    assert [v for batch in batches for v in batch] == list(range(10))
    assert all(1 <= len(batch) <= 4 for batch in batches)
    assert max(len(batch) for batch in batches) == 4  # queued together: taken together


async def test_take_within_waits_for_more_until_the_batch_is_full() -> None:
    app = make_app()
    channel = app.channel("c")
    batches: list[list[Any]] = []

    @app.agent(channel)
    async def bulk(stream: Stream) -> None:
        async for batch in stream.take(3, within=30.0):
            batches.append([event.value for event in batch])

    async with TestDriver(app) as driver:
        await channel.send(value=0)
        for _ in range(3):
            await asyncio.sleep(0)  # the agent has 0 and waits for more
        assert batches == []
        await channel.send(value=1)
        await channel.send(value=2)  # full: handed out now, long before `within`
        await driver.drain()
    assert batches == [[0, 1, 2]]


async def test_sinks_to_and_from_a_channel() -> None:
    app = make_app()
    source = app.topic("in")
    out = app.topic("out")
    channel = app.channel("c")

    @app.agent(channel, sink=[out])
    async def tag(stream: Stream) -> AsyncIterator[Any]:
        async for event in stream:
            yield event.value + 1  # with the channel event's key
            yield Keyed("chosen", event.value)

    @app.agent(source, sink=[channel])
    async def forward(stream: Stream) -> AsyncIterator[Any]:
        async for value in stream.values():
            yield value  # to the channel, with the topic event's key

    async with TestDriver(app) as driver:
        await driver.put("in", key="a", value=1)
        await driver.put("in", key="b", value=5)
        await driver.drain()
        got = sorted((e.key, e.value) for e in driver.records("out"))
        assert got == [("a", 2), ("b", 6), ("chosen", 1), ("chosen", 5)]


async def test_skip_logs_the_event_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    app = make_app()
    out = app.topic("out")
    channel = app.channel("c")

    @app.agent(channel, on_error="skip")
    async def picky(stream: Stream) -> None:
        async for value in stream.values():
            if value == 13:
                raise ValueError("unlucky")
            await out.send(value=value)

    with caplog.at_level(logging.WARNING, logger="streamjoin.channels"):
        async with TestDriver(app) as driver:
            for n in (1, 13, 2):
                await channel.send(value=n)
            await driver.drain()
            assert [e.value for e in driver.records("out")] == [1, 2]
    assert channel.skipped == 1
    assert "channel agent" in caplog.text and "c[0]@1: ValueError: unlucky" in caplog.text


async def test_skip_per_event_in_a_batch_hands_out_the_rest_again() -> None:
    app = make_app()
    channel = app.channel("c")
    done: list[int] = []

    @app.agent(channel, on_error="skip")
    async def bulk(stream: Stream) -> None:
        async for batch in stream.take(10, per_event_errors=True):
            for event in batch:
                if event.value == 2:
                    raise ValueError("two")
                done.append(event.value)

    async with TestDriver(app) as driver:
        for n in range(5):
            await channel.send(value=n)
        await driver.drain()
    assert done == [0, 1, 3, 4] and channel.skipped == 1


async def test_stop_stops_naming_the_event() -> None:
    app = make_app()
    channel = app.channel("c")

    @app.agent(channel)
    async def fragile(stream: Stream) -> None:
        async for value in stream.values():
            raise KeyError(value)

    async with TestDriver(app) as driver:
        await channel.send(value="x")
        with pytest.raises(AgentFailed, match=r"channel agent .*fragile failed on c\[0\]@0"):
            await driver.drain()


async def test_a_returning_channel_agent_stops_the_worker() -> None:
    app = make_app()
    channel = app.channel("c")

    @app.agent(channel)
    async def once(stream: Stream) -> None:
        async for _ in stream:
            return

    async with TestDriver(app) as driver:
        await channel.send(value=1)
        with pytest.raises(AgentFailed, match="returned; an agent must keep iterating"):
            await driver.drain()


async def test_table_writes_are_refused_and_reads_work_as_outside_agents() -> None:
    app = make_app()
    source = app.topic("in")
    counts = app.table("counts", default=int, copartitioned_with=source)
    channel = app.channel("c")
    read: list[Any] = []

    @app.agent(source)
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    @app.agent(channel)
    async def writer(stream: Stream) -> None:
        async for event in stream:
            if event.value == "read":
                read.append(counts.get(event.key))
            else:
                counts[event.key] = 1

    async with TestDriver(app) as driver:
        await driver.put("in", key="k", value=0)
        await driver.drain()
        await channel.send(key="k", value="read")
        await driver.drain()
        assert read == [1]  # the driver holds every partition: a local read
        await channel.send(key="k", value="write")
        with pytest.raises(AgentFailed) as failed:
            await driver.drain()
    cause = failed.value.__cause__
    assert isinstance(cause, TableAccessError)
    assert "cannot be written from channel agent" in str(cause)
    assert "belong to no partition" in str(cause) and "agent on a topic" in str(cause)


async def test_send_waits_while_the_channel_is_full() -> None:
    app = make_app()
    channel = app.channel("c", maxsize=2)
    release = asyncio.Event()
    got: list[int] = []

    @app.agent(channel)
    async def slow(stream: Stream) -> None:
        async for value in stream.values():
            await release.wait()
            got.append(value)

    async with TestDriver(app) as driver:
        await channel.send(value=0)
        for _ in range(3):
            await asyncio.sleep(0)  # the agent takes 0 and waits
        await channel.send(value=1)
        await channel.send(value=2)  # the queue holds 1 and 2: full
        third = asyncio.ensure_future(channel.send(value=3))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not third.done()
        release.set()
        await third
        await driver.drain()
    assert got == [0, 1, 2, 3]


async def test_what_is_queued_at_stop_is_dropped() -> None:
    app = make_app()
    channel = app.channel("c", maxsize=3)
    release = asyncio.Event()

    @app.agent(channel)
    async def stuck(stream: Stream) -> None:
        async for _ in stream:
            await release.wait()

    async with TestDriver(app):
        for n in range(4):
            await channel.send(value=n)
        for _ in range(3):
            await asyncio.sleep(0)
        waiting = asyncio.ensure_future(channel.send(value=4))  # the queue holds 1, 2, 3
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiting.done()
    await waiting  # let go by the stop
    # the agent held 0 when it was cancelled; 1-3 were queued; 4 waited for room
    assert (channel.sent, channel.dropped) == (4, 4)
    assert not channel.busy()
    # a new run starts empty
    async with TestDriver(app) as driver:
        release.set()
        await channel.send(value=9)
        await driver.drain()
        assert channel.processed == 1
