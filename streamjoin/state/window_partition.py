"""One windowed table partition while a task owns it: stream time, closing, expiry (pure).

A :class:`~streamjoin.windowed.WindowedTable` is a declaration and keeps nothing
at run time. What it needs per partition lives here, in the task that owns the
partition (``Task.windows``), and goes with the task:

* the partition's stream time in memory (the latest event timestamp seen): it is
  written to the partition once per flush, just before the passes that read it, not
  once per event;
* the late events dropped (whatever the table emits), and with ``emit="close"``: how
  far closing got (:data:`CLOSED_THROUGH_KEY
  <streamjoin.state.window_layout.CLOSED_THROUGH_KEY>`, in the store and changelog)
  and when the partition last saw an event (for ``close_idle_after``);
* how far expiry got (the cutoff of the last pass): the next pass scans only when a
  window can have expired since, or a window that old was created since;
* the event last seen (its record and windows) and the key last read:
  ``counts[k] += 1`` reads and writes the table, and each access would otherwise
  compute them again.

Both passes run from the table partition's flush hook (:meth:`TablePartition.before_take
<streamjoin.state.table_partition.TablePartition.before_take>`), close first, so what
they write (the closed-through marker, expiry's deletes) reaches the changelog with the
writes of the same flush, and the final results they emit
(:meth:`TablePartition.emit <streamjoin.state.table_partition.TablePartition.emit>`) are
sent before it.

**When a window closes.** A window ``[start, end)`` closes once the partition's stream
time reaches ``end + grace`` (the spec's ``close_time(end)``). An event is *late* for a
window when, as it arrives, the stream time is already at or past that window's close
time: its writes to that window are dropped (counted in :attr:`WindowStats.late`), and
reads of it find nothing. So the final result of a window is exactly the effect of the
events that arrived before the stream time reached its close time, whenever the flush
that emits it runs: a deterministic function of the input order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from streamjoin.errors import IncompatibleWindowState
from streamjoin.events import RawRecord
from streamjoin.log_summary import Summary
from streamjoin.state import window_layout as layout
from streamjoin.state.keys import MAX_UINT64, encode_uint64
from streamjoin.state.table_partition import Emitted, TablePartition
from streamjoin.state.window_layout import CLOSED_THROUGH_KEY, STREAM_TIME_KEY
from streamjoin.state.windows import WindowSpec, may_start_between

__all__ = [
    "CloseHandler",
    "Closing",
    "LastRead",
    "WindowPartition",
    "WindowStats",
    "advance_stream_time",
    "close_time_offset",
    "emit_closed",
    "indexed_windows",
    "stored_time",
    "stream_time",
]

log = logging.getLogger("streamjoin.windows")

T = TypeVar("T")

#: how many keys a partition remembers the packed bytes of (about 200 bytes each) before it
#: forgets them all and starts again
KEY_ENTRIES = 8192

#: a read of the current window: (its record, its windows, the key, its data key, whether
#: the window existed, the key's bytes); ``table[key] = ...`` right after (``+=``) in the
#: same event reuses them
LastRead = tuple[RawRecord | None, list[tuple[int, int]], Any, bytes, bool, bytes]

#: a closed window's final value: ``(key bytes, start, end, stored value) -> the record to
#: send for it, or None`` (the declaration decodes, calls back, encodes for its topic)
CloseHandler = Callable[[bytes, int, int, bytes], Emitted | None]


@dataclass
class WindowStats:
    """One windowed table's emission counters on this worker (all its partitions)."""

    #: final results produced (one per key and closed window)
    closed: int = 0
    #: events dropped for arriving after one of their windows had closed
    late: int = 0
    #: ``on_window_close`` calls that raised (logged; the result still counts as sent)
    callback_errors: int = 0


@dataclass
class Closing:
    """How a partition of a table with ``emit="close"`` closes its windows."""

    on_close: CloseHandler
    stats: WindowStats
    #: close_idle_after in ms (None: only events move stream time)
    idle_after_ms: int | None = None
    #: the wall clock idle time is measured with, in seconds (monotonic)
    clock: Callable[[], float] = time.monotonic


def close_time_offset(spec: WindowSpec) -> int:
    """``close_time(end) - end`` of ``spec``: its grace (0 for specs without one)."""
    close_time = getattr(spec, "close_time", None)
    if close_time is not None:
        offset: int = close_time(0)
        return offset
    grace: int = getattr(spec, "grace_ms", 0)
    return grace


