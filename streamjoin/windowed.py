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

Emission (``emit=``): ``"update"`` (the default) lets agents read and change a window
until it closes (``end + grace``; later records are late for it: dropped and counted), and
read it until it expires. ``"close"`` gives each window one final result, once the partition's
stream time reaches its close time (``end + grace``): sent to ``emit_to`` and/or passed
to ``on_window_close(key, (start, end), value)`` by the flush that sees it (see
:mod:`streamjoin.state.window_partition` for when a window closes and what is late).
With ``emit="close"`` the partition also keeps ``CLOSED_THROUGH_KEY`` (``META +
b"closed-through"``), the stream time through which windows have closed, written in the
same flush as the writes and sent only after the results (docs/windows.md, "Emission").

A :class:`WindowedTable` is a declaration: what it keeps per partition at run time
(stream time in memory, expiry progress, the event last seen) is a
:class:`~streamjoin.state.window_partition.WindowPartition` in the task owning the
partition, reached through :mod:`streamjoin.context`.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, Literal

from streamjoin.context import EventContext, TaskScope, current_event
from streamjoin.errors import CodecError, ConfigurationError, TableAccessError
from streamjoin.events import Event, RawRecord
from streamjoin.quick_codecs import dump, load
from streamjoin.quick_partition import partition_of
from streamjoin.state import window_layout as layout
from streamjoin.state.table_partition import Emitted, TablePartition
from streamjoin.state.window_layout import DATA, table_data_key, table_keys
from streamjoin.state.window_partition import (
    Closing,
    WindowPartition,
    WindowStats,
    close_time_offset,
)
from streamjoin.state.windows import TumblingWindows, WindowSpec
from streamjoin.tables import Table
from streamjoin.topics import Topic
from streamjoin.window_views import (
    FieldOrExtractor,
    WindowedView,
    relative_to_field,
    relative_to_now,
    relative_to_stream,
)

log = logging.getLogger("streamjoin.windows")
#: (``Final``: a C static when compiled, not a module dict lookup per use)
_CURRENT_EVENT: Final = current_event
_TUMBLING: Final = TumblingWindows

#: ``emit=``: every change stays readable and writable until expiry, or one final result
#: per window when it closes
Emit = Literal["update", "close"]
#: ``on_window_close(key, (start, end), value)``: called once per closed window
WindowCloseCallback = Callable[[Any, tuple[int, int], Any], object]


