"""Agents' sinks and agents as channels, through the in-memory driver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamjoin import App
from streamjoin.agents import Agent
from streamjoin.channels import Keyed
from streamjoin.errors import AgentFailed, ConfigurationError
from streamjoin.events import RawRecord
from streamjoin.stream import Stream
from streamjoin.testing.driver import TestDriver
from tests.unit.runtime.agent_support import ManualSender, running


def make_app() -> App:
    return App("chan-app", topic_partitions=2, key_serializer="str", value_serializer="json")


async def test_what_the_agent_yields_goes_to_every_sink_in_order() -> None:
    app = make_app()
    source = app.topic("in", key_serializer="str", value_serializer="json")
    out = app.topic("out", key_serializer="str", value_serializer="json")
    calls: list[tuple[str, Any]] = []

    def remember(value: Any) -> None:
        calls.append(("sync", value))

    async def remember_later(value: Any) -> None:
        await asyncio.sleep(0)
        calls.append(("async", value))

    @app.agent()
    async def collector(stream: Stream) -> None:
        async for event in stream:
            calls.append(("agent", (event.key, event.value)))

    @app.agent(source, sink=[out, collector, remember, remember_later])
    async def doubler(stream: Stream) -> AsyncIterator[Any]:
        async for value in stream.values():
            yield value * 2

    async with TestDriver(app) as driver:
        await driver.put("in", key="k1", value=1)
        await driver.put("in", key="k1", value=2)
        await driver.drain()
        await driver.drain()
        # the topic and the agent get the event's key; functions the value, in order
        assert [(e.key, e.value) for e in driver.records("out")] == [("k1", 2), ("k1", 4)]
        functions = [call for call in calls if call[0] != "agent"]
        assert functions == [("sync", 2), ("async", 2), ("sync", 4), ("async", 4)]
        assert [call for call in calls if call[0] == "agent"] == [
            ("agent", ("k1", 2)),
            ("agent", ("k1", 4)),
        ]
        assert [(e.key, e.value) for e in driver.records("chan-app-collector")] == [
            ("k1", 2),
            ("k1", 4),
        ]


async def test_keyed_sets_the_key() -> None:
    app = make_app()
    source = app.topic("in", key_serializer="str", value_serializer="json")
    out = app.topic("by-parity", key_serializer="str", value_serializer="json")

    @app.agent(source, sink=[out])
    async def parity(stream: Stream) -> AsyncIterator[Keyed]:
        async for value in stream.values():
            yield Keyed("even" if value % 2 == 0 else "odd", value)

    async with TestDriver(app) as driver:
        for v in (1, 2, 3):
            await driver.put("in", key="x", value=v)
        await driver.drain()
        got = sorted((e.key, e.value) for e in driver.records("by-parity"))
        assert got == [("even", 2), ("odd", 1), ("odd", 3)]


async def test_an_error_in_a_sink_gets_the_agents_policy() -> None:
    app = App("chan-app", topic_partitions=1)
    source = app.topic("in", value_serializer="json")
    seen: list[int] = []

    def picky(value: int) -> None:
        if value == 13:
            raise ValueError("unlucky")
        seen.append(value)

    @app.agent(source, sink=[picky], on_error="skip")
    async def passthrough(stream: Stream) -> AsyncIterator[int]:
        async for value in stream.values():
            yield value

    async with TestDriver(app) as driver:
        for v in (1, 13, 2):
            await driver.put("in", value=v)
        await driver.drain()
        assert seen == [1, 2]
        assert driver.committable() == {("in", 0): 3}


async def test_a_sink_error_under_stop_does_not_commit_the_event() -> None:
    app = App("chan-app", topic_partitions=1)
    source = app.topic("in", value_serializer="json")

    def refuse(value: int) -> None:
        raise ValueError(f"no {value}")

    @app.agent(source, sink=[refuse])
    async def passthrough(stream: Stream) -> AsyncIterator[int]:
        async for value in stream.values():
            yield value

    async with TestDriver(app) as driver:
        await driver.put("in", value=1)
        with pytest.raises(AgentFailed, match="no 1"):
            await driver.drain()
        assert driver.committable() == {}


async def test_sink_sends_hold_the_event_until_acknowledged() -> None:
    app = App("chan-app", topic_partitions=1)
    source = app.topic("in", partitions=1, value_serializer="raw")
    out = app.topic("out", partitions=1, value_serializer="raw")

    @app.agent(source, sink=[out])
    async def forward(stream: Stream) -> AsyncIterator[bytes]:
        async for value in stream.values():
            yield value

    sender = ManualSender()
    crashes: list[BaseException] = []
    async with running(app, sender, "in", crashes.append) as (runtime, _manager, task):
        await runtime.dispatch_many([RawRecord("in", 0, 0, 0, None, b"a")], task)
        for _ in range(20):
            await asyncio.sleep(0)
        runtime.ack_finished()
        assert sender.sent == [("out", b"a")]
        assert task.tracker.committable() == {}
        sender.futures[0].set_result(None)
        await asyncio.sleep(0)
        await runtime.dispatch_many([RawRecord("in", 0, 1, 0, None, b"b")], task)
        for _ in range(20):
            await asyncio.sleep(0)
        assert task.tracker.committable() == {("in", 0): 1}
        assert crashes == []


async def test_agent_send_goes_to_its_topic() -> None:
    app = make_app()
    source = app.topic("orders", key_serializer="str", value_serializer="json")
    got: list[Any] = []

    @app.agent(source)
    async def audit(stream: Stream) -> None:
        async for event in stream:
            got.append(event.value)

    @app.agent(app.topic("commands", value_serializer="json"))
    async def forward(stream: Stream) -> None:
        async for value in stream.values():
            await audit.send(key="k", value=value)

    assert isinstance(audit, Agent) and audit.topic is source
    async with TestDriver(app) as driver:
        await driver.put("commands", value={"n": 1})
        await driver.drain()
        await driver.drain()
        assert got == [{"n": 1}]
        assert [e.key for e in driver.records("orders")] == ["k"]


def test_an_agent_without_a_topic_reads_its_own() -> None:
    app = App("shop", topic_partitions=3)

    @app.agent(name="billing.charge")
    async def charge(stream: Stream) -> None:
        async for _ in stream:
            pass

    assert charge.topic.name == "shop-charge"
    assert app.topics["shop-charge"] is charge.topic
    assert "billing.charge" in app.agents


def test_declaration_errors_are_named() -> None:
    app = make_app()

    async def plain(stream: Stream) -> None:
        async for _ in stream:
            pass

    async def generator(stream: Stream) -> AsyncIterator[Any]:
        async for event in stream:
            yield event

    with pytest.raises(ConfigurationError, match="must be an async generator"):
        app.agent("a", name="p", sink=[lambda v: None])(plain)
    with pytest.raises(ConfigurationError, match="must be an async generator"):
        app.agent("a", name="g")(generator)
    with pytest.raises(ConfigurationError, match="a sink must be a topic, an agent or a function"):
        app.agent("a", name="n", sink=[42])(generator)  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="at least one topic"):
        app.agent([], name="e")(plain)


def test_punctuate_takes_the_agent_the_decorator_returns() -> None:
    app = make_app()

    @app.agent("a", name="reader")
    async def reader(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(reader, every=1.0)
    def tick(context: Any) -> None:
        return None

    assert next(iter(app.punctuations.values())).agent == "reader"
