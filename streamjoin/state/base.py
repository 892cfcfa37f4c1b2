"""The local-state contract: what every store backend (RocksDB, memory) must provide.

A :class:`StorePartition` holds one table partition's state as raw bytes. The
table layer encodes keys and values; stores only order and persist them.
The one rule that matters for recovery: :meth:`StorePartition.write` applies
the data *and* the changelog offset it corresponds to atomically, so after a
crash the stored offset never claims a record whose data is missing (and no
data exists past the stored offset).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol, runtime_checkable

from streamjoin.errors import StoreError

__all__ = [
    "StorePartition",
    "check_changelog_offset",
    "unordered_items",
]


@runtime_checkable
class StorePartition(Protocol):
    """One table partition's local state: sorted raw-bytes keys plus the changelog offset."""

    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""
        ...

    def contains(self, key: bytes) -> bool:
        """Whether ``key`` has a value."""
        ...

    def items(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs sorted by key (unsigned byte order), ``start`` inclusive, ``end`` exclusive.

        None means unbounded on that side. Exhaust or close the iterator before
        :meth:`close`; backends may close unfinished ones themselves.
        """
        ...

    def range_items(self, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """The pairs of ``[start, end)`` in key order, read at once: for small ranges read
        per event (a join's partners), where an open iterator only costs."""
        ...

    def write(self, writes: Mapping[bytes, bytes | None], changelog_offset: int | None) -> None:
        """Apply puts (and deletes, value None) and the offset atomically: all or nothing.

        ``changelog_offset`` is the offset of the last changelog record these
        writes include; None leaves the stored offset as it is. Raises
        :class:`~streamjoin.errors.StoreError` if it is older than the stored one.
        """
        ...

    def changelog_offset(self) -> int | None:
        """Offset of the last changelog record applied (None: nothing applied yet)."""
        ...

    def count(self) -> int:
        """Number of keys; backends may estimate (see each backend's docs)."""
        ...

    def size_bytes(self) -> int:
        """Estimated size of the state (on disk, or in memory for the memory backend)."""
        ...

    def close(self) -> None:
        """Release the store; idempotent. Any later use raises a ``StoreError``."""
        ...


def unordered_items(writes: Mapping[bytes, bytes | None]) -> Iterable[tuple[bytes, bytes | None]]:
    """A mapping's pairs in any order, through dict's C view when it is a dict (buffered writes
    are SortedDicts, whose own ``items()`` iterates in Python): for batches, where distinct
    keys need no order."""
    if isinstance(writes, dict):
        return dict.items(writes)
    return writes.items()


def check_changelog_offset(stored: int | None, new: int | None, *, where: str) -> None:
    """Reject malformed offsets and offsets that move backwards (shared by all backends)."""
    if new is None:
        return
    if isinstance(new, bool) or not isinstance(new, int) or new < 0:
        raise StoreError(f"{where}: changelog offset must be an int >= 0, got {new!r}")
    if stored is not None and new < stored:
        raise StoreError(
            f"{where}: changelog offset {new} is older than the stored offset {stored}"
        )
