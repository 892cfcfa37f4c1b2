"""The transaction barrier on running actors: held between two events for a snapshot,
and nothing new handed out while agents sharing a topic catch up."""

from __future__ import annotations

import asyncio

from streamjoin import App
from streamjoin.errors import StoreCorrupted
from streamjoin.events import RawRecord
from streamjoin.runtime.tasks.error_policy import corrupted_store_behind
from streamjoin.stream import Stream
from tests.unit.runtime.agent_support import ManualSender, running


def _record(offset: int) -> RawRecord:
    return RawRecord("t", 0, offset, 0, None, b"0")


async def test_quiesce_waits_for_the_event_inside_and_holds_the_next_until_resume() -> None:
    app = App("barrier-quiesce", topic_partitions=1)
    topic = app.topic("t", partitions=1)
    seen: list[int] = []
    gate = asyncio.Event()

    @app.agent(topic, name="slow")
    async def slow(stream: Stream) -> None:
        async for event in stream:
            if event.offset == 0:
                await gate.wait()
            seen.append(event.offset)

    async with running(app, ManualSender(), "t", lambda e: None) as (runtime, _, task):
        await runtime.dispatch_many([_record(0), _record(1)], task)
        await asyncio.sleep(0)
        assert runtime.barrier.inside_events() == ["slow#0"]
        # still inside event 0: the barrier stays closed
        assert not await runtime.barrier.quiesce(0.01)
        gate.set()
        assert await runtime.barrier.quiesce(1.0)
        assert seen == [0]  # event 0 finished; event 1 waits behind the barrier
        for _ in range(10):
            await asyncio.sleep(0)
        assert seen == [0] and runtime.barrier.inside_events() == []
        runtime.barrier.resume()
        for _ in range(10):
            await asyncio.sleep(0)
        assert seen == [0, 1]


async def test_settle_shared_hands_out_nothing_until_open_dispatch() -> None:
    app = App("barrier-shared", topic_partitions=1)
    topic = app.topic("t", partitions=1)
    seen: dict[str, list[int]] = {"a": [], "b": []}

    @app.agent(topic, name="a")
    async def a(stream: Stream) -> None:
        async for event in stream:
            seen["a"].append(event.offset)

    @app.agent(topic, name="b")
    async def b(stream: Stream) -> None:
        async for event in stream:
            seen["b"].append(event.offset)

    async with running(app, ManualSender(), "t", lambda e: None) as (runtime, _, task):
        await runtime.dispatch_many([_record(0)], task)
        assert await runtime.barrier.settle_shared(1.0)  # both agents caught up with offset 0
        assert seen == {"a": [0], "b": [0]} and runtime.barrier.sharing_behind() == []
        held = asyncio.ensure_future(runtime.dispatch_many([_record(1)], task))
        await asyncio.sleep(0.01)
        assert not held.done() and seen == {"a": [0], "b": [0]}
        runtime.barrier.open_dispatch()
        await held
        for _ in range(10):
            await asyncio.sleep(0)
        assert seen == {"a": [0, 1], "b": [0, 1]}


async def test_settle_shared_has_nothing_to_wait_for_without_agents_sharing_a_topic() -> None:
    app = App("barrier-alone", topic_partitions=1)
    topic = app.topic("t", partitions=1)
    gate = asyncio.Event()

    @app.agent(topic, name="alone")
    async def alone(stream: Stream) -> None:
        async for _ in stream:
            await gate.wait()  # inside an event: settling must not wait for it

    async with running(app, ManualSender(), "t", lambda e: None) as (runtime, _, task):
        await runtime.dispatch_many([_record(0)], task)
        await asyncio.sleep(0)
        assert await runtime.barrier.settle_shared(0.01)
        await asyncio.wait_for(runtime.dispatch_many([_record(1)], task), 1.0)  # still open
        gate.set()


def test_a_corrupted_store_is_found_behind_what_the_agent_raised() -> None:
    corrupted = StoreCorrupted("/tmp/store", "block checksum mismatch")
    try:
        try:
            raise corrupted
        except StoreCorrupted as exc:
            raise ValueError("the agent's own error") from exc
    except ValueError as raised:
        assert corrupted_store_behind(raised) is corrupted
    assert corrupted_store_behind(ValueError("no store involved")) is None