@dataclass(eq=False)
class WindowedTable(Table):
    """``table[key]`` reads and writes the value of the current event's window.

    With hopping windows an event falls into several windows: use
    :meth:`update` (applied to each of them) instead of item assignment.
    """

    #: what log messages call it (a class attribute, left unannotated: a compiled
    #: dataclass would take ``ClassVar[str]`` for a field)
    kind = "windowed table"
    windows: WindowSpec | None = field(default=None, repr=False)
    #: ``"update"`` or ``"close"`` (see the module docstring)
    emit: Emit = "update"
    #: emit="close": the topic final results are sent to (key: the table's key, value: the
    #: final value, window bounds in the ``window-start``/``window-end`` headers)
    emit_to: Topic | None = None
    #: emit="close": called with ``(key, (start, end), value)`` for each final result
    on_window_close: WindowCloseCallback | None = None
    #: emit="close": a partition that receives no event for this long (ms, wall clock)
    #: moves its stream time on with the wall clock (docs/windows.md)
    close_idle_after_ms: int | None = None
    #: the event time windows are assigned by (default: the record timestamp)
    timestamp: Callable[[Event], int] | None = field(default=None, repr=False)
    #: the app's topics, to decode an event for ``timestamp``
    topics: Mapping[str, Topic] = field(default_factory=dict, repr=False)
    #: the wall clock ``close_idle_after`` is measured with (seconds, monotonic)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_emission(
            self.name,
            windows=self.windows,
            emit=self.emit,
            emit_to=self.emit_to,
            on_window_close=self.on_window_close,
            close_idle_after_ms=self.close_idle_after_ms,
            timestamp=self.timestamp,
        )
        if self.closes_windows:
            # (set here, not copied: a subclass made from this table's fields overrides it)
            self.before_flush = self.partition_for_flush

    @property
    def closes_windows(self) -> bool:
        """Whether windows get one final result when they close (``emit="close"``)."""
        return self.emit == "close"

    def emission_stats(self) -> WindowStats:
        """This table's emission counters on this worker (running or last run): final
        results produced, late events dropped, final results whose callback or encoding
        failed."""
        found = self.link.window_stats.get(self.name)
        return WindowStats() if found is None else found

    def registered_stats(self) -> WindowStats:
        """This table's counters on this worker, made at first use: every partition's
        window state counts into them (:meth:`emission_stats` reads them)."""
        stats = self.link.window_stats.get(self.name)
        if stats is None:
            stats = self.link.window_stats[self.name] = WindowStats()
        return stats

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
        event = _CURRENT_EVENT.get()
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
        if self.timestamp is not None:
            timestamp = self._event_time(record)
        windows = part.windows
        latest = part.latest
        if (
            windows  # (empty: no event yet, or the last one's windows had all closed)
            and type(timestamp) is int
            and windows[0][0] <= timestamp < windows[0][1]
            and type(self.windows) is _TUMBLING
        ):
            pass  # the previous event's one window holds this one too (and is still open)
        else:
            windows = part.windows = self._spec().windows_for(timestamp)  # (refuses bad ones)
            if latest is not None and windows[0][1] + part.grace_ms <= latest:
                # (the earliest window has closed: the event is late for it, maybe for all)
                part.windows = part.open_windows(windows, record, timestamp)
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

    def _event_time(self, record: RawRecord) -> int:
        """The ``timestamp`` extractor's time of the event of ``record`` (decoded again with
        its topic's codecs: the table sees the record, not the agent's event)."""
        extractor = self.timestamp
        topic = self.topics.get(record.topic)
        if extractor is None or topic is None:
            raise TableAccessError(
                f"windowed table {self.name!r}: cannot extract the event time of a record of "
                f"{record.topic!r}, a topic the app does not declare"
            )
        key = None if record.key is None else load(topic.key_codec, record.key)
        value = None if record.value is None else load(topic.value_codec, record.value)
        return extractor(
            Event(
                key,
                value,
                record.topic,
                record.partition,
                record.offset,
                record.timestamp,
                record.headers,
            )
        )

    def _owned(self, task: TaskScope, view: TablePartition) -> WindowPartition:
        part = task.windows.get(self.name)
        if part is None:
            stats = self.registered_stats()
            closing = None
            if self.closes_windows:
                closing = Closing(self._final_result, stats, self.close_idle_after_ms, self.clock)
            part = task.windows[self.name] = WindowPartition(
                self.name, self._spec(), view, closing, stats
            )
        return part

    def partition_for_flush(self, view: TablePartition) -> None:
        """With ``emit="close"`` (this table's ``before_flush``), make the window partition
        of ``view`` if its task has none yet: windows of a partition that no event touched
        since it was assigned (restored after a crash, idle) close too, from its flush
        hook."""
        task = self._task_lacking_windows(view)
        if task is not None:
            self._owned(task, view)

    def _task_lacking_windows(self, view: TablePartition) -> TaskScope | None:
        """The task that holds ``view`` active here but has no window partition for it yet."""
        tables = self.link.tables
        task = None if tables is None else tables.active_task(self.name, view.partition)
        if task is None or self.name in task.windows or task.tables.get(self.name) is not view:
            return None
        return task

    def _final_result(self, key_bytes: bytes, start: int, end: int, raw: bytes) -> Emitted | None:
        """A closed window's final value: to ``on_window_close``, and the record for
        ``emit_to`` (None without one). A callback that raises, or a value the topic's
        codecs refuse, is logged and counted, not retried: the window stays closed."""
        key, value = load(self.key_codec, key_bytes), load(self.value_codec, raw)
        return self._final_record(key, start, end, value, self.on_window_close, self.emit_to)

    def _final_record(
        self,
        key: Any,
        start: int,
        end: int,
        value: Any,
        callback: WindowCloseCallback | None,
        out: Topic | None,
    ) -> Emitted | None:
        """``value``, the final value of ``key`` in ``(start, end)``: to ``callback``, and
        the record for ``out`` (None without one)."""
        if callback is not None:
            try:
                callback(key, (start, end), value)
            except Exception:
                self.emission_stats().callback_errors += 1
                log.exception(
                    "%s %s: on_window_close(%r, (%d, %d), ...) raised",
                    self.kind,
                    self.name,
                    key,
                    start,
                    end,
                )
        if out is None:
            return None
        try:
            out_key = dump(out.key_codec, key)
            out_value = dump(out.value_codec, self._final_value(start, end, value))
        except CodecError:
            self.emission_stats().callback_errors += 1
            log.exception(
                "%s %s: the final result of %r in window (%d, %d) cannot be "
                "encoded for %s; it is not sent",
                self.kind,
                self.name,
                key,
                start,
                end,
                out.name,
            )
            return None
        count = out.partitions or self.link.partitions.get(out.name)
        partition = partition_of(out_key, count) if out_key is not None and count else None
        headers = [("window-start", b"%d" % start), ("window-end", b"%d" % end)]
        return (out.name, out_key, out_value, partition, headers, end - 1)

    def _final_value(self, start: int, end: int, value: Any) -> Any:
        """What ``emit_to`` is sent for a closed window (the final value; a subclass may
        wrap it with the window)."""
        return value

    def _current_value(self, key: Any) -> bytes | None:
        """The stored value of ``key`` in the current event's (latest) window.

        Remembers what it read, so that ``table[key] = ...`` right after (``+=``) knows
        the window exists without reading it again."""
        part = self._event_partition()
        windows = part.windows
        if not windows:  # (the event's windows had all closed)
            self._encode_key(key)  # (a key that cannot be encoded is refused all the same)
            part.last_read = None
            return None
        kind = type(key)
        if kind is str or kind is int or kind is bytes:
            # a key read before: its bytes and data-key prefix are remembered
            entry = part.key_entries.get(key)
            if entry is None:
                entry = part.remember_key(key, self._encode_key(key))
            key_bytes = entry[0]
            if part.start_windows is windows:
                data_key = entry[1] + part.start_bytes
            else:
                data_key = entry[1] + part.window_start_bytes(windows)
        else:
            key_bytes = self._encode_key(key)
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
        if part.late is not None:
            part.count_late()
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
        event = _CURRENT_EVENT.get()
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
            try:
                start = windows[0][0]
            except IndexError:
                # the event's windows had all closed: the write is dropped (late)
                part.count_late()
                return
            data_key, index_key = table_keys(key_bytes, start)
            existed = False
        if len(windows) != 1:
            raise TableAccessError(
                f"table {self.name!r} has hopping windows: an event is in {len(windows)} "
                "windows, so use table.update(key, fn) to change each of them"
            )
        encoded = dump(self.value_codec, value)
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
        if part.late is not None:
            part.count_late()
        view = part.view
        key_bytes = self._encode_key(key)
        for start, _end in part.windows:
            data_key, index_key = table_keys(key_bytes, start)
            raw = view.get(data_key)
            if raw is not None:
                old = self._load_value(raw)
            else:
                old = self.default() if self.default is not None else None
            encoded = dump(self.value_codec, fn(old))
            if encoded is None:
                view.delete(data_key)
            else:
                view.put(data_key, encoded)
                if raw is None:
                    part.index_new_window(index_key, start)

    def relative_to_now(self) -> WindowedView:
        """Faust's view: ``view[key].value()`` reads the window of the stream time."""
        return relative_to_now(self)

    def relative_to_stream(self) -> WindowedView:
        """Faust's view: ``view[key].value()`` reads the window of the event's time."""
        return relative_to_stream(self)

    def relative_to_field(self, field: FieldOrExtractor) -> WindowedView:
        """Faust's view: ``view[key].value()`` reads the window of a time in the event."""
        return relative_to_field(self, field)

    def windows_of(self, key: Any, from_ms: int, to_ms: int) -> list[tuple[int, Any]]:
        """(window start, value) of ``key`` for windows starting in [from_ms, to_ms]."""
        key_bytes = self._encode_key(key)
        view = self._state(key_bytes, writing=False)
        out = []
        for data_key, raw in view.scan(*layout.data_range(key_bytes, max(from_ms, 0), to_ms)):
            out.append((layout.split_data_key(data_key).time_ms, load(self.value_codec, raw)))
        return out

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """((key, window start), value) of the local windows."""
        partitions = self.active_partitions() if partition is None else [partition]
        for p in partitions:
            # materialized: the caller may write to the table while iterating
            for data_key, raw in list(self.active_partition(p).scan(*layout.namespace_range(DATA))):
                _, key_bytes, start, _ = layout.split_data_key(data_key)
                yield (load(self.key_codec, key_bytes), start), load(self.value_codec, raw)

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


