"""Sliding- and session-window aggregates of one table partition (pure, no I/O).

Tumbling and hopping windows are known from a timestamp alone, so an aggregation over
them is an ordinary windowed table (:mod:`streamjoin.windowed`). Sliding and session
windows depend on the key's other records: :func:`~streamjoin.state.sliding.slide` and
:func:`~streamjoin.state.sessions.session_for` say what a record creates, changes or
merges, and the classes here apply that to the stored windows of one partition, with
the aggregator's pure functions (:mod:`streamjoin.aggregations`). What a task keeps of
them in memory (stream time, how far closing got) lives in the object and goes with the
task; everything else is in the table partition, in the shared window layout
(:mod:`streamjoin.state.window_layout`):

* ``DATA + window_key(key, start)`` -> the window's aggregate: the state's JSON for
  sliding windows (whose end is ``start + difference + 1``), ``[end, state]`` for sessions
  (whose end varies);
* ``INDEX + u64(start) + length_prefixed(key)`` -> ``b""``: what the close and expiry
  passes scan, by window start;
* :data:`~streamjoin.state.window_layout.STREAM_TIME_KEY` and
  :data:`~streamjoin.state.window_layout.CLOSED_THROUGH_KEY` as windowed tables keep
  them (written once per flush).

Sliding windows also need the key's recent records, to compute a window a record
creates: they are kept in a second table partition (the aggregation's ``-records``
table): ``DATA + window_key(key, ts) + u64(offset)`` -> the record's value bytes,
``INDEX + u64(ts) + length_prefixed(key) + u64(offset)`` -> ``b""``, each deleted once no
later record can need it (``stream_time >= ts + difference + 2 + grace``).

The close rule is the windows' own (``stream_time >= spec.close_time(end)``): a record
that would change a closed window is late, counted and dropped. With emit-on-close, the
flush hook emits each window's final result once its close time is reached
(:meth:`TablePartition.emit <streamjoin.state.table_partition.TablePartition.emit>`) and
moves the closed-through marker in the same flush, before expiry deletes it. Those
writes, the index scan and the stored stream time are the windowed tables' own
(:mod:`streamjoin.state.window_partition`): only which windows close differs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from streamjoin.aggregations import Aggregator
from streamjoin.log_summary import Summary
from streamjoin.state import window_layout as layout
from streamjoin.state.keys import length_prefixed
from streamjoin.state.sessions import session_for
from streamjoin.state.sliding import slide
from streamjoin.state.table_partition import Emitted, TablePartition
from streamjoin.state.window_layout import (
    CLOSED_THROUGH_KEY,
    LATEST_SESSION_PREFIX,
    SESSION_SPAN_KEY,
    STREAM_TIME_KEY,
)
from streamjoin.state.window_partition import (
    WindowStats,
    advance_stream_time,
    emit_closed,
    indexed_windows,
    stored_time,
)
from streamjoin.state.windows import SessionWindows, SlidingWindows

__all__ = [
    "Changed",
    "OnClose",
    "SessionAggregates",
    "SlidingAggregates",
    "load_session",
]

log = logging.getLogger("streamjoin.aggregations")

#: a window an event changed: ``(start, end, state)``; state None: the window is gone
#: (a session merged into another)
Changed = tuple[int, int, Any]
#: a closed window's final state -> the record to send for it (None: nothing to send):
#: ``(key bytes, start, end, state)``
OnClose = Callable[[bytes, int, int, Any], Emitted | None]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def load_session(raw: bytes) -> tuple[int, Any]:
    """A stored session's ``(end, state)``."""
    end, state = json.loads(raw)
    return int(end), state


