"""Windowed tables: per-key values in tumbling or hopping windows, purged after retention.

Stored in an ordinary table partition (so they have a changelog, restore and
standbys like any table) under three key spaces of the partition's byte view:

* ``0x00 + window_key(key, start)`` -> value: one entry per key and window;
* ``0x01 + start + length-prefixed key`` -> empty: an index by window start, so
  expiry reads only windows that expired, never the whole partition;
* ``0x02`` -> the partition's stream time (max event timestamp seen).

A window ``[start, end)`` is kept while ``stream_time < end + retention``;
expiry runs when the worker flushes, before the writes reach the changelog.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from streamjoin.context import current_record
from streamjoin.state.keys import (
    encode_uint64,
    length_prefixed,
    split_window_key,
    window_key,
    window_key_prefix,
)
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.windows import WindowSpec
from streamjoin.tables import Table, TableAccessError

DATA = b"\x00"
INDEX = b"\x01"
STREAM_TIME = b"\x02stream-time"


@dataclass(eq=False)
class WindowedTable(Table):
    """``table[key]`` reads and writes the value of the current event's window.

    With hopping windows an event falls into several windows: use
    :meth:`update` (applied to each of them) instead of item assignment.
    """

    windows: WindowSpec | None = field(default=None, repr=False)

    def _spec(self) -> WindowSpec:
        if self.windows is None:
            raise TableAccessError(f"windowed table {self.name!r} has no window spec")
        return self.windows

    def _event_context(self) -> tuple[TablePartition, int]:
        record = current_record()
        if record is None:
            raise TableAccessError(
                f"windowed table {self.name!r} is used from agents (the event gives the window); "
                "use windows(key, from_ms, to_ms) elsewhere"
            )
        view = self._state(None, writing=False)
        _advance_stream_time(view, record.timestamp)
        return view, record.timestamp

    def __getitem__(self, key: Any) -> Any:
        view, ts = self._event_context()
        start = self._spec().windows_for(ts)[-1][0]
        raw = view.get(DATA + window_key(self._encode_key(key), start))
        if raw is None:
            if self.default is not None:
                return self.default()
            raise KeyError(key)
        return self.value_codec.loads(raw)

    def __setitem__(self, key: Any, value: Any) -> None:
        windows = self._spec().windows_for(self._event_context()[1])
        if len(windows) != 1:
            raise TableAccessError(
                f"table {self.name!r} has hopping windows: an event is in {len(windows)} "
                "windows, so use table.update(key, fn) to change each of them"
            )
        self.update(key, lambda _old: value)

    def update(self, key: Any, fn: Callable[[Any], Any]) -> None:
        """Replace the value of ``key`` in every window of the current event by ``fn(old)``."""
        view, ts = self._event_context()
        key_bytes = self._encode_key(key)
        for start, _end in self._spec().windows_for(ts):
            data_key = DATA + window_key(key_bytes, start)
            raw = view.get(data_key)
            if raw is not None:
                old = self.value_codec.loads(raw)
            else:
                old = self.default() if self.default is not None else None
            encoded = self.value_codec.dumps(fn(old))
            if encoded is None:
                view.delete(data_key)
            else:
                view.put(data_key, encoded)
                view.put(INDEX + encode_uint64(start) + length_prefixed(key_bytes), b"")

    def windows_of(self, key: Any, from_ms: int, to_ms: int) -> list[tuple[int, Any]]:
        """(window start, value) of ``key`` for windows starting in [from_ms, to_ms]."""
        key_bytes = self._encode_key(key)
        view = self._state(key_bytes, writing=False)
        prefix = DATA + window_key_prefix(key_bytes)
        out = []
        for data_key, raw in view.scan(
            prefix + encode_uint64(max(from_ms, 0)), prefix + encode_uint64(to_ms + 1)
        ):
            _, start = split_window_key(data_key[1:])
            out.append((start, self.value_codec.loads(raw)))
        return out

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """((key, window start), value) of the local windows."""
        partitions = self.active_partitions() if partition is None else [partition]
        for p in partitions:
            # materialized: the caller may write to the table while iterating
            for data_key, raw in list(self.active_partition(p).scan(DATA, INDEX)):
                key_bytes, start = split_window_key(data_key[1:])
                yield (self.key_codec.loads(key_bytes), start), self.value_codec.loads(raw)

    def expire(self) -> int:
        """Delete windows past retention in every active partition; returns how many."""
        return sum(
            self.expire_partition(self.active_partition(p)) for p in self.active_partitions()
        )

    def before_flush(self, state: TablePartition) -> None:
        self.expire_partition(state)

    def expire_partition(self, view: TablePartition) -> int:
        """Delete the partition's windows past retention; returns how many."""
        spec = self._spec()
        raw_time = view.get(STREAM_TIME)
        if raw_time is None:
            return 0
        stream_time = int(raw_time)
        # expired: start + size + retention <= stream_time
        cutoff = stream_time - spec.size_ms - spec.retention_ms
        if cutoff < 0:
            return 0
        expired = list(view.scan(INDEX, INDEX + encode_uint64(cutoff + 1)))
        for index_key, _ in expired:
            start = int.from_bytes(index_key[1:9], "big")
            key_bytes = index_key[9 + 4 :]
            view.delete(DATA + window_key(key_bytes, start))
            view.delete(index_key)
        return len(expired)


def _advance_stream_time(view: TablePartition, timestamp_ms: int) -> None:
    current = view.get(STREAM_TIME)
    if current is None or int(current) < timestamp_ms:
        view.put(STREAM_TIME, str(timestamp_ms).encode())
