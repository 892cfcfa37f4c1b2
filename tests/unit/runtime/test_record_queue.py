"""The fetch-loop-to-actor queue: order, backpressure in records, and waking readers."""

from __future__ import annotations

import asyncio

import pytest

from streamjoin.runtime.tasks.record_queue import RecordQueue


async def test_chunks_come_out_in_order_without_waiting_while_buffered() -> None:
    queue: RecordQueue[str] = RecordQueue(maxsize=10)
    await queue.put("ab", 2)
    await queue.put("c", 1)
    assert len(queue) == 3
    assert [queue.get_nowait() for _ in range(3)] == [(True, "ab"), (True, "c"), (False, None)]
    assert queue.empty() and len(queue) == 0


async def test_a_full_queue_holds_the_putter_until_a_reader_makes_room() -> None:
    queue: RecordQueue[int] = RecordQueue(maxsize=3)
    await queue.put(0, 2)
    await queue.put(1, 3)  # one chunk may overshoot the bound: 5 records
    assert len(queue) == 5 and queue.full()
    blocked = asyncio.create_task(queue.put(2, 1))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    assert await queue.get() == 0
    await asyncio.sleep(0.01)
    assert not blocked.done()  # 3 records left: still full
    assert await queue.get() == 1
    await asyncio.sleep(0.01)
    assert blocked.done()  # room again
    assert await queue.get() == 2


async def test_a_waiting_reader_wakes_on_the_next_put() -> None:
    queue: RecordQueue[str] = RecordQueue()
    reader = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    assert not reader.done()
    await queue.put("a", 1)
    await queue.put("b", 1)
    assert await reader == "a"
    assert await queue.get() == "b"


async def test_clear_drops_chunks_and_releases_a_blocked_putter() -> None:
    queue: RecordQueue[object] = RecordQueue(maxsize=1)
    await queue.put(1, 1)
    blocked = asyncio.create_task(queue.put(2, 1))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    queue.clear()
    await asyncio.wait_for(blocked, 1)
    queue.put_nowait("stop")  # ignores the bound, counts no records
    assert len(queue) == 1
    assert [queue.get_nowait()[1] for _ in range(2)] == [2, "stop"]


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="maxsize"):
        RecordQueue(maxsize=-1)