def check_emission(
    name: str,
    *,
    windows: WindowSpec | None,
    emit: str,
    emit_to: object,
    on_window_close: object,
    close_idle_after_ms: object,
    timestamp: object,
) -> None:
    """Refuse emission settings that cannot work, naming the table and the setting."""
    where = f"windowed table {name!r}"
    if emit not in ("update", "close"):
        raise ConfigurationError(f"{where}: emit must be 'update' or 'close', got {emit!r}")
    if timestamp is not None and not callable(timestamp):
        raise ConfigurationError(
            f"{where}: timestamp must be a function of the event returning ms, got {timestamp!r}"
        )
    closing_only = {
        "emit_to": emit_to,
        "on_window_close": on_window_close,
        "close_idle_after": close_idle_after_ms,
    }
    if emit == "update":
        given = [setting for setting, value in closing_only.items() if value is not None]
        if given:
            raise ConfigurationError(
                f"{where}: {', '.join(given)} only apply with emit='close' (final results "
                "when windows close); with emit='update' agents read the table as it changes"
            )
        return
    if emit_to is None and on_window_close is None:
        raise ConfigurationError(
            f"{where}: emit='close' needs somewhere to put final results: emit_to=<topic> "
            "and/or on_window_close=<function(key, (start, end), value)>"
        )
    if emit_to is not None and not isinstance(emit_to, Topic):
        raise ConfigurationError(
            f"{where}: emit_to must be a topic (app.topic(...)), got {emit_to!r}"
        )
    callback = on_window_close
    if callback is not None and (not callable(callback) or inspect.iscoroutinefunction(callback)):
        raise ConfigurationError(
            f"{where}: on_window_close must be a plain function (key, (start, end), value), "
            f"got {callback!r}: it runs inside the commit, which cannot await; send results "
            "with emit_to=<topic> and consume them with an agent instead"
        )
    idle = close_idle_after_ms
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int) or idle <= 0):
        raise ConfigurationError(f"{where}: close_idle_after must be > 0, got {idle!r} ms")
    spec = windows
    if spec is None or not hasattr(spec, "size_ms") or not hasattr(spec, "windows_for"):
        raise ConfigurationError(
            f"{where}: emit='close' works with tumbling and hopping windows, got {spec!r}"
        )
    grace = close_time_offset(spec)
    retention: int | None = spec.retention_ms
    if retention is not None and retention < grace:
        raise ConfigurationError(
            f"{where}: with emit='close' a window must outlive its grace period, or it would "
            f"be deleted before its final result: retention ({retention} ms) < grace "
            f"({grace} ms)"
        )


def idle_after_ms(value: object, where: str) -> int | None:
    """``close_idle_after=`` (a timedelta, or seconds) in ms; None stays None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"{where}: close_idle_after must be a timedelta or a number of seconds, got {value!r}"
        )
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ConfigurationError(f"{where}: close_idle_after must be > 0, got {value!r}")
    return ms