class WindowPartition:
    """Partition ``view.partition`` of windowed table ``table``, as its task holds it."""

    __slots__ = (
        "active_at",
        "active_base",
        "closed_through",
        "closing",
        "expired_through",
        "grace_ms",
        "key_entries",
        "last_read",
        "late",
        "late_events",
        "latest",
        "record",
        "seen_record",
        "spec",
        "start_bytes",
        "start_windows",
        "stats",
        "table",
        "view",
        "windows",
    )

    def __init__(
        self,
        table: str,
        spec: WindowSpec,
        view: TablePartition,
        closing: Closing | None = None,
        stats: WindowStats | None = None,
    ) -> None:
        self.table = table
        self.spec = spec
        self.view = view
        #: the partition's stream time: as stored, then moved by each event (the view's
        #: catches up at the next flush); None before its first event. The late check
        #: compares with it.
        self.latest: int | None = None
        #: the cutoff of the last expiry pass: the view holds no window starting at or
        #: before it (None: no pass yet, or a window that old was created since)
        self.expired_through: int | None = None
        #: the event last seen (by its record) and its windows still open (empty before
        #: the first event, and for an event whose windows had all closed)
        self.record: RawRecord | None = None
        self.windows: list[tuple[int, int]] = []
        self.last_read: LastRead | None = None
        #: keys read lately (str, int or bytes: types that equal no other type's values),
        #: each with its bytes and its data-key prefix: a read of a key seen before packs
        #: no key (see :meth:`data_key_of`); cleared when it reaches KEY_ENTRIES
        self.key_entries: dict[Any, tuple[bytes, bytes]] = {}
        #: the packed start of ``start_windows[-1]`` (the windows it was packed for)
        self.start_bytes = b""
        self.start_windows: list[tuple[int, int]] | None = None
        self.closing = closing
        #: the table's counters on this worker (late events; with closing, results too)
        self.stats = closing.stats if closing is not None else stats or WindowStats()
        #: close time - window end
        self.grace_ms = close_time_offset(spec)
        now = self._stream_time()  # refuses state of an earlier layout before anything uses it
        #: the stream time through which windows are closed, as stored (None: none yet)
        self.closed_through: int | None = None
        self.late_events = Summary(log)
        #: the event :meth:`open_windows` found late (its record, time, windows closed),
        #: until :meth:`count_late` counts it
        self.late: tuple[RawRecord, int, int] | None = None
        #: close_idle_after: the record of the last event seen by a flush, when that flush
        #: ran (wall clock) and the stream time then
        self.seen_record: RawRecord | None = None
        self.active_at = 0.0
        self.active_base: int | None = None
        self.latest = now
        if closing is not None:
            self.closed_through = self._stored(CLOSED_THROUGH_KEY)
            self.active_at = closing.clock()
            self.active_base = now
        view.before_take(self._before_flush)

    def __repr__(self) -> str:
        return f"WindowPartition({self.table!r}, {self.view.partition})"

    def remember_key(self, key: Any, key_bytes: bytes) -> tuple[bytes, bytes]:
        """Remember ``key``'s bytes and data-key prefix (a key of an exact type str, int or
        bytes: a key equal to it has its type, so the same bytes)."""
        entries = self.key_entries
        if len(entries) >= KEY_ENTRIES:
            entries.clear()
        entry = entries[key] = (key_bytes, layout.data_key_prefix(key_bytes))
        return entry

    def window_start_bytes(self, windows: list[tuple[int, int]]) -> bytes:
        """The packed start of ``windows[-1]`` (packed once per list of windows)."""
        if self.start_windows is not windows:
            self.start_bytes = encode_uint64(windows[-1][0])
            self.start_windows = windows
        return self.start_bytes

    def index_new_window(self, index_key: bytes, start: int) -> None:
        """Index a window just created, for closing and expiry."""
        self.view.put(index_key, b"")
        expired_through = self.expired_through
        if expired_through is not None and start <= expired_through:
            # a late event in a window as old as one the last pass expired: the next pass
            # scans (and removes it, if it is past retention)
            self.expired_through = None

    # ------------------------------------------------------------------ late events

    def open_windows(
        self, windows: list[tuple[int, int]], record: RawRecord, timestamp: int
    ) -> list[tuple[int, int]]:
        """``windows`` (the event's, in start order) without those already closed (called
        only when the caller found its first window's close time reached). The event is
        noted as late, and counted by :meth:`count_late` once it tries to write: an agent
        that only reads the table (and lags behind its writer) drops nothing."""
        latest = self.latest
        if latest is None:
            return windows
        cutoff = latest - self.grace_ms  # windows ending at or before it are closed
        still_open = [w for w in windows if w[1] > cutoff]
        if len(still_open) < len(windows):
            self.late = (record, timestamp, len(windows) - len(still_open))
        return still_open

    def count_late(self) -> None:
        """Count and log (in summary) the current event (:attr:`record`) as late, once, if
        :meth:`open_windows` left some of its windows out: its writes to them are dropped."""
        late = self.late
        if late is None or late[0] is not self.record:
            return
        self.late = None
        record, timestamp, closed = late
        self.stats.late += 1
        table, partition, latest = self.table, self.view.partition, self.latest
        self.late_events.note(
            record.topic,
            lambda: (
                f"windowed table {table}: {record.position} (event time {timestamp}) is late "
                f"for {closed} of its windows, which closed at stream time {latest} of "
                f"partition {partition}; its writes to them are dropped (more are counted "
                "and logged once per 30 s)"
            ),
            lambda count, seconds: (
                f"windowed table {table}: {count} more late events dropped in the last "
                f"{seconds:.0f} s on {record.topic}[{record.partition}]"
            ),
        )

    # ------------------------------------------------------------------ flush passes

    def close_windows(self) -> int:
        """Write the stream time (moved on by idleness, with ``close_idle_after``), then
        emit the final result of every window whose close time it reached since the last
        pass, in (start, key) order, and record how far closing got; returns how many.

        A no-op for a table that does not emit on close."""
        closing = self.closing
        if closing is None:
            return 0
        self.last_read = None  # (a read remembered before this pass is not reused)
        now = self._stream_time()
        if closing.idle_after_ms is not None:
            now = self._idle_advance(closing, now)
        through = self.closed_through
        if now is None or (through is not None and now <= through):
            return 0
        spec, view = self.spec, self.view
        # a window [start, start + size) is closed once start <= stream time - size - grace
        span = spec.size_ms + self.grace_ms
        high = now - span
        low = -1 if through is None else through - span
        if high < 0 or not may_start_between(spec, low, high):
            return 0  # no window can have closed since: the marker stays where it is
        size = spec.size_ms
        closed = emit_closed(
            view,
            [
                (key, start, start + size, raw)
                for start, key, raw in indexed_windows(view, low + 1, high)
            ],
            closing.on_close,
            now,
            closing.stats,
        )
        self.closed_through = now
        return closed

    def _idle_advance(self, closing: Closing, now: int | None) -> int | None:
        """``close_idle_after``: the stream time, moved on by the time (wall clock) since
        the first flush after the partition's last event once that is at least
        ``idle_after``; written, so the late check and expiry use it too."""
        wall = closing.clock()
        if self.record is not self.seen_record:  # events since the last flush
            self.seen_record = self.record
            self.active_at = wall
            self.active_base = now
            return now
        idle_after = closing.idle_after_ms
        base = self.active_base
        if idle_after is None or base is None:
            return now
        idle_ms = int((wall - self.active_at) * 1000)
        if idle_ms < idle_after or (now is not None and base + idle_ms <= now):
            return now
        self.latest = base + idle_ms
        # the event last seen is checked again (its windows may have closed meanwhile)
        self.record = self.seen_record = None
        self.windows = []
        self.last_read = None
        return self._stream_time()

    def expire(self) -> int:
        """Write the stream time, then delete the windows past retention; returns how many.

        A window ``[start, end)`` is kept while ``stream_time < end + retention``."""
        # it may delete the window a read remembered: the next write indexes it again
        self.last_read = None
        view, spec = self.view, self.spec
        now = self._stream_time()
        retention: int | None = spec.retention_ms
        if now is None or retention is None:
            return 0  # (None: windows never expire)
        # expired: start + size + retention <= stream time
        cutoff = now - spec.size_ms - retention
        if cutoff < 0:
            return 0
        last = self.expired_through
        if last is not None and not may_start_between(spec, last, cutoff):
            return 0  # nothing expired since the last pass (it scanned everything up to it)
        expired = list(view.scan(*layout.index_range(cutoff + 1)))
        for index_key, _ in expired:
            start, prefixed_key = layout.split_index_key(index_key)
            view.delete(layout.data_key(layout.strip_length_prefix(prefixed_key), start))
            view.delete(index_key)
        self.expired_through = cutoff
        return len(expired)

    def _before_flush(self) -> None:
        self.close_windows()  # (first: a window closes before it expires)
        self.expire()

    def _stored(self, key: bytes) -> int | None:
        return stored_time(self.view, key, f"windowed table {self.table!r}")

    def _stream_time(self) -> int | None:
        """The partition's stream time, written first if an event moved it since; errors
        name the table and partition."""
        try:
            if self.latest is not None:
                advance_stream_time(self.view, self.latest)
            return stream_time(self.view)
        except IncompatibleWindowState as exc:
            raise IncompatibleWindowState(
                f"windowed table {self.table!r} partition {self.view.partition}: {exc}"
            ) from None


