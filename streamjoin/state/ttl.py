"""Expiry of TTL tables' keys by stream time (pure: no I/O, no clock).

A TTL table (``app.table(..., ttl_ms=N)``) stores each value behind an 8-byte big-endian
*write time*: the partition's stream time when the key was last written. Stream time is
the highest event timestamp the table's partition has seen (events that read or wrote
it), never the wall clock, so a replay of the same events expires the same keys at the
same point, and the test driver and the Spark twin agree with the workers. A key is
expired once ``write time + ttl_ms <= stream time``: reads stop seeing it at once, and a
later flush purges it with a tombstone in the changelog (bounded work per flush).

The partition's stream time is itself stored, under :data:`STREAM_TIME_KEY` (the empty
key, which TTL tables refuse as a user key), so a restore or a standby resumes with the
same clock. Everything here is rebuilt from the stored pairs by :meth:`Expiry.rebuild`,
which is how a restored partition gets its expiry index back.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from streamjoin.errors import ConfigurationError, StoreError

__all__ = [
    "PURGE_BATCH",
    "STREAM_TIME_KEY",
    "WRITE_TIME_BYTES",
    "Expiry",
    "check_ttl_ms",
    "stamp",
    "write_time_of",
]

#: the length of the write-time prefix of every stored value of a TTL table
WRITE_TIME_BYTES = 8
#: where a TTL table partition keeps its stream time (the empty key: no user key)
STREAM_TIME_KEY = b""
#: the most keys one flush of one partition purges (the rest wait for the next flush;
#: reads already treat them as gone)
PURGE_BATCH = 10_000
_MAX_TIME = (1 << 64) - 1


def check_ttl_ms(table: str, ttl_ms: object) -> int:
    """``ttl_ms`` as a validated int (a positive number of milliseconds)."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise ConfigurationError(
            f"table {table!r}: ttl_ms must be an int (milliseconds), got {type(ttl_ms).__name__}"
        )
    if ttl_ms <= 0:
        raise ConfigurationError(f"table {table!r}: ttl_ms must be > 0, got {ttl_ms}")
    return ttl_ms


def stamp(write_time: int, value: bytes) -> bytes:
    """``value`` as a TTL table stores it: behind its write time."""
    return write_time.to_bytes(WRITE_TIME_BYTES, "big") + value


def write_time_of(stored: bytes) -> int:
    """The write time of a stored TTL value (its value is ``stored[WRITE_TIME_BYTES:]``)."""
    if len(stored) < WRITE_TIME_BYTES:
        raise StoreError(
            f"a TTL table's stored value has {len(stored)} bytes, fewer than its "
            f"{WRITE_TIME_BYTES}-byte write time (was the table declared without ttl_ms "
            "before? Reset its state and changelog to add ttl_ms to an existing table)"
        )
    return int.from_bytes(stored[:WRITE_TIME_BYTES], "big")


class Expiry:
    """One TTL table partition's stream time and its keys ordered by write time.

    The index is a heap of ``(write time, key)`` with lazy deletion: a rewrite pushes a
    new entry and leaves the old one to be skipped when it surfaces (the heap is rebuilt
    when stale entries outnumber live ones), so a write costs one push and purging the
    expired keys pops exactly them, oldest first: no scan of the live keys.
    """

    __slots__ = ("_heap", "_written", "persisted_time", "stream_time", "ttl_ms")

    def __init__(self, ttl_ms: int, stream_time: int | None = None) -> None:
        self.ttl_ms = ttl_ms
        #: the highest event timestamp seen (None: none yet, nothing expires)
        self.stream_time = stream_time
        #: the stream time last written under STREAM_TIME_KEY
        self.persisted_time = stream_time
        self._written: dict[bytes, int] = {}
        self._heap: list[tuple[int, bytes]] = []

    @classmethod
    def rebuild(cls, ttl_ms: int, stored: Iterable[tuple[bytes, bytes]]) -> Expiry:
        """The expiry of a partition holding ``stored`` (its store's pairs, values with
        their write time): the stored stream time (or the newest write time) and the index."""
        expiry = cls(ttl_ms)
        stream_time: int | None = None
        written = expiry._written
        for key, value in stored:
            time = write_time_of(value)
            if key == STREAM_TIME_KEY:
                stream_time = time if stream_time is None else max(stream_time, time)
                expiry.persisted_time = time
            else:
                written[key] = time
                if stream_time is None or time > stream_time:
                    stream_time = time
        expiry.stream_time = stream_time
        expiry._heap = [(time, key) for key, time in written.items()]
        heapq.heapify(expiry._heap)
        return expiry

    def observe(self, timestamp_ms: int) -> int:
        """Move stream time to ``timestamp_ms`` if that is later; returns stream time."""
        current = self.stream_time
        if current is None or timestamp_ms > current:
            current = self.stream_time = min(max(timestamp_ms, 0), _MAX_TIME)
        return current

    def is_expired(self, write_time: int) -> bool:
        """Whether a key written at ``write_time`` is expired at the current stream time."""
        now = self.stream_time
        return now is not None and write_time + self.ttl_ms <= now

    def written(self, key: bytes, write_time: int) -> None:
        """``key`` was (re)written at ``write_time``."""
        self._written[key] = write_time
        heap = self._heap
        heapq.heappush(heap, (write_time, key))
        if len(heap) > 2 * len(self._written) + 1024:
            self._heap = [(time, k) for k, time in self._written.items()]
            heapq.heapify(self._heap)

    def deleted(self, key: bytes) -> None:
        """``key`` was deleted (its heap entry is skipped when it surfaces)."""
        self._written.pop(key, None)

    def live_keys(self) -> int:
        """How many keys the index holds (expired ones not purged yet included)."""
        return len(self._written)

    def take_due(self, limit: int = PURGE_BATCH) -> list[bytes]:
        """Up to ``limit`` expired keys, oldest first, dropped from the index: the caller
        deletes them (a tombstone each)."""
        now = self.stream_time
        due: list[bytes] = []
        if now is None:
            return due
        heap, written, horizon = self._heap, self._written, now - self.ttl_ms
        while heap and len(due) < limit and heap[0][0] <= horizon:
            time, key = heapq.heappop(heap)
            if written.get(key) == time:
                del written[key]
                due.append(key)
        return due

    def take_stream_time(self) -> bytes | None:
        """The stored form of stream time if it moved since last taken (then it is
        written under :data:`STREAM_TIME_KEY`), else None."""
        now = self.stream_time
        if now is None or now == self.persisted_time:
            return None
        self.persisted_time = now
        return stamp(now, b"")
