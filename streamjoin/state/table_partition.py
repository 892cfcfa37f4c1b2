"""One table partition at run time: its store plus the writes not yet in it (pure, no I/O).

Writes made while processing events are buffered here and reach the changelog and
the store only when the worker flushes. A buffer is a plain dict until a range scan
needs it in order; from then on it is a :class:`SortedDict`, so scans merge it with
the store lazily. Writing a new key into a plain dict costs a fraction of keeping
keys sorted, and most tables scan rarely (windowed tables once per flush) while join
buffers scan once per event (their buffer turns sorted at its first scan). The worker
flushes: :meth:`take_pending` hands them out, :meth:`finish_flush` applies
them with the changelog offset they reached, :meth:`abandon` forgets them when the
partition is lost (its next owner replays the events that made them). Reads always
see the newest layer first: pending, then flushing, then the store. This is the
partition's transaction: nothing written through it is durable before a flush.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from sortedcontainers import SortedDict

from streamjoin.errors import StoreCorrupted
from streamjoin.state.base import StorePartition

__all__ = ["Buffer", "TablePartition"]

#: buffered writes, key -> value (None = delete): a dict, sorted once a scan needs it
Buffer = dict[bytes, bytes | None] | SortedDict[bytes, bytes | None]

_MISSING = object()


class TablePartition:
    """The store and the buffered writes of partition ``partition`` of table ``table``."""

    __slots__ = ("abandoned", "corrupted", "flushing", "partition", "pending", "store", "table")

    def __init__(self, table: str, partition: int, store: StorePartition) -> None:
        self.table = table
        self.partition = partition
        self.store = store
        #: key -> value bytes (None = delete), written since the last flush began; a
        #: SortedDict once a scan needed it in order (see the module docstring)
        self.pending: Buffer = {}
        #: writes of the flush under way (read through while it runs)
        self.flushing: Buffer = {}
        #: the partition was lost: a flush under way must not send or apply its writes
        self.abandoned = False
        #: a flush's read found the store corrupted (the commit reports it for a rebuild)
        self.corrupted: StoreCorrupted | None = None

    def __repr__(self) -> str:
        return f"TablePartition({self.table!r}, {self.partition})"

    # ------------------------------------------------------------ the KeyValueView contract

    def lookup(self, key: bytes) -> bytes | None:
        value = self.pending.get(key, _MISSING)
        if value is _MISSING:
            value = self.flushing.get(key, _MISSING)
            if value is _MISSING:
                return self.store.get(key)
        return value  # type: ignore[return-value]

    def get(self, key: bytes) -> bytes | None:
        return self.lookup(key)

    def put(self, key: bytes, value: bytes | None) -> None:
        self.pending[key] = value

    def delete(self, key: bytes) -> None:
        self.pending[key] = None

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Sorted items in [start, end), buffered writes merged over the store.

        Lazy: taking the first few items costs a few seeks however many writes are
        buffered in the range (the join core asks "what comes next?" once per event).
        """
        layers: list[Iterator[tuple[bytes, bytes | None]]] = []
        if self.pending:
            self.pending = pending = _sorted(self.pending)
            layers.append(_buffered_range(pending, start, end))
        if self.flushing:
            self.flushing = flushing = _sorted(self.flushing)
            layers.append(_buffered_range(flushing, start, end))
        stored = self.store.items(start, end)
        if not layers:
            return stored
        return _merge_newest_first([*layers, stored])

    # ------------------------------------------------------------ flushing

    @property
    def flush_interrupted(self) -> bool:
        """A previous flush did not finish: its writes may be in the changelog already."""
        return bool(self.flushing)

    def take_pending(self) -> Buffer:
        """Move pending writes to ``flushing`` and return everything being flushed (in no
        particular order)."""
        if self.pending:
            if self.flushing:
                self.flushing.update(self.pending)
            else:
                self.flushing = self.pending
            self.pending = {}
        return self.flushing

    def finish_flush(self, changelog_offset: int | None) -> None:
        """Apply the flushed writes to the store with the changelog offset they reached
        (nothing, if the partition was lost meanwhile: its store may be closed already)."""
        if self.abandoned:
            return
        if self.flushing:
            self.store.write(self.flushing, changelog_offset)
        self.flushing = {}

    def abandon(self) -> int:
        """Forget unflushed writes (the partition was lost); returns how many were dropped."""
        dropped = len(self.pending) + len(self.flushing)
        self.abandoned = True
        self.pending = {}
        self.flushing = {}
        return dropped


def _sorted(layer: Buffer) -> SortedDict[bytes, bytes | None]:
    return layer if isinstance(layer, SortedDict) else SortedDict(layer)


def _buffered_range(
    layer: SortedDict[bytes, bytes | None], start: bytes, end: bytes | None
) -> Iterator[tuple[bytes, bytes | None]]:
    for key in layer.irange(start, end, inclusive=(True, False)):
        yield key, layer[key]


def _merge_newest_first(
    sources: Sequence[Iterator[tuple[bytes, bytes | None]]],
) -> Iterator[tuple[bytes, bytes]]:
    """Merge key-sorted sources lazily; on equal keys the earliest source wins, and a None
    value (a buffered delete) hides the key."""
    heap: list[tuple[bytes, int, bytes | None]] = []
    iters = list(sources)
    for rank, it in enumerate(iters):
        first = next(it, None)
        if first is not None:
            heap.append((first[0], rank, first[1]))
    heapq.heapify(heap)
    last: bytes | None = None
    while heap:
        key, rank, value = heap[0]
        following = next(iters[rank], None)
        if following is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (following[0], rank, following[1]))
        if key == last:
            continue  # an older layer's version of a key already decided
        last = key
        if value is not None:
            yield key, value
