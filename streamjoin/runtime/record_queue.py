"""The queue between the fetch loop and one agent actor (asyncio, no Kafka).

``asyncio.Queue`` costs a coroutine round trip per record on both ends. This one
is filled a fetched batch at a time and read without suspending while records
are buffered; it still bounds what is buffered (backpressure on fetching), in
records, allowing one batch to overshoot the bound so a batch is never split.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from streamjoin.errors import ConfigurationError


class RecordQueue:
    """FIFO of queue items for one actor; ``maxsize`` 0 means unbounded."""

    __slots__ = ("_items", "_maxsize", "_not_empty", "_not_full")

    def __init__(self, maxsize: int = 0) -> None:
        if maxsize < 0:
            raise ConfigurationError(f"maxsize must be >= 0, got {maxsize}")
        self._items: deque[object] = deque()
        self._maxsize = maxsize
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()

    def __len__(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return bool(self._maxsize) and len(self._items) >= self._maxsize

    async def put_many(self, items: Iterable[object]) -> None:
        """Append ``items`` once the queue has room (waits while it is full)."""
        while self.full():
            self._not_full.clear()
            await self._not_full.wait()
        self._items.extend(items)
        if self._items:
            self._not_empty.set()

    def put_nowait(self, item: object) -> None:
        """Append one item now, ignoring the bound (the stop sentinel)."""
        self._items.append(item)
        self._not_empty.set()

    def get_nowait(self) -> tuple[bool, object]:
        """``(True, item)``, or ``(False, None)`` when the queue is empty."""
        if not self._items:
            return False, None
        item = self._items.popleft()
        if not self._not_full.is_set() and not self.full():
            self._not_full.set()
        return True, item

    async def get(self) -> object:
        """The next item, waiting for one if needed."""
        while not self._items:
            self._not_empty.clear()
            await self._not_empty.wait()
        return self.get_nowait()[1]

    def clear(self) -> None:
        self._items.clear()
        self._not_full.set()
