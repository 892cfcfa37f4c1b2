"""In-memory store backend, for tests and the in-memory test driver (no I/O).

Same contract as the RocksDB backend, including atomic writes and the
changelog offset; nothing survives the process.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping

from streamjoin.errors import ArgumentTypeError, StoreError
from streamjoin.state.base import check_changelog_offset

__all__ = ["MemoryStorePartition"]


class MemoryStorePartition:
    """A dict for lookups plus a sorted key list for ordered range scans."""

    def __init__(self, *, table: str = "", partition: int = 0) -> None:
        self.table = table
        self.partition = partition
        self._data: dict[bytes, bytes] = {}
        self._sorted: list[bytes] = []
        self._offset: int | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryStorePartition(table={self.table!r}, partition={self.partition})"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed")

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        return self._data.get(key)

    def contains(self, key: bytes) -> bool:
        self._check_open()
        return key in self._data

    def items(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        lo = 0 if start is None else bisect.bisect_left(self._sorted, start)
        hi = len(self._sorted) if end is None else bisect.bisect_left(self._sorted, end)
        # A copy of the key slice: writes during iteration must not shift positions.
        return self._iter_keys(self._sorted[lo:hi])

    def range_items(self, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        return list(self.items(start, end))

    def _iter_keys(self, keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        for key in keys:
            self._check_open()
            value = self._data.get(key)
            if value is not None:
                yield key, value

    def write(self, writes: Mapping[bytes, bytes | None], changelog_offset: int | None) -> None:
        self._check_open()
        check_changelog_offset(self._offset, changelog_offset, where=repr(self))
        # Validate everything first so a bad entry applies nothing (as a RocksDB batch would).
        for key, value in writes.items():
            if not isinstance(key, bytes):
                raise ArgumentTypeError(f"store keys are bytes, got {type(key).__name__}")
            if value is not None and not isinstance(value, bytes):
                raise ArgumentTypeError(
                    f"store values are bytes or None, got {type(value).__name__}"
                )
        data, order = self._data, self._sorted
        for key, value in writes.items():
            if value is None:
                if data.pop(key, None) is not None:
                    del order[bisect.bisect_left(order, key)]
            else:
                if key not in data:
                    bisect.insort(order, key)
                data[key] = value
        if changelog_offset is not None:
            self._offset = changelog_offset

    def changelog_offset(self) -> int | None:
        self._check_open()
        return self._offset

    def count(self) -> int:
        """Exact."""
        self._check_open()
        return len(self._data)

    def size_bytes(self) -> int:
        """Payload bytes (keys plus values), not Python object overhead."""
        self._check_open()
        return sum(len(k) + len(v) for k, v in self._data.items())

    def close(self) -> None:
        self._closed = True
