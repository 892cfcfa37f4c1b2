"""Tables: dict-like state backed by one local store per partition and a compacted changelog.

A write made while an agent processes an event of partition *p* goes to the
table's partition *p* (the table is co-partitioned with that event's topic;
anything else is a :class:`TableAccessError`, never a silent write to the
wrong partition). Writes are buffered per partition and applied to the store,
together with the changelog offset, when the worker commits: changelog first,
then the store, then the source offsets (at-least-once).

This module holds no Kafka or asyncio code; the runtime opens the stores,
flushes buffers and restores partitions (``streamjoin.runtime.state``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedDict

from streamjoin.codecs import Codec
from streamjoin.errors import TableAccessError as TableAccessError
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.streams import current_record
from streamjoin.state.base import StorePartition
from streamjoin.topics import Topic

_MISSING = object()


@dataclass(eq=False)
class Table:
    """A partitioned key/value table; ``table[key]`` inside agents, like a dict."""

    name: str
    key_codec: Codec
    value_codec: Codec
    changelog: Topic
    default: Callable[[], Any] | None = None
    #: source topics whose events may write this table (its co-partition group)
    writers: frozenset[str] = frozenset()
    stores: dict[int, StorePartition] = field(default_factory=dict, repr=False)
    #: writes not yet in the store: partition -> key -> value bytes (None = delete), sorted so
    #: range scans can merge them with the store cheaply
    pending: dict[int, SortedDict[bytes, bytes | None]] = field(default_factory=dict, repr=False)
    #: writes being flushed right now (read through while the flush runs)
    flushing: dict[int, SortedDict[bytes, bytes | None]] = field(default_factory=dict, repr=False)
    #: partitions whose store is restored and may be used by agents
    ready: set[int] = field(default_factory=set, repr=False)

    @property
    def partitions(self) -> int:
        if self.changelog.partitions is None:
            raise TableAccessError(f"table {self.name!r} has no partition count yet")
        return self.changelog.partitions

    # -------------------------------------------------------------- partition routing

    def _partition(self, key_bytes: bytes | None, *, writing: bool) -> int:
        record = current_record()
        if record is not None:
            if record.topic not in self.writers and record.topic != self.changelog.name:
                raise TableAccessError(
                    f"table {self.name!r} used while processing {record.topic!r}, which is not "
                    f"co-partitioned with it (co-partitioned: {sorted(self.writers) or 'none'}). "
                    f"Declare app.table({self.name!r}, copartitioned_with=...) or repartition "
                    "the stream first."
                )
            partition = record.partition
        elif writing:
            raise TableAccessError(
                f"table {self.name!r} can only be written from an agent processing an event"
            )
        else:
            if key_bytes is None:
                raise TableAccessError(f"table {self.name!r}: None keys have no partition")
            partition = partition_for_key(key_bytes, self.partitions)
        if partition not in self.ready:
            raise TableAccessError(
                f"partition {partition} of table {self.name!r} is not active on this worker"
                + (" (still restoring)" if partition in self.stores else "")
            )
        return partition

    def _encode_key(self, key: Any) -> bytes:
        data = self.key_codec.dumps(key)
        if data is None:
            raise TableAccessError(f"table {self.name!r}: keys must not encode to None")
        return data

    def _lookup(self, partition: int, key_bytes: bytes) -> bytes | object | None:
        for layer in (self.pending, self.flushing):
            writes = layer.get(partition)
            if writes is not None and key_bytes in writes:
                return writes[key_bytes]
        return self.stores[partition].get(key_bytes) if partition in self.stores else None

    # -------------------------------------------------------------- dict API

    def __getitem__(self, key: Any) -> Any:
        key_bytes = self._encode_key(key)
        raw = self._lookup(self._partition(key_bytes, writing=False), key_bytes)
        if raw is None:
            if self.default is not None:
                return self.default()
            raise KeyError(key)
        return self.value_codec.loads(raw)  # type: ignore[arg-type]

    def get(self, key: Any, default: Any = None) -> Any:
        key_bytes = self._encode_key(key)
        raw = self._lookup(self._partition(key_bytes, writing=False), key_bytes)
        return default if raw is None else self.value_codec.loads(raw)  # type: ignore[arg-type]

    def __contains__(self, key: Any) -> bool:
        key_bytes = self._encode_key(key)
        return self._lookup(self._partition(key_bytes, writing=False), key_bytes) is not None

    def __setitem__(self, key: Any, value: Any) -> None:
        key_bytes = self._encode_key(key)
        partition = self._partition(key_bytes, writing=True)
        value_bytes = self.value_codec.dumps(value)
        self._pending(partition)[key_bytes] = value_bytes

    def __delitem__(self, key: Any) -> None:
        key_bytes = self._encode_key(key)
        partition = self._partition(key_bytes, writing=True)
        if self._lookup(partition, key_bytes) is None:
            raise KeyError(key)
        self._pending(partition)[key_bytes] = None

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """Items of the local active partitions (or one of them), pending writes included.

        Inside an agent, ``partition`` defaults to the current event's partition.
        """
        if partition is None:
            record = current_record()
            partitions = [record.partition] if record is not None else sorted(self.ready)
        else:
            partitions = [partition]
        for p in partitions:
            if p not in self.ready:
                raise TableAccessError(f"partition {p} of table {self.name!r} is not active here")
            # materialized: the caller may write to the table while iterating
            for key_bytes, value_bytes in list(TableView(self, p).scan(b"", None)):
                yield self.key_codec.loads(key_bytes), self.value_codec.loads(value_bytes)

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self.local_items()

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.local_items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.local_items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def _pending(self, partition: int) -> SortedDict[bytes, bytes | None]:
        writes = self.pending.get(partition)
        if writes is None:
            writes = self.pending[partition] = SortedDict()
        return writes

    def view(self, partition: int) -> TableView:
        """Byte-level access to one partition (join buffers, windowed tables)."""
        if partition not in self.ready:
            raise TableAccessError(
                f"partition {partition} of table {self.name!r} is not active here"
            )
        return TableView(self, partition)

    # -------------------------------------------------------------- used by the runtime

    def take_pending(self) -> dict[int, SortedDict[bytes, bytes | None]]:
        """Move pending writes to ``flushing`` and return them (start of a flush)."""
        for partition, writes in self.pending.items():
            target = self.flushing.get(partition)
            if target is None:
                self.flushing[partition] = writes
            else:
                target.update(writes)
        self.pending = {}
        return self.flushing

    def finish_flush(self, offsets: Mapping[int, int]) -> None:
        """Apply the flushed writes to the stores, each with its changelog offset."""
        for partition, writes in self.flushing.items():
            store = self.stores.get(partition)
            if store is not None and writes:
                store.write(writes, offsets.get(partition))
        self.flushing = {}

    def drop_partition(self, partition: int) -> None:
        """Forget a partition's unflushed writes (it was revoked before they were flushed)."""
        self.pending.pop(partition, None)
        self.flushing.pop(partition, None)
        self.ready.discard(partition)


