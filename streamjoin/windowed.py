"""Windowed tables: per-key values in tumbling or hopping windows, purged after retention.

Stored in an ordinary table partition (so they have a changelog, restore and
standbys like any table) in the windowed layout join buffers use too
(:mod:`streamjoin.state.window_layout`):

* ``DATA + window_key(key, start)`` -> value: one entry per key and window;
* ``INDEX + u64(start) + length-prefixed key`` -> empty: an index by window start,
  so expiry reads only windows that expired, never the whole partition;
* ``STREAM_TIME`` (``META + b"stream-time"``) -> the partition's stream time (max
  event timestamp seen), a u64.

A window ``[start, end)`` is kept while ``stream_time < end + retention``;
expiry runs when the worker flushes, before the writes reach the changelog.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from streamjoin.context import current_event
from streamjoin.events import RawRecord
from streamjoin.state import window_layout as layout
from streamjoin.state.keys import encode_uint64, length_prefixed, window_key
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.window_layout import DATA, INDEX
from streamjoin.state.window_layout import STREAM_TIME_KEY as STREAM_TIME
from streamjoin.state.windows import TumblingWindows, WindowSpec, may_start_between
from streamjoin.tables import Table, TableAccessError

_U32 = struct.Struct(">I").pack
_U64 = struct.Struct(">Q").pack
_MAX_KEY_BYTES = 1 << 16


def _keys_of(key_bytes: bytes, start: int) -> tuple[bytes, bytes]:
    """``(DATA + window_key(key, start), INDEX + u64(start) + length_prefixed(key))``,
    packed directly for ordinary keys (once per table access); the layout's own functions,
    with their checks and errors, otherwise. The layout tests pin the bytes."""
    if type(key_bytes) is bytes and len(key_bytes) < _MAX_KEY_BYTES and 0 <= start < 1 << 63:
        prefixed = _U32(len(key_bytes)) + key_bytes
        at = _U64(start)
        return DATA + prefixed + at, INDEX + at + prefixed
    return DATA + window_key(key_bytes, start), INDEX + encode_uint64(start) + length_prefixed(
        key_bytes
    )


def _data_key_of(key_bytes: bytes, start: int) -> bytes:
    """The first of :func:`_keys_of` alone (a read needs no index key)."""
    if type(key_bytes) is bytes and len(key_bytes) < _MAX_KEY_BYTES and 0 <= start < 1 << 63:
        return DATA + _U32(len(key_bytes)) + key_bytes + _U64(start)
    return DATA + window_key(key_bytes, start)


@dataclass(eq=False)
class WindowedTable(Table):
    """``table[key]`` reads and writes the value of the current event's window.

    With hopping windows an event falls into several windows: use
    :meth:`update` (applied to each of them) instead of item assignment.
    """

    windows: WindowSpec | None = field(default=None, repr=False)
    #: (record, its table partition, its windows) of the event last seen
    _context: tuple[RawRecord, TablePartition, list[tuple[int, int]]] | None = field(
        default=None, init=False, repr=False
    )
    #: (record, partition, windows, key, its data key, the window existed, the key's bytes)
    #: of the last read of the current window: ``table[key] = ...`` right after (``+=``) in
    #: the same event (the same record) reuses them
    _last_read: (
        tuple[RawRecord, TablePartition, list[tuple[int, int]], Any, bytes, bool, bytes] | None
    ) = field(default=None, init=False, repr=False)

    #: partition -> [its view, the latest event timestamp seen there]: the partition's
    #: stream time is written once per flush (before expiry reads it), not once per event
    _latest: dict[int, list[Any]] = field(default_factory=dict, init=False, repr=False)
    #: partition -> (its view, the cutoff of its last expiry pass): that view holds no
    #: window starting at or before the cutoff, so the next pass scans only if a window can
    #: start between the two cutoffs (stream time crossed a window start) or a window that
    #: old was created since (see _index_window)
    _expired_through: dict[int, tuple[TablePartition, int]] = field(
        default_factory=dict, init=False, repr=False
    )
    #: the largest of those cutoffs: a window created starting at or before it may be one
    #: its partition's last pass would have removed
    _expiry_floor: int = field(default=-1, init=False, repr=False)

    def _spec(self) -> WindowSpec:
        if self.windows is None:
            raise TableAccessError(f"windowed table {self.name!r} has no window spec")
        return self.windows

    def _event_context(self) -> tuple[RawRecord, TablePartition, list[tuple[int, int]]]:
        """The current event's record, table partition and windows.

        Computed once per event: ``counts[k] += 1`` reads and writes the table, and each
        access would otherwise look up the partition and compute the windows again (kept
        with the record, so another event recomputes; the tumbling window of the previous
        event is reused while the timestamp falls in it). The event's timestamp moves the
        partition's stream time in memory (``_latest``): it is written to the partition
        once per flush, by the expiry pass that reads it.
        """
        event = current_event.get()
        if event is None:
            raise TableAccessError(
                f"windowed table {self.name!r}: table[key], get and `in` read the current "
                "event's window, so they work inside agents only; elsewhere use "
                "table.windows_of(key, from_ms, to_ms)"
            )
        record = event.record
        context = self._context
        if context is not None and context[0] is record:
            return context
        view = event.table_partition(self.name)
        if view is None:
            view = self._state(None, writing=False)  # (raises, naming the problem)
        timestamp = record.timestamp
        if (
            context is not None
            and type(timestamp) is int
            and context[2][0][0] <= timestamp < context[2][0][1]
            and type(self.windows) is TumblingWindows
        ):
            windows = context[2]  # the previous event's one window holds this one too
        else:
            windows = self._spec().windows_for(timestamp)  # (refuses a bad timestamp)
        seen = self._latest.get(view.partition)
        if seen is None or seen[0] is not view:
            _stream_time(view)  # (refuses state of an earlier layout, at its first event)
            self._latest[view.partition] = [view, timestamp]
        elif timestamp > seen[1]:
            seen[1] = timestamp
        context = self._context = (record, view, windows)
        return context

    def _current_value(self, key: Any) -> bytes | None:
        """The stored value of ``key`` in the current event's (latest) window.

        Remembers what it read, so that ``table[key] = ...`` right after (``+=``) knows
        the window exists without reading it again."""
        record, view, windows = self._event_context()
        key_bytes = self._encode_key(key)
        data_key = _data_key_of(key_bytes, windows[-1][0])
        raw = view.lookup(data_key)
        self._last_read = (record, view, windows, key, data_key, raw is not None, key_bytes)
        return raw

    def __getitem__(self, key: Any) -> Any:
        raw = self._current_value(key)
        if raw is None:
            if self.default is not None:
                return self.default()
            raise KeyError(key)
        return self._load_value(raw)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key`` in the current event's window, else ``default``."""
        raw = self._current_value(key)
        return default if raw is None else self._load_value(raw)

    def __contains__(self, key: Any) -> bool:
        return self._current_value(key) is not None

    def __delitem__(self, key: Any) -> None:
        """Delete ``key`` from every window of the current event (KeyError if in none)."""
        _, view, windows = self._event_context()
        self._last_read = None
        key_bytes = self._encode_key(key)
        found = False
        for start, _end in windows:
            data_key, index_key = _keys_of(key_bytes, start)
            if view.get(data_key) is not None:
                found = True
                view.delete(data_key)
                view.delete(index_key)
        if not found:
            raise KeyError(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        last_read, self._last_read = self._last_read, None
        event = current_event.get()
        index_key: bytes | None
        if (
            last_read is not None
            and event is not None
            and last_read[0] is event.record  # the same event
            and type(last_read[3]) is type(key)
            and last_read[3] == key
        ):
            # ``+=``: the key was just read in this window (type too: 1 == True == 1.0)
            view, windows = last_read[1], last_read[2]
            data_key, existed, key_bytes = last_read[4], last_read[5], last_read[6]
            index_key = None  # packed below only if the window is new
        else:
            _, view, windows = self._event_context()
            key_bytes = self._encode_key(key)
            data_key, index_key = _keys_of(key_bytes, windows[0][0])
            existed = False
        if len(windows) != 1:
            raise TableAccessError(
                f"table {self.name!r} has hopping windows: an event is in {len(windows)} "
                "windows, so use table.update(key, fn) to change each of them"
            )
        encoded = self.value_codec.dumps(value)
        if encoded is None:
            view.delete(data_key)
            return
        view.put(data_key, encoded)
        if not existed:
            # a new window (or not known to exist): index it for expiry
            if index_key is None:
                index_key = _keys_of(key_bytes, windows[0][0])[1]
            self._index_window(view, index_key, windows[0][0])

    def update(self, key: Any, fn: Callable[[Any], Any]) -> None:
        """Replace the value of ``key`` in every window of the current event by ``fn(old)``."""
        _, view, windows = self._event_context()
        self._last_read = None
        key_bytes = self._encode_key(key)
        for start, _end in windows:
            data_key, index_key = _keys_of(key_bytes, start)
            raw = view.get(data_key)
            if raw is not None:
                old = self._load_value(raw)
            else:
                old = self.default() if self.default is not None else None
            encoded = self.value_codec.dumps(fn(old))
            if encoded is None:
                view.delete(data_key)
            else:
                view.put(data_key, encoded)
                if raw is None:
                    self._index_window(view, index_key, start)

    def _index_window(self, view: TablePartition, index_key: bytes, start: int) -> None:
        """Index a window just created, for expiry."""
        view.put(index_key, b"")
        if start <= self._expiry_floor:
            # a late event in a window as old as one its partition expired already: the
            # next expiry pass scans (and removes it, if it is past retention)
            self._expired_through.pop(view.partition, None)

    def windows_of(self, key: Any, from_ms: int, to_ms: int) -> list[tuple[int, Any]]:
        """(window start, value) of ``key`` for windows starting in [from_ms, to_ms]."""
        key_bytes = self._encode_key(key)
        view = self._state(key_bytes, writing=False)
        out = []
        for data_key, raw in view.scan(*layout.data_range(key_bytes, max(from_ms, 0), to_ms)):
            out.append((layout.split_data_key(data_key).time_ms, self.value_codec.loads(raw)))
        return out

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """((key, window start), value) of the local windows."""
        partitions = self.active_partitions() if partition is None else [partition]
        for p in partitions:
            # materialized: the caller may write to the table while iterating
            for data_key, raw in list(self.active_partition(p).scan(*layout.namespace_range(DATA))):
                _, key_bytes, start, _ = layout.split_data_key(data_key)
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
        # it may delete the window a read remembered: the next write indexes it again
        self._last_read = None
        spec = self._spec()
        seen = self._latest.get(view.partition)
        try:
            if seen is not None and seen[0] is view:
                _advance_stream_time(view, seen[1])
            stream_time = _stream_time(view)
        except layout.IncompatibleWindowState as exc:
            raise layout.IncompatibleWindowState(
                f"windowed table {self.name!r} partition {view.partition}: {exc}"
            ) from None
        if stream_time is None:
            return 0
        # expired: start + size + retention <= stream_time
        cutoff = stream_time - spec.size_ms - spec.retention_ms
        if cutoff < 0:
            return 0
        last = self._expired_through.get(view.partition)
        if last is not None and last[0] is view and not may_start_between(spec, last[1], cutoff):
            return 0  # nothing expired since the last pass (it scanned everything up to it)
        expired = list(view.scan(*layout.index_range(cutoff + 1)))
        for index_key, _ in expired:
            start, prefixed_key = layout.split_index_key(index_key)
            view.delete(layout.data_key(layout.strip_length_prefix(prefixed_key), start))
            view.delete(index_key)
        self._expired_through[view.partition] = (view, cutoff)
        self._expiry_floor = max(self._expiry_floor, cutoff)
        return len(expired)


def _stream_time(view: TablePartition) -> int | None:
    """The partition's stream time; None before its first event.

    State written before the shared window layout (stream time as ASCII under
    another key) is :class:`~streamjoin.state.window_layout.IncompatibleWindowState`:
    its windows would be unreadable, so it is refused rather than misread.
    """
    raw = view.get(STREAM_TIME)
    if raw is not None:
        return layout.decode_meta_int(STREAM_TIME, raw)
    legacy = view.get(layout.LEGACY_TABLE_STREAM_TIME_KEY)
    if legacy is not None:
        raise layout.IncompatibleWindowState(
            f"found the stream time {legacy!r} of an earlier streamjoin version under "
            f"{layout.LEGACY_TABLE_STREAM_TIME_KEY!r}: windowed tables written by earlier "
            "versions must be reset (stop the app, delete the state directory and the "
            "table's changelog topic)"
        )
    return None


def _advance_stream_time(view: TablePartition, timestamp_ms: int) -> None:
    # once per event: stored u64s compare as bytes as their values do, so the common case
    # (a stored 8-byte time) needs no decoding
    raw = view.lookup(STREAM_TIME)
    if raw is not None and len(raw) == 8 and 0 <= timestamp_ms < 1 << 64:
        encoded = _U64(timestamp_ms)
        if raw < encoded:
            view.put(STREAM_TIME, encoded)
        return
    current = _stream_time(view)
    if current is None or current < timestamp_ms:
        view.put(STREAM_TIME, layout.encode_meta_int(timestamp_ms))
