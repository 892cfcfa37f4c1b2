"""Sliding windows of one key, one record at a time (pure: no I/O, no state of its own).

Kafka Streams' sliding windows (:class:`~streamjoin.state.windows.SlidingWindows`): with
``d = difference_ms``, a window is ``(start, start + d + 1)`` (half-open, so it holds the
records with ``start <= ts <= start + d``) and a key's windows are exactly:

* for each record at ``t``, its *left* window, ending with it: ``(t - d, t + 1)``, or
  ``(0, d + 1)`` when ``t < d`` (no window starts before the epoch: as in Kafka, the
  early records share the first window);
* for each record at ``t``, its *right* window ``(t + 1, t + d + 2)``, if a record of the
  key falls in it.

Windows are identified by their start. The caller (an aggregation) keeps the key's
records (at least those within ``spec.reach(ts)`` of any record still to come) and one
aggregate per window, and asks :func:`slide` what a new record changes::

    spec = SlidingWindows(difference_ms=10, grace_ms=20)
    # the key has records at 5, 12 and 30: windows (0, 11) {5}, (2, 13) {5, 12},
    # (6, 17) {12} (the right window of 5) and (20, 31) {30}
    update = slide(spec, [5, 12, 30], timestamp_ms=14, stream_time_ms=30)
    assert update == SlidingUpdate(
        created=((4, 15), (13, 24)), updated=((6, 17),), late=False
    )
    # created: (4, 15) {5, 12, 14}, the left window of 14, and (13, 24) {14}, the right
    # window of 12, which now holds a record; updated: (6, 17) {12} + 14

A created window's aggregate is computed from the records it holds, the new one
included (records with ``start <= ts < end``); an updated window already existed and
holds the new record too: add it to its aggregate. Nothing else changes (adding a record
never removes a window). A late record changes nothing: count it and drop it.
:func:`windows_of` gives a key's windows from all its records at once (batch jobs, and
the model the tests check :func:`slide` against).

A record at ``u`` is no longer needed once ``stream_time >= u + d + 2 + grace``: every
record still to come is then either late or more than ``d + 1`` after it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streamjoin.state.windows import SlidingWindows, Window, check_timestamp

__all__ = ["SlidingUpdate", "slide", "windows_of"]


@dataclass(frozen=True, slots=True)
class SlidingUpdate:
    """What a record does to its key's sliding windows.

    ``created``: windows that exist now and did not before, by start (compute each from
    the records it holds, the new one included). ``updated``: windows that existed and
    now also hold the new record, by start (add it). ``late``: the first window holding
    the record (its left window) has closed, so nothing changes (``created``/``updated``
    then say what would have, for logging). Every window a record creates or updates
    closes no earlier than its left window, so a window's result never changes after it
    closed.
    """

    created: tuple[Window, ...]
    updated: tuple[Window, ...]
    late: bool


def slide(
    spec: SlidingWindows,
    records: Iterable[int],
    timestamp_ms: int,
    stream_time_ms: int | None,
) -> SlidingUpdate:
    """The windows a record at ``timestamp_ms`` creates and updates.

    ``records``: the timestamps of the key's records already taken (not the new one), in
    any order; at least those in ``spec.reach(ts)`` (``[ts - d - 1, ts + d + 1]``), others
    are ignored. ``stream_time_ms``: the partition's stream time, with or without this
    record (None before the first record); the record is late when its left window has
    closed: ``max(stream_time, ts) >= spec.close_time(max(ts, d) + 1)``. Raises
    ConfigurationError for a timestamp that is not an int >= 0.
    """
    check_timestamp(timestamp_ms)
    d = spec.difference_ms
    low, high = timestamp_ms - d - 1, timestamp_ms + d + 1
    before = sorted(t for t in records if low <= t <= high)
    after = list(before)
    insort(after, timestamp_ms)
    # the only windows that can change: those holding the record (starts in [ts - d, ts])
    # and its right window (start ts + 1)
    first, last = max(0, timestamp_ms - d), timestamp_ms + 1
    old = _starts(before, d, first, last)
    new = _starts(after, d, first, last)
    size = d + 1
    created = tuple((s, s + size) for s in sorted(new - old))
    updated = tuple((s, s + size) for s in sorted(old) if s <= timestamp_ms)
    now = timestamp_ms if stream_time_ms is None else max(stream_time_ms, timestamp_ms)
    late = now >= spec.close_time(max(timestamp_ms, d) + 1)
    return SlidingUpdate(created, updated, late)


def windows_of(spec: SlidingWindows, timestamps: Iterable[int]) -> list[Window]:
    """All windows of a key's records (all of them at once, any order), by start."""
    ordered = sorted(timestamps)
    if not ordered:
        return []
    d = spec.difference_ms
    return [(s, s + d + 1) for s in sorted(_starts(ordered, d, 0, ordered[-1] + 1))]


def _starts(ordered: Sequence[int], d: int, first: int, last: int) -> set[int]:
    """The starts in ``[first, last]`` of the windows of the records ``ordered`` (sorted)."""
    starts: set[int] = set()
    # left windows: a record at u starts one at max(0, u - d)
    if first == 0 and ordered and ordered[0] <= d:
        starts.add(0)
    for i in range(bisect_left(ordered, first + d), bisect_right(ordered, last + d)):
        starts.add(max(0, ordered[i] - d))
    # right windows: a record at u starts one at u + 1 if a record is in [u + 1, u + 1 + d]
    for i in range(bisect_left(ordered, first - 1), bisect_right(ordered, last - 1)):
        u = ordered[i]
        following = bisect_right(ordered, u)
        if following < len(ordered) and ordered[following] <= u + 1 + d:
            starts.add(u + 1)
    return starts