def indexed_windows(view: TablePartition, low: int, high: int) -> list[tuple[int, bytes, bytes]]:
    """``(start, key bytes, stored value)`` of the windows of ``view`` starting in
    ``[low, high]``, in (start, key) order, found through the index (a window deleted
    since it was indexed is left out: it has no final result)."""
    if high < low or high < 0:
        return []
    out = []
    for index_key, _ in list(view.scan(*layout.index_range(high + 1, max(low, 0)))):
        start, prefixed_key = layout.split_index_key(index_key)
        key_bytes = layout.strip_length_prefix(prefixed_key)
        raw = view.lookup(layout.table_data_key(key_bytes, start))
        if raw is not None:
            out.append((start, key_bytes, raw))
    return out


def emit_closed(
    view: TablePartition,
    closed: Iterable[tuple[bytes, int, int, T]],
    on_close: Callable[[bytes, int, int, T], Emitted | None],
    now: int,
    stats: WindowStats,
) -> int:
    """A close pass's writes: each closed window's final result (``(key bytes, start, end,
    value)``, in order) to the outbox, then the closed-through marker at stream time
    ``now``, so both reach the changelog in the same flush (the results first); how many
    windows closed. Windowed tables and sliding and session aggregates share it."""
    count = 0
    for key_bytes, start, end, value in closed:
        record = on_close(key_bytes, start, end, value)
        if record is not None:
            view.emit(record)
        count += 1
    view.put(CLOSED_THROUGH_KEY, layout.encode_meta_int(now))
    stats.closed += count
    return count


