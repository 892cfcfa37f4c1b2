"""The state a join core reads and writes: one partition's sorted bytes (pure, no I/O).

The join core (:mod:`streamjoin.joins.core`) only ever talks to a
:class:`KeyValueView`, so the same code runs in a worker (a view over a
changelogged table partition, writes buffered until the next flush) and in a
Spark backfill (a :class:`MemoryKeyValueView`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, runtime_checkable

from sortedcontainers import SortedDict

from streamjoin.errors import ArgumentTypeError, InternalError

__all__ = ["FlushedKeyValueView", "KeyValueView", "MemoryKeyValueView"]


class KeyValueView(Protocol):
    """One partition's byte-level state; writes may be buffered by the runtime.

    Reads (``get`` and ``scan``) must reflect every earlier ``put``/``delete``
    through the same view. Callers must not write while a ``scan`` is being
    iterated: materialize it first (a runtime view may not support it).
    """

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Items with ``start <= key < end`` (``end`` None: unbounded), in key order."""
        ...

    # What the join core knows about its keys, for views that can save work with it (a
    # table partition: see TablePartition.insert); the answers are those of get/put/
    # delete/scan.

    def insert(self, key: bytes, value: bytes, group: bytes | None) -> None:
        """``put`` of a key known to be absent; ``group`` is its join-key group
        (:data:`~streamjoin.joins.core.BUFFER_GROUP_OF`) or None."""
        ...

    def remove(self, key: bytes, group: bytes | None) -> None:
        """``delete`` of a key known to be present; ``group`` as for :meth:`insert`."""
        ...

    def scan_group(self, group: bytes, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """``list(scan(start, end))`` where every key in range begins with ``group``."""
        ...


@runtime_checkable
class FlushedKeyValueView(KeyValueView, Protocol):
    """A view whose writes become durable only when a flush takes them (a table partition).

    A writer may keep a value in memory and write it just before each flush, through a
    hook (the join core's metadata, which changes with every event). Nothing but that
    writer may read the value in between.
    """

    def before_take(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` right before every flush takes the buffered writes."""
        ...

    def group_keys_by(self, group_of: Callable[[bytes], bytes | None]) -> None:
        """Index buffered writes by ``group_of(key)`` from now on, so that ``scan_group``
        reads only its group's (a core that reads partners by range asks for it; one that
        knows its partners' keys saves the indexing)."""
        ...


class MemoryKeyValueView:
    """A :class:`KeyValueView` in memory: for tests and Spark backfills.

    Stricter than it needs to be on one point: writing during an open scan
    raises :class:`~streamjoin.errors.InternalError` on the scan's next step, so code tested
    against it also works over views that cannot tolerate that.
    """

    __slots__ = ("_data", "_version")

    def __init__(self, items: Mapping[bytes, bytes] | None = None) -> None:
        self._data: SortedDict[bytes, bytes] = SortedDict()
        self._version = 0
        for key, value in (items or {}).items():
            self.put(key, value)

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        if not isinstance(key, bytes) or not isinstance(value, bytes):
            raise ArgumentTypeError(
                f"keys and values are bytes, got {type(key).__name__}, {type(value).__name__}"
            )
        self._data[key] = value
        self._version += 1

    def delete(self, key: bytes) -> None:
        if self._data.pop(key, None) is not None:
            self._version += 1

    def insert(self, key: bytes, value: bytes, group: bytes | None) -> None:
        self.put(key, value)

    def remove(self, key: bytes, group: bytes | None) -> None:
        self.delete(key)

    def scan_group(self, group: bytes, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        return list(self.scan(start, end))

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        version = self._version
        for key in self._data.irange(start, end, inclusive=(True, False)):
            if self._version != version:
                raise InternalError("the view was written while this scan was open")
            yield key, self._data[key]

    # ---------------------------------------------------------------- for tests and backfills

    def snapshot(self) -> dict[bytes, bytes]:
        """A copy of everything stored, in key order."""
        return dict(self._data.items())

    def __len__(self) -> int:
        return len(self._data)
