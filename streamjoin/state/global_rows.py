"""How a global table's local copy is laid out in a store (pure: no I/O of its own).

One store holds the whole copy: every row under ``d`` + its key, and each source
partition's next offset to read under ``o`` + the partition number. A fetched chunk's
rows and its partition's new position go in one batch (:func:`batch_writes`), so the
stored position never claims rows the store does not have. The worker's global-table
service, the test driver and the Spark bootstrap all write this layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

__all__ = [
    "GLOBAL_DIR",
    "ROW_PREFIX",
    "GlobalRowsStore",
    "MemoryRows",
    "Record",
    "RowStore",
    "batch_writes",
    "position_writes",
    "start_positions",
    "stored_positions",
]

#: where a state dir keeps the global tables' RocksDB databases: one per table
GLOBAL_DIR = "global"

#: (offset, key, value) of one record, as the changelog reader returns them
Record = tuple[int, bytes | None, bytes | None]

#: store key prefixes: rows (``d`` + key) and each source partition's next offset
#: (``o`` + partition number), written in the same batch
ROW_PREFIX = b"d"
_ROW_END = b"e"
_POSITION = b"o"
_POSITION_END = b"p"


# ---------------------------------------------------------------------- pure decisions


def batch_writes(
    records: Sequence[Record], partition: int, next_offset: int
) -> dict[bytes, bytes | None]:
    """One store batch for records of one partition: the last value per key (None
    deletes it; records without a key are skipped) and the partition's new position."""
    writes: dict[bytes, bytes | None] = {
        ROW_PREFIX + key: value for _, key, value in records if key is not None
    }
    writes[_POSITION + b"%d" % partition] = b"%d" % next_offset
    return writes


def stored_positions(store: RowStore) -> dict[int, int]:
    """Source partition -> the next offset to read, as stored with the rows."""
    return {int(key[1:]): int(value) for key, value in store.items(_POSITION, _POSITION_END)}


def start_positions(
    stored: Mapping[int, int], beginnings: Mapping[int, int], ends: Mapping[int, int]
) -> tuple[dict[int, int], bool]:
    """Where to read each partition from, and whether the copy must be wiped first.

    A stored position past the topic's end means the topic is not the one the copy was
    read from (deleted and recreated, or truncated): the copy is wiped and read again
    from the beginning. A position before the beginning (retention deleted records not
    yet read) resumes at the beginning.
    """
    if any(stored.get(p, 0) > end for p, end in ends.items()):
        return dict(beginnings), True
    return {p: max(stored.get(p, 0), beginnings.get(p, 0)) for p in ends}, False


# ---------------------------------------------------------------------- the local copy


class RowStore(Protocol):
    """What a global table's copy needs of a store (a RocksDB partition has it all)."""

    def get(self, key: bytes) -> bytes | None: ...

    def items(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def write(self, writes: Mapping[bytes, bytes | None], changelog_offset: int | None) -> None: ...

    def close(self) -> None: ...


class MemoryRows:
    """A memory copy: a plain dict (no key order to keep: a global table is read by key,
    and a sorted list would make a 1M-row restore quadratic)."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def items(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs within ``[start, end)``, in no particular order."""
        for key, value in list(self._data.items()):
            if (start is None or key >= start) and (end is None or key < end):
                yield key, value

    def write(self, writes: Mapping[bytes, bytes | None], changelog_offset: int | None) -> None:
        data = self._data
        for key, value in writes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value

    def close(self) -> None:
        self._data = {}


class GlobalRowsStore:
    """A global table's rows in a store (what :class:`GlobalTable` reads)."""

    def __init__(self, store: RowStore) -> None:
        self.store = store

    def get(self, key: bytes) -> bytes | None:
        return self.store.get(ROW_PREFIX + key)

    def rows(self) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self.store.items(ROW_PREFIX, _ROW_END):
            yield key[1:], value


def position_writes(positions: Mapping[int, int]) -> dict[bytes, bytes | None]:
    """The store entries recording each partition's next offset to read."""
    return {_POSITION + b"%d" % p: b"%d" % offset for p, offset in positions.items()}
