"""The fetch-loop-to-actor queue: order, backpressure in records, and waking readers."""

from __future__ import annotations

import asyncio

import pytest

from streamjoin.runtime.record_queue import RecordQueue


async def test_items_come_out_in_order_without_waiting_while_buffered() -> None:
    queue = RecordQueue(maxsize=10)
    await queue.put_many([1, 2])
    await queue.put_many([3])
    assert [queue.get_nowait() for _ in range(4)] == [
        (True, 1),
        (True, 2),
        (True, 3),
        (False, None),
    ]
    assert queue.empty()


async def test_a_full_queue_holds_the_putter_until_a_reader_makes_room() -> None:
    queue = RecordQueue(maxsize=3)
    await queue.put_many(range(5))  # one batch may overshoot the bound
    assert len(queue) == 5 and queue.full()
    blocked = asyncio.create_task(queue.put_many([5, 6]))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    for expected in range(3):
        assert await queue.get() == expected
    await asyncio.sleep(0.01)
    assert blocked.done()  # 2 left < 3: room again
    assert [await queue.get() for _ in range(4)] == [3, 4, 5, 6]


async def test_a_waiting_reader_wakes_on_the_next_put() -> None:
    queue = RecordQueue()
    reader = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    assert not reader.done()
    await queue.put_many(["a", "b"])
    assert await reader == "a"
    assert await queue.get() == "b"


async def test_clear_drops_items_and_releases_a_blocked_putter() -> None:
    queue = RecordQueue(maxsize=1)
    await queue.put_many([1])
    blocked = asyncio.create_task(queue.put_many([2]))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    queue.clear()
    await asyncio.wait_for(blocked, 1)
    queue.put_nowait("stop")  # ignores the bound
    assert [queue.get_nowait()[1] for _ in range(2)] == [2, "stop"]


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="maxsize"):
        RecordQueue(maxsize=-1)
