"""Stream operators through the in-memory driver: what they yield, and that they keep the
plain loop's guarantees (a dropped event counts as processed, sends belong to the event,
on_error applies to the event whose step raised)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamjoin import App
from streamjoin.errors import AgentFailed, ConfigurationError
from streamjoin.events import RawRecord
from streamjoin.stream import Stream
from streamjoin.testing.driver import TestDriver
from tests.unit.runtime.agent_support import ManualSender, running


def make_app() -> App:
    return App("ops-app", topic_partitions=1)


async def test_values_filter_map_enumerate_compose_in_order() -> None:
    app = make_app()
    source = app.topic("n", value_serializer="json")
    got: list[tuple[int, int]] = []

    @app.agent(source)
    async def evens_squared(stream: Stream) -> None:
        async for i, square in (
            stream.values().filter(lambda v: v % 2 == 0).map(lambda v: v * v).enumerate(start=1)
        ):
            got.append((i, square))

    async with TestDriver(app) as driver:
        for v in range(7):
            await driver.put("n", value=v)
        await driver.drain()
        assert got == [(1, 0), (2, 4), (3, 16), (4, 36)]
        # the dropped (odd) events count as processed too: the last one once the agent asks
        # for the next item
        assert driver.committable() == {("n", 0): 7}


async def test_async_functions_and_flat_map() -> None:
    app = make_app()
    source = app.topic("lines", value_serializer="str")
    got: list[str] = []

    async def not_blank(line: str) -> bool:
        await asyncio.sleep(0)
        return bool(line.strip())

    async def upper(word: str) -> str:
        await asyncio.sleep(0)
        return word.upper()

    async def words_of(line: str) -> AsyncIterator[str]:
        for word in line.split():
            yield word

    @app.agent(source)
    async def words(stream: Stream) -> None:
        async for word in stream.values().filter(not_blank).flat_map(str.split).map(upper):
            got.append(word)

    @app.agent(source, name="async-flat")
    async def words_again(stream: Stream) -> None:
        async for word in stream.values().flat_map(words_of):
            got.append(word.lower())

    async with TestDriver(app) as driver:
        for line in ("a b", "   ", "c"):
            await driver.put("lines", value=line)
        await driver.drain()
        assert sorted(got) == sorted(["A", "B", "C", "a", "b", "c"])
        assert driver.committable() == {("lines", 0): 3}


async def test_stream_level_operators_work_on_events() -> None:
    app = make_app()
    source = app.topic("kv", key_serializer="str", value_serializer="json")
    got: list[Any] = []

    @app.agent(source)
    async def keys(stream: Stream) -> None:
        async for key in stream.filter(lambda e: e.key != "skip").map(lambda e: e.key):
            got.append(key)

    async with TestDriver(app) as driver:
        for key in ("a", "skip", "b"):
            await driver.put("kv", key=key, value=1)
        await driver.drain()
        assert got == ["a", "b"]


async def test_echo_forwards_with_the_events_key_then_yields() -> None:
    app = make_app()
    source = app.topic("in", key_serializer="str", value_serializer="json")
    copy = app.topic("copy", key_serializer="str", value_serializer="json")
    doubled = app.topic("doubled", key_serializer="str", value_serializer="json")
    got: list[Any] = []

    @app.agent(source)
    async def forward(stream: Stream) -> None:
        async for event in stream.echo(copy):
            got.append(event.value)

    @app.agent(source, name="doubler")
    async def doubler(stream: Stream) -> None:
        async for _ in stream.values().map(lambda v: v * 2).echo(doubled):
            pass

    async with TestDriver(app) as driver:
        await driver.put("in", key="k1", value=1)
        await driver.put("in", key="k2", value=2)
        await driver.drain()
        assert got == [1, 2]
        assert [(e.key, e.value) for e in driver.records("copy")] == [("k1", 1), ("k2", 2)]
        assert [(e.key, e.value) for e in driver.records("doubled")] == [("k1", 2), ("k2", 4)]


async def test_echo_sends_hold_the_event_until_acknowledged() -> None:
    app = make_app()
    source = app.topic("in", partitions=1, value_serializer="raw")
    out = app.topic("out", partitions=1, value_serializer="raw")

    @app.agent(source)
    async def forward(stream: Stream) -> None:
        async for _ in stream.values().filter(lambda v: v != b"drop").echo(out):
            pass

    sender = ManualSender()
    crashes: list[BaseException] = []
    async with running(app, sender, "in", crashes.append) as (runtime, _manager, task):
        for offset, value in enumerate((b"a", b"drop", b"b")):
            await runtime.dispatch_many([RawRecord("in", 0, offset, 0, None, value)], task)
        for _ in range(20):
            await asyncio.sleep(0)
        assert [v for _, v in sender.sent] == [b"a", b"b"]
        runtime.ack_finished()
        assert task.tracker.committable() == {}  # the echo of "a" is not acknowledged yet
        sender.futures[0].set_result(None)
        await asyncio.sleep(0)
        runtime.ack_finished()
        # "a" and the dropped "drop" count; "b" waits for its echo
        assert task.tracker.committable() == {("in", 0): 2}
        sender.futures[1].set_result(None)
        await asyncio.sleep(0)
        assert crashes == []


@pytest.mark.parametrize("where", ["filter", "map", "flat_map"])
async def test_an_error_in_a_step_gets_the_agents_policy_for_that_event(where: str) -> None:
    app = make_app()
    source = app.topic("t", value_serializer="json")
    got: list[tuple[int, int]] = []

    def check(v: int) -> int:
        if v == 13:
            raise ValueError("unlucky")
        return v

    @app.agent(source, on_error="skip")
    async def tolerant(stream: Stream) -> None:
        values = stream.values()
        if where == "filter":
            chain = values.filter(lambda v: check(v) > 0)
        elif where == "map":
            chain = values.map(check)
        else:
            chain = values.flat_map(lambda v: [check(v)])
        async for n, v in chain.enumerate():
            got.append((n, v))

    async with TestDriver(app) as driver:
        for v in (1, 13, 2):
            await driver.put("t", value=v)
        await driver.drain()
        # the failing event was skipped; the restarted function's chain counts again
        assert got == [(0, 1), (0, 2)]
        assert driver.committable() == {("t", 0): 3}


async def test_stop_policy_does_not_commit_the_failing_event() -> None:
    app = make_app()
    source = app.topic("t", value_serializer="json")

    @app.agent(source)
    async def fragile(stream: Stream) -> None:
        async for _ in stream.values().map(lambda v: 1 // v):
            pass

    async with TestDriver(app) as driver:
        for v in (1, 0, 2):
            await driver.put("t", value=v)
        with pytest.raises(AgentFailed, match="ZeroDivisionError"):
            await driver.drain()
        assert driver.committable() == {("t", 0): 1}


def test_bad_arguments_are_named() -> None:
    stream = Stream.__new__(Stream)
    with pytest.raises(ConfigurationError, match=r"filter\(\): expected a function"):
        stream.values().filter(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"enumerate\(\): start must be an int"):
        stream.values().enumerate("1")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"echo\(\): name at least one topic"):
        stream.echo()
    with pytest.raises(ConfigurationError, match=r"echo\(\): expected Topic objects"):
        stream.values().echo("out")  # type: ignore[arg-type]


async def test_flat_map_refuses_a_non_iterable_result() -> None:
    app = make_app()
    source = app.topic("t", value_serializer="json")

    @app.agent(source)
    async def wrong(stream: Stream) -> None:
        async for _ in stream.values().flat_map(lambda v: v):
            pass

    async with TestDriver(app) as driver:
        await driver.put("t", value=1)
        with pytest.raises(AgentFailed, match="must return an iterable"):
            await driver.drain()


async def test_group_by_a_field_name_rekeys_by_that_field() -> None:
    from dataclasses import dataclass

    from streamjoin.errors import MissingFieldError

    @dataclass
    class Order:
        account: str
        amount: int

    app = App("ops-app", topic_partitions=2)
    orders = app.topic("orders", key_serializer="str", value_serializer=Order)
    by_account = app.group_by(orders, "account", name="by-account", key_serializer="str")
    loose = app.topic("loose", key_serializer="str", value_serializer="json")
    app.group_by(loose, "user", name="by-user", key_serializer="str")

    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value=Order("a", 3))
        await driver.put("orders", key="o2", value=Order("b", 4))
        await driver.drain()
        got = sorted((e.key, e.value.amount) for e in driver.records(by_account.name))
        assert got == [("a", 3), ("b", 4)]
        await driver.put("loose", key="x", value={"user": "u1"})
        await driver.drain()
        assert [e.key for e in driver.records("ops-app-by-user-repartition")] == ["u1"]
        await driver.put("loose", key="y", value={"name": "no user"})
        with pytest.raises(AgentFailed, match="group_by 'by-user': the value has no field 'user'"):
            await driver.drain()
    assert issubclass(MissingFieldError, LookupError)


def test_group_by_refuses_a_field_that_is_no_name() -> None:
    app = make_app()
    with pytest.raises(ConfigurationError, match="'a b' is not a field name"):
        app.group_by("t", "a b", name="x")


async def test_through_forwards_every_record_with_its_key_timestamp_and_headers() -> None:
    app = App("through-app", topic_partitions=2)
    orders = app.topic("orders", key_serializer="str", value_serializer="json")
    wide = app.through(orders, "orders-wide", partitions=6)
    seen: list[tuple[str, int]] = []

    @app.agent(wide)
    async def read(stream: Stream) -> None:
        async for event in stream:
            seen.append((event.key, event.value["n"]))

    assert wide.partitions == 6 and wide.key_codec is not None
    async with TestDriver(app) as driver:
        for n in range(20):
            await driver.put(
                "orders",
                key=f"k{n % 7}",
                value={"n": n},
                timestamp_ms=1_000 + n,
                headers=(("trace", b"t%d" % n),),
            )
        await driver.drain()
        forwarded = driver.records("orders-wide")
    assert sorted(seen) == sorted((f"k{n % 7}", n) for n in range(20))
    assert sorted((e.timestamp, e.headers) for e in forwarded) == [
        (1_000 + n, (("trace", b"t%d" % n),)) for n in range(20)
    ]


def test_through_refuses_a_loop_and_partitions_for_a_declared_topic() -> None:
    app = App("through-bad")
    orders = app.topic("orders")
    with pytest.raises(ConfigurationError, match="into itself would loop"):
        app.through(orders, "orders")
    with pytest.raises(ConfigurationError, match="partitions= is for a topic given by name"):
        app.through(orders, app.topic("other"), partitions=3)
