"""The queue between the fetch loop and one agent actor (asyncio, no Kafka).

``asyncio.Queue`` costs a coroutine round trip per record on both ends, and even a
deque entry per record costs an append and a pop. This queue holds *chunks*: the
records of one fetched batch meant for one actor, queued as one item and counted
as as many records. The reader walks a chunk without touching the queue again.
The bound (backpressure on fetching) is in records; one chunk may overshoot it, so
a chunk is never split.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from streamjoin.errors import ConfigurationError

T = TypeVar("T")


class RecordQueue(Generic[T]):
    """FIFO of chunks for one actor; ``maxsize`` (records) 0 means unbounded."""

    __slots__ = ("_chunks", "_maxsize", "_not_empty", "_not_full", "_records")

    def __init__(self, maxsize: int = 0) -> None:
        if maxsize < 0:
            raise ConfigurationError(f"maxsize must be >= 0, got {maxsize}")
        self._chunks: deque[tuple[T, int]] = deque()
        self._records = 0
        self._maxsize = maxsize
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()

    def __len__(self) -> int:
        """Records buffered (not chunks)."""
        return self._records

    def empty(self) -> bool:
        return not self._chunks

    def full(self) -> bool:
        return bool(self._maxsize) and self._records >= self._maxsize

    async def put(self, chunk: T, records: int) -> None:
        """Append ``chunk`` (holding ``records`` records) once the queue has room."""
        while self.full():
            self._not_full.clear()
            await self._not_full.wait()
        self.put_nowait(chunk, records)

    def put_nowait(self, chunk: T, records: int = 0) -> None:
        """Append ``chunk`` now, ignoring the bound (the stop sentinel)."""
        self._chunks.append((chunk, records))
        self._records += records
        self._not_empty.set()

    def get_nowait(self) -> tuple[bool, T | None]:
        """``(True, chunk)``, or ``(False, None)`` when the queue is empty."""
        if not self._chunks:
            return False, None
        chunk, records = self._chunks.popleft()
        self._records -= records
        if not self._not_full.is_set() and not self.full():
            self._not_full.set()
        return True, chunk

    async def wait_nonempty(self, timeout: float) -> bool:
        """Whether a chunk is (or becomes, within ``timeout`` seconds) ready to take."""
        if self._chunks:
            return True
        if timeout <= 0:
            return False
        self._not_empty.clear()
        try:
            await asyncio.wait_for(self._not_empty.wait(), timeout)
        except TimeoutError:
            return bool(self._chunks)
        return bool(self._chunks)

    def wake(self) -> None:
        """End a :meth:`wait_nonempty` now (it answers whether a chunk is ready)."""
        self._not_empty.set()

    async def get(self) -> T:
        """The next chunk, waiting for one if needed."""
        while not self._chunks:
            self._not_empty.clear()
            await self._not_empty.wait()
        chunk, records = self._chunks.popleft()
        self._records -= records
        if not self._not_full.is_set() and not self.full():
            self._not_full.set()
        return chunk

    def clear(self) -> None:
        self._chunks.clear()
        self._records = 0
        self._not_full.set()
