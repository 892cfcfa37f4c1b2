"""One windowed table partition while a task owns it: stream time and expiry (pure, no I/O).

A :class:`~streamjoin.windowed.WindowedTable` is a declaration and keeps nothing
at run time. What it needs per partition lives here, in the task that owns the
partition (``Task.windows``), and goes with the task:

* the partition's stream time in memory (the latest event timestamp seen): it is
  written to the partition once per flush, just before expiry reads it, not once
  per event;
* how far expiry got (the cutoff of the last pass): the next pass scans only when a
  window can have expired since, or a window that old was created since;
* the event last seen (its record and windows) and the key last read:
  ``counts[k] += 1`` reads and writes the table, and each access would otherwise
  compute them again.

Expiry runs from the table partition's flush hook (:meth:`TablePartition.before_take
<streamjoin.state.table_partition.TablePartition.before_take>`), so its deletes reach
the changelog with the writes of the same flush.
"""

from __future__ import annotations

from typing import Any

from streamjoin.errors import IncompatibleWindowState
from streamjoin.events import RawRecord
from streamjoin.state import window_layout as layout
from streamjoin.state.keys import MAX_UINT64
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.window_layout import STREAM_TIME_KEY
from streamjoin.state.windows import WindowSpec, may_start_between

__all__ = ["LastRead", "WindowPartition", "stream_time"]

#: a read of the current window: (its record, its windows, the key, its data key, whether
#: the window existed, the key's bytes); ``table[key] = ...`` right after (``+=``) in the
#: same event reuses them
LastRead = tuple[RawRecord | None, list[tuple[int, int]], Any, bytes, bool, bytes]


class WindowPartition:
    """Partition ``view.partition`` of windowed table ``table``, as its task holds it."""

    __slots__ = (
        "expired_through",
        "last_read",
        "latest",
        "record",
        "spec",
        "table",
        "view",
        "windows",
    )

    def __init__(self, table: str, spec: WindowSpec, view: TablePartition) -> None:
        self.table = table
        self.spec = spec
        self.view = view
        #: the latest event timestamp seen here, None before the first (the view's stream
        #: time catches up at the next flush)
        self.latest: int | None = None
        #: the cutoff of the last expiry pass: the view holds no window starting at or
        #: before it (None: no pass yet, or a window that old was created since)
        self.expired_through: int | None = None
        #: the event last seen (by its record) and its windows
        self.record: RawRecord | None = None
        self.windows: list[tuple[int, int]] = []
        self.last_read: LastRead | None = None
        self._stream_time()  # refuses state of an earlier layout before anything uses it
        view.before_take(self._before_flush)

    def __repr__(self) -> str:
        return f"WindowPartition({self.table!r}, {self.view.partition})"

    def index_new_window(self, index_key: bytes, start: int) -> None:
        """Index a window just created, for expiry."""
        self.view.put(index_key, b"")
        expired_through = self.expired_through
        if expired_through is not None and start <= expired_through:
            # a late event in a window as old as one the last pass expired: the next pass
            # scans (and removes it, if it is past retention)
            self.expired_through = None

    def expire(self) -> int:
        """Write the stream time, then delete the windows past retention; returns how many.

        A window ``[start, end)`` is kept while ``stream_time < end + retention``."""
        # it may delete the window a read remembered: the next write indexes it again
        self.last_read = None
        view, spec = self.view, self.spec
        now = self._stream_time()
        if now is None:
            return 0
        # expired: start + size + retention <= stream time
        cutoff = now - spec.size_ms - spec.retention_ms
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
        self.expire()

    def _stream_time(self) -> int | None:
        """The partition's stream time, written first if an event moved it since; errors
        name the table and partition."""
        try:
            if self.latest is not None:
                _advance_stream_time(self.view, self.latest)
            return stream_time(self.view)
        except IncompatibleWindowState as exc:
            raise IncompatibleWindowState(
                f"windowed table {self.table!r} partition {self.view.partition}: {exc}"
            ) from None


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


def _advance_stream_time(view: TablePartition, timestamp_ms: int) -> None:
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
