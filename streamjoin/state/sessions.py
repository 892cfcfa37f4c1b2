"""Session windows of one key, one record at a time (pure: no I/O, no state of its own).

A key's sessions are half-open windows ``(start, end)``: ``start`` is the timestamp of the
session's first record and ``end`` that of its last record plus 1. Records of a key are in
one session when no two consecutive ones are more than ``gap_ms`` apart (exactly ``gap_ms``
still joins). See :class:`~streamjoin.state.windows.SessionWindows` for when a session
closes: once ``stream_time >= end + gap + grace``.

The caller (an aggregation) stores one aggregate per session and asks
:func:`session_for` what a new record does to them::

    spec = SessionWindows(gap_ms=10, grace_ms=5)
    # the key has sessions (0, 6) (records at 0 and 5) and (20, 21) (a record at 20)
    update = session_for(spec, [(0, 6), (20, 21)], timestamp_ms=12, stream_time_ms=20)
    assert update == SessionUpdate(session=(0, 21), absorbed=((0, 6), (20, 21)), late=False)
    # 12 is within 10 of 5 and of 20: it bridges both sessions into (0, 21), so:
    #   agg = merge(load((0, 6)), load((20, 21))); delete (0, 6) and (20, 21);
    #   store add(agg, record) under (0, 21)

Unless ``late``: start from an empty aggregate, merge in the aggregate of every absorbed
session (in order; each is deleted), add the record, store the result under ``session``
(which may equal an absorbed window: delete, then store). A late record changes nothing:
count it and drop it. :func:`sessions_of` gives a key's sessions from all its records at
once (batch jobs, and the model the tests check :func:`session_for` against).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streamjoin.state.windows import SessionWindows, Window, check_timestamp

__all__ = ["SessionUpdate", "session_for", "sessions_of"]


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    """What a record does to its key's sessions.

    ``session``: the session holding the record afterwards. ``absorbed``: the existing
    sessions that become part of it, ordered by start (empty for a record that starts a
    new session; one session for a record that joins or extends it; two or more when it
    bridges them). ``late``: the record would change a session that has closed, or would
    make one that is already closed; nothing changes (``session``/``absorbed`` then say
    what would have, for logging).
    """

    session: Window
    absorbed: tuple[Window, ...]
    late: bool


def session_for(
    spec: SessionWindows,
    sessions: Iterable[Window],
    timestamp_ms: int,
    stream_time_ms: int | None,
) -> SessionUpdate:
    """The session a record at ``timestamp_ms`` joins, and the sessions it merges.

    ``sessions``: the key's existing sessions; at least those within ``spec.reach(ts)``
    (every ``(start, end)`` with ``start <= ts + gap`` and ``end > ts - gap``), others
    are ignored, in any order. ``stream_time_ms``: the partition's stream time, with or
    without this record (None before the first record); it decides lateness: the record is
    late when the resulting session, or one it absorbs, has closed
    (``max(stream_time, ts) >= spec.close_time(end)``), so a session's result never
    changes after it closed. Raises ConfigurationError for a timestamp that is not an
    int >= 0.
    """
    check_timestamp(timestamp_ms)
    gap = spec.gap_ms
    low, high = timestamp_ms - gap, timestamp_ms + gap
    start, end = timestamp_ms, timestamp_ms + 1
    absorbed = sorted(s for s in sessions if s[0] <= high and s[1] > low)
    for s_start, s_end in absorbed:
        start = min(start, s_start)
        end = max(end, s_end)
    now = timestamp_ms if stream_time_ms is None else max(stream_time_ms, timestamp_ms)
    # the earliest-closing session touched decides: the absorbed one ending first, or the result
    first_end = absorbed[0][1] if absorbed else end
    late = now >= spec.close_time(min(first_end, end))
    return SessionUpdate((start, end), tuple(absorbed), late)


def sessions_of(spec: SessionWindows, timestamps: Iterable[int]) -> list[Window]:
    """All sessions of a key's records (all of them at once, any order), by start."""
    out: list[Window] = []
    for ts in sorted(timestamps):
        if out and ts - (out[-1][1] - 1) <= spec.gap_ms:
            out[-1] = (out[-1][0], ts + 1)
        else:
            out.append((ts, ts + 1))
    return out