class _Aggregates:
    """What sliding and session aggregates share: stream time, late records, the flush
    passes (close, then expiry)."""

    def __init__(
        self,
        table: str,
        spec: SessionWindows | SlidingWindows,
        aggregator: Aggregator,
        view: TablePartition,
        *,
        on_close: OnClose | None,
        stats: WindowStats,
    ) -> None:
        self.table = table
        self.aggregator = aggregator
        self.view = view
        self.retention_ms = spec.retention_ms
        self.on_close = on_close
        self.stats = stats
        #: the partition's stream time (None before its first record); written per flush
        self.latest = self._stored(STREAM_TIME_KEY)
        #: the stream time through which windows closed (emit="close"; None: none yet)
        self.closed_through = self._stored(CLOSED_THROUGH_KEY)
        self.late_records = Summary(log)
        view.before_take(self._before_flush)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table!r}, {self.view.partition})"

    def _stored(self, key: bytes) -> int | None:
        return stored_time(self.view, key, f"aggregation {self.table!r}")

    def _moved(self, timestamp: int) -> int | None:
        """Stream time before the record; moves it on. (The core decides lateness with it.)"""
        before = self.latest
        if before is None or timestamp > before:
            self.latest = timestamp
        return before

    def _late(self, what: str, timestamp: int) -> list[Changed]:
        self.stats.late += 1
        table, partition, now = self.table, self.view.partition, self.latest
        self.late_records.note(
            partition,
            lambda: (
                f"aggregation {table}: a record at {timestamp} is late for its {what}, closed "
                f"at stream time {now} of partition {partition}; it is dropped (more are "
                "counted and logged once per 30 s)"
            ),
            lambda count, seconds: (
                f"aggregation {table}: {count} more late records dropped in the last "
                f"{seconds:.0f} s on partition {partition}"
            ),
        )
        return []

    # ------------------------------------------------------------------ flush passes

    def _before_flush(self) -> None:
        now = self.latest
        if now is None:
            return
        advance_stream_time(self.view, now)
        self.close_windows()
        self.expire()

    def close_windows(self) -> int:
        """Emit the final state of every window whose close time the stream time reached
        since the last pass, and move the closed-through marker; returns how many."""
        now, through, on_close = self.latest, self.closed_through, self.on_close
        if on_close is None or now is None or (through is not None and now <= through):
            return 0
        closed = emit_closed(self.view, self._closing(through, now), on_close, now, self.stats)
        self.closed_through = now
        return closed

    def _closing(self, through: int | None, now: int) -> list[tuple[bytes, int, int, Any]]:
        """``(key, start, end, state)`` of the windows with ``through < close time <= now``."""
        raise NotImplementedError

    def expire(self) -> int:
        """Delete the windows with ``stream_time >= end + retention``; returns how many."""
        raise NotImplementedError

    def _delete(self, key_bytes: bytes, start: int) -> None:
        data_key, index_key = layout.table_keys(key_bytes, start)
        self.view.delete(data_key)
        self.view.delete(index_key)

    def _put(self, key_bytes: bytes, start: int, stored: bytes, *, new: bool) -> None:
        data_key, index_key = layout.table_keys(key_bytes, start)
        self.view.put(data_key, stored)
        if new:
            self.view.put(index_key, b"")