class TableView:
    """One table partition as bytes: reads see buffered writes; writes are buffered and reach
    the changelog and the store at the next flush, like ``table[key] = value``."""

    __slots__ = ("_partition", "_table")

    def __init__(self, table: Table, partition: int) -> None:
        self._table = table
        self._partition = partition

    def get(self, key: bytes) -> bytes | None:
        found = self._table._lookup(self._partition, key)
        return found if isinstance(found, bytes) else None

    def put(self, key: bytes, value: bytes) -> None:
        self._table._pending(self._partition)[key] = value

    def delete(self, key: bytes) -> None:
        self._table._pending(self._partition)[key] = None

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Sorted items in [start, end), buffered writes merged over the store.

        Lazy: taking the first few items costs a few seeks however many writes are
        buffered in the range (the join core asks "what comes next?" once per event).
        """
        table, partition = self._table, self._partition
        layers: list[Iterator[tuple[bytes, bytes | None]]] = []
        for layer in (table.pending.get(partition), table.flushing.get(partition)):
            if layer:
                layers.append(_buffered_range(layer, start, end))
        store = table.stores.get(partition)
        stored: Iterator[tuple[bytes, bytes]] = (
            store.items(start, end) if store is not None else iter(())
        )
        if not layers:
            return stored
        return _merge_newest_first([*layers, stored])


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