def stream_time(view: TablePartition) -> int | None:
    """The partition's stream time as stored; None before its first event.

    State written before the shared window layout (stream time as ASCII under
    another key) is :class:`~streamjoin.errors.IncompatibleWindowState`:
    its windows would be unreadable, so it is refused rather than misread.
    """
    raw = view.get(STREAM_TIME_KEY)
    if raw is not None:
        return layout.decode_meta_int(STREAM_TIME_KEY, raw)
    legacy = view.get(layout.LEGACY_TABLE_STREAM_TIME_KEY)
    if legacy is not None:
        raise IncompatibleWindowState(
            f"found the stream time {legacy!r} of an earlier streamjoin version under "
            f"{layout.LEGACY_TABLE_STREAM_TIME_KEY!r}: windowed tables written by earlier "
            "versions must be reset (stop the app, delete the state directory and the "
            "table's changelog topic)"
        )
    return None


def stored_time(view: TablePartition, key: bytes, owner: str) -> int | None:
    """The time stored under meta key ``key`` (stream time, closed-through) of ``view``;
    None if none. State of an incompatible layout is refused, naming ``owner`` (e.g.
    ``"aggregation 'x'"``) and the partition."""
    raw = view.get(key)
    if raw is None:
        return None
    try:
        return layout.decode_meta_int(key, raw)
    except IncompatibleWindowState as exc:
        raise IncompatibleWindowState(f"{owner} partition {view.partition}: {exc}") from None


def advance_stream_time(view: TablePartition, timestamp_ms: int) -> None:
    """Store ``timestamp_ms`` as the partition's stream time unless it is behind the
    stored one (so once per flush, not per event)."""
    # stored u64s compare as bytes as their values do, so the common case (a stored
    # 8-byte time) needs no decoding
    raw = view.lookup(STREAM_TIME_KEY)
    if raw is not None and len(raw) == 8 and 0 <= timestamp_ms <= MAX_UINT64:
        encoded = layout.pack_u64(timestamp_ms)
        if raw < encoded:
            view.put(STREAM_TIME_KEY, encoded)
        return
    current = stream_time(view)
    if current is None or current < timestamp_ms:
        view.put(STREAM_TIME_KEY, layout.encode_meta_int(timestamp_ms))