class SessionAggregates(_Aggregates):
    """Partition ``view.partition`` of a session-window aggregation."""

    def __init__(
        self,
        table: str,
        spec: SessionWindows,
        aggregator: Aggregator,
        view: TablePartition,
        *,
        on_close: OnClose | None,
        stats: WindowStats,
    ) -> None:
        super().__init__(table, spec, aggregator, view, on_close=on_close, stats=stats)
        self.spec = spec
        #: the longest session (end - start) this partition ever stored (0: none yet).
        #: Sessions of a key never overlap, so the ones a record at ``ts`` can reach (ending
        #: after ``ts - gap``) start after ``ts - gap - longest``: lookups and flush passes
        #: scan from there, not from the key's (or the partition's) first session.
        self.longest = self._stored(SESSION_SPAN_KEY) or 0
        #: the stream time of the last expiry pass (None: none since this task took the
        #: partition): every session expired by then is gone
        self.expired_at: int | None = None

    def sessions(self, key_bytes: bytes, low: int, high: int) -> list[tuple[int, int, Any]]:
        """``(start, end, state)`` of the key's sessions starting in ``[low, high]``."""
        out = []
        for data_key, raw in self.view.scan(*layout.data_range(key_bytes, max(low, 0), high)):
            end, state = load_session(raw)
            out.append((layout.split_data_key(data_key).time_ms, end, state))
        return out

    def reachable(
        self, key_bytes: bytes, timestamp: int
    ) -> tuple[list[tuple[int, int, Any]], int | None]:
        """The key's sessions a record at ``timestamp`` can reach (at least those), and the
        start of the key's latest session (None: the key has none).

        A record at or after the latest session's start reaches that session only: the
        key's earlier sessions end more than a gap before it starts. That is one point
        lookup, the common case for records in order. An earlier record scans the
        sessions starting after ``ts - gap - longest``."""
        view = self.view
        pointer = view.lookup(LATEST_SESSION_PREFIX + key_bytes)
        latest = None if pointer is None else layout.decode_meta_int(LATEST_SESSION_PREFIX, pointer)
        if latest is not None and timestamp >= latest:
            raw = view.lookup(layout.table_data_key(key_bytes, latest))
            if raw is not None:
                end, state = load_session(raw)
                return [(latest, end, state)], latest
        elif latest is None and self.longest == 0:
            return [], None  # (no session was ever stored here)
        gap = self.spec.gap_ms
        near = self.sessions(key_bytes, timestamp - gap - self.longest, timestamp + gap)
        return near, latest

    def add(self, key_bytes: bytes, timestamp: int, value: Any) -> list[Changed]:
        """Add a record's value to its key's sessions; the windows it changed (the sessions
        it merged away with state None, then its session), or none when it is late."""
        stream_time = self._moved(timestamp)
        near, latest = self.reachable(key_bytes, timestamp)
        update = session_for(self.spec, [(s, e) for s, e, _ in near], timestamp, stream_time)
        if update.late:
            return self._late("session", timestamp)
        aggregator = self.aggregator
        states = {(s, e): state for s, e, state in near}
        start, end = update.session
        changed: list[Changed] = []
        state: Any = None
        kept = False  # whether a session stored under ``start`` already (its index entry)
        latest_absorbed = False
        for window in update.absorbed:
            absorbed_state = states[window]
            state = absorbed_state if state is None else aggregator.merge(state, absorbed_state)
            if window[0] == latest:
                latest_absorbed = True
            if window[0] == start:
                kept = True
            else:
                self._delete(key_bytes, window[0])
                changed.append((window[0], window[1], None))
        if state is None:
            state = aggregator.initial()
        state = aggregator.add(state, value)
        self._put(key_bytes, start, _dumps([end, state]), new=not kept)
        if latest is None or start > latest or (latest_absorbed and start != latest):
            # the key's latest session is now this one (new, or merged with the latest)
            self.view.put(LATEST_SESSION_PREFIX + key_bytes, layout.encode_meta_int(start))
        if end - start > self.longest:
            self.longest = end - start
            self.view.put(SESSION_SPAN_KEY, layout.encode_meta_int(self.longest))
        changed.append((start, end, state))
        return changed

    def _closing(self, through: int | None, now: int) -> list[tuple[bytes, int, int, Any]]:
        # closed: end + gap + grace <= now; not yet: end + gap + grace > through (so the
        # session starts after through - gap - grace - longest)
        wait = self.spec.close_time(0)
        low = 0 if through is None else through - wait - self.longest
        out = []
        for start, key_bytes, raw in indexed_windows(self.view, low, now - wait - 1):
            end, state = load_session(raw)
            close = end + wait
            if close <= now and (through is None or close > through):
                out.append((key_bytes, start, end, state))
        return out

    def expire(self) -> int:
        now, retention, last = self.latest, self.retention_ms, self.expired_at
        if now is None or retention is None or (last is not None and now <= last):
            return 0
        # sessions left by the last pass end after last - retention (a record never makes
        # a session that is expired already: retention >= gap + grace, and it would be late)
        low = 0 if last is None else last - retention - self.longest
        gone = 0
        for start, key_bytes, raw in indexed_windows(self.view, low, now - retention - 1):
            end, _ = load_session(raw)
            if now >= end + retention:
                self._delete(key_bytes, start)
                pointer = LATEST_SESSION_PREFIX + key_bytes
                stored = self.view.lookup(pointer)
                if stored is not None and layout.decode_meta_int(pointer, stored) == start:
                    self.view.delete(pointer)  # (it was the key's latest: the key has none)
                gone += 1
        self.expired_at = now
        return gone


