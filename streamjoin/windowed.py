"""Windowed tables: per-key values in tumbling or hopping windows, purged after retention.

Stored in an ordinary table partition (so they have a changelog, restore and
standbys like any table) in the windowed layout join buffers use too
(:mod:`streamjoin.state.window_layout`, which builds every key):

* ``DATA + window_key(key, start)`` -> value: one entry per key and window;
* ``INDEX + u64(start) + length-prefixed key`` -> empty: an index by window start,
  so expiry reads only windows that expired, never the whole partition;
* ``STREAM_TIME_KEY`` (``META + b"stream-time"``) -> the partition's stream time
  (max event timestamp seen), a u64.

A window ``[start, end)`` is kept while ``stream_time < end + retention``;
expiry runs when the worker flushes, before the writes reach the changelog.

A :class:`WindowedTable` is a declaration: what it keeps per partition at run time
(stream time in memory, expiry progress, the event last seen) is a
:class:`~streamjoin.state.window_partition.WindowPartition` in the task owning the
partition, reached through :mod:`streamjoin.context`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from streamjoin.context import EventContext, TaskScope, current_event
from streamjoin.errors import TableAccessError
from streamjoin.state import window_layout as layout
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.window_layout import DATA, table_data_key, table_keys
from streamjoin.state.window_partition import WindowPartition
from streamjoin.state.windows import TumblingWindows, WindowSpec
from streamjoin.tables import Table


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

    def _event_partition(self) -> WindowPartition:
        """The current event's window partition, with the event's record and windows.

        Computed once per event: ``counts[k] += 1`` reads and writes the table, and each
        access would otherwise compute the windows again (kept with the record, so
        another event recomputes; the tumbling window of the previous event is reused
        while the timestamp falls in it). The event's timestamp moves the partition's
        stream time in memory: it is written to the partition once per flush, by the
        expiry pass that reads it.
        """
        event = current_event.get()
        if event is None:
            raise TableAccessError(
                f"windowed table {self.name!r}: table[key], get and `in` read the current "
                "event's window, so they work inside agents only; elsewhere use "
                "table.windows_of(key, from_ms, to_ms)"
            )
        record = event.record
        part = event.task.windows.get(self.name)
        if part is not None and part.record is record:
            return part
        if part is None:
            part = self._event_task_partition(event)
        timestamp = record.timestamp
        windows = part.windows
        if (
            part.record is not None
            and type(timestamp) is int
            and windows[0][0] <= timestamp < windows[0][1]
            and type(self.windows) is TumblingWindows
        ):
            pass  # the previous event's one window holds this one too
        else:
            windows = part.windows = self._spec().windows_for(timestamp)  # (refuses bad ones)
        latest = part.latest
        if latest is None or timestamp > latest:
            part.latest = timestamp
        part.record = record
        return part

    def _event_task_partition(self, event: EventContext) -> WindowPartition:
        """The event's task's window partition, made at its first event (or expiry)."""
        view = event.table_partition(self.name)
        if view is None:
            view = self._state(None, writing=False)  # (raises, naming the problem)
        return self._owned(event.task, view)

    def _owned(self, task: TaskScope, view: TablePartition) -> WindowPartition:
        part = task.windows.get(self.name)
        if part is None:
            part = task.windows[self.name] = WindowPartition(self.name, self._spec(), view)
        return part

    def _current_value(self, key: Any) -> bytes | None:
        """The stored value of ``key`` in the current event's (latest) window.

        Remembers what it read, so that ``table[key] = ...`` right after (``+=``) knows
        the window exists without reading it again."""
        part = self._event_partition()
        key_bytes = self._encode_key(key)
        windows = part.windows
        data_key = table_data_key(key_bytes, windows[-1][0])
        raw = part.view.lookup(data_key)
        part.last_read = (part.record, windows, key, data_key, raw is not None, key_bytes)
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
        part = self._event_partition()
        part.last_read = None
        view = part.view
        key_bytes = self._encode_key(key)
        found = False
        for start, _end in part.windows:
            data_key, index_key = table_keys(key_bytes, start)
            if view.get(data_key) is not None:
                found = True
                view.delete(data_key)
                view.delete(index_key)
        if not found:
            raise KeyError(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        event = current_event.get()
        part = None if event is None else event.task.windows.get(self.name)
        last_read = None if part is None else part.last_read
        index_key: bytes | None
        if (
            part is not None
            and last_read is not None
            and event is not None
            and last_read[0] is event.record  # the same event
            and type(last_read[2]) is type(key)
            and last_read[2] == key
        ):
            # ``+=``: the key was just read in this window (type too: 1 == True == 1.0)
            part.last_read = None
            windows = last_read[1]
            data_key, existed, key_bytes = last_read[3], last_read[4], last_read[5]
            index_key = None  # packed below only if the window is new
        else:
            part = self._event_partition()
            part.last_read = None
            windows = part.windows
            key_bytes = self._encode_key(key)
            data_key, index_key = table_keys(key_bytes, windows[0][0])
            existed = False
        if len(windows) != 1:
            raise TableAccessError(
                f"table {self.name!r} has hopping windows: an event is in {len(windows)} "
                "windows, so use table.update(key, fn) to change each of them"
            )
        encoded = self.value_codec.dumps(value)
        if encoded is None:
            part.view.delete(data_key)
            return
        part.view.put(data_key, encoded)
        if not existed:
            # a new window (or not known to exist): index it for expiry
            if index_key is None:
                index_key = table_keys(key_bytes, windows[0][0])[1]
            part.index_new_window(index_key, windows[0][0])

    def update(self, key: Any, fn: Callable[[Any], Any]) -> None:
        """Replace the value of ``key`` in every window of the current event by ``fn(old)``."""
        part = self._event_partition()
        part.last_read = None
        view = part.view
        key_bytes = self._encode_key(key)
        for start, _end in part.windows:
            data_key, index_key = table_keys(key_bytes, start)
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
                    part.index_new_window(index_key, start)

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
        """Delete windows past retention in every active partition; returns how many.

        (Each partition also expires its windows whenever the worker flushes it.)"""
        return sum(self._active_partition_state(p).expire() for p in self.active_partitions())

    def _active_partition_state(self, partition: int) -> WindowPartition:
        """The window partition of ``partition`` when it is active here (else raises)."""
        view = self.active_partition(partition)  # (raises unless it is active here)
        tables = self.link.tables
        task = None if tables is None else tables.active_task(self.name, partition)
        if task is None:
            raise TableAccessError(
                f"partition {partition} of table {self.name!r} is not active on this worker"
            )
        return self._owned(task, view)