class SlidingAggregates(_Aggregates):
    """Partition ``view.partition`` of a sliding-window aggregation; ``records`` is the
    same partition of its records table, ``load_value`` decodes a kept record's value."""

    def __init__(
        self,
        table: str,
        spec: SlidingWindows,
        aggregator: Aggregator,
        view: TablePartition,
        records: TablePartition,
        load_value: Callable[[bytes], Any],
        *,
        on_close: OnClose | None,
        stats: WindowStats,
    ) -> None:
        super().__init__(table, spec, aggregator, view, on_close=on_close, stats=stats)
        self.spec = spec
        self.records = records
        self.load_value = load_value
        records.before_take(self._forget_records)

    def _records(
        self, key_bytes: bytes, low: int, high: int, but: int = -1
    ) -> list[tuple[int, int, bytes]]:
        """``(timestamp, offset, value bytes)`` of the key's kept records in ``[low, high]``,
        but the one at offset ``but``."""
        out = []
        for data_key, raw in self.records.scan(*layout.data_range(key_bytes, max(low, 0), high)):
            entry = layout.split_data_key(data_key, suffix_length=8)
            offset = layout.unpack_u64(entry.suffix)[0]
            if offset != but:
                out.append((entry.time_ms, offset, raw))
        return out

    def add(
        self, key_bytes: bytes, timestamp: int, value: Any, value_bytes: bytes, offset: int
    ) -> list[Changed]:
        """Add a record (its value, the value's bytes, its offset: kept to compute windows
        a later record creates) to its key's windows; the windows it created or changed,
        or none when it is late.

        A record replayed after a crash (at-least-once) may be kept already while the
        window writes of the same flush were lost: it is taken as new (its kept copy left
        out), and a window that should exist but is not stored is computed afresh from
        the kept records, so no window ever counts a record less than once."""
        stream_time = self._moved(timestamp)
        low, high = self.spec.reach(timestamp)
        nearby = self._records(key_bytes, low, high, but=offset)
        update = slide(self.spec, [ts for ts, _, _ in nearby], timestamp, stream_time)
        if update.late:
            return self._late("sliding window", timestamp)
        at = layout.pack_u64(offset)
        self.records.put(layout.data_key(key_bytes, timestamp, suffix=at), value_bytes)
        self.records.put(layout.index_key(timestamp, length_prefixed(key_bytes) + at), b"")
        aggregator, view = self.aggregator, self.view
        changed: list[Changed] = []
        created = update.created
        for start, end in update.updated:
            raw = view.lookup(layout.table_data_key(key_bytes, start))
            if raw is None:  # (lost in a crash, or expired: computed from the records)
                created = (*created, (start, end))
                continue
            state = aggregator.add(json.loads(raw), value)
            self._put(key_bytes, start, _dumps(state), new=False)
            changed.append((start, end, state))
        if created:
            # in processing order (by offset), the new record last (None: its value is at hand)
            held: list[tuple[int, int, bytes | None]] = [*nearby, (timestamp, offset, None)]
            held.sort(key=lambda r: r[1])
            for start, end in created:
                state = aggregator.initial()
                for ts, _, raw_value in held:
                    if start <= ts < end:
                        item = value if raw_value is None else self.load_value(raw_value)
                        state = aggregator.add(state, item)
                self._put(key_bytes, start, _dumps(state), new=True)
                changed.append((start, end, state))
        changed.sort(key=lambda c: c[0])
        return changed

    def _closing(self, through: int | None, now: int) -> list[tuple[bytes, int, int, Any]]:
        # (start, start + size) is closed once start <= now - size - grace
        size = self.spec.size_ms
        wait = size + self.spec.grace_ms
        low = 0 if through is None else through - wait + 1
        return [
            (key_bytes, start, start + size, json.loads(raw))
            for start, key_bytes, raw in indexed_windows(self.view, low, now - wait)
        ]

    def expire(self) -> int:
        now, retention = self.latest, self.retention_ms
        if now is None or retention is None:
            return 0
        expired = indexed_windows(self.view, 0, now - self.spec.size_ms - retention)
        for start, key_bytes, _ in expired:
            self._delete(key_bytes, start)
        return len(expired)

    def _forget_records(self) -> None:
        """Delete the kept records no later record can need (on the records' flush)."""
        now = self.latest
        if now is None:
            return
        cutoff = now - self.spec.difference_ms - 2 - self.spec.grace_ms  # ts <= cutoff
        if cutoff < 0:
            return
        records = self.records
        for index_key, _ in list(records.scan(*layout.index_range(cutoff + 1))):
            ts, entry = layout.split_index_key(index_key)
            prefixed, at = entry[:-8], entry[-8:]
            key_bytes = layout.strip_length_prefix(prefixed)
            records.delete(layout.data_key(key_bytes, ts, suffix=at))
            records.delete(index_key)
