"""Versioned tables' store layout and history retention (pure: no I/O, no clock).

A versioned table (``app.table(..., history_ms=N)``) keeps every value of a key written
in the last N ms of its partition's stream time, and always the latest one, so that
``get(key, as_of=ts)`` answers "the value valid at ts" (Kafka Streams'
``VersionedKeyValueStore``, KIP-889).

Layout (the same in the store and in the changelog, so a restore or a standby rebuilds
exactly the store): each version is its own key, :func:`version_key` = the 4-byte
length-prefixed key then the version's 8-byte big-endian timestamp. A key's versions are
contiguous and in time order, so "as of ts" is one range read ending just past ts, and a
compacted changelog keeps every version (their keys differ). Values carry a 1-byte
marker: :data:`VALUE` then the value, or :data:`DELETED` alone (a delete is a version too:
"absent from ts on"). The partition's stream time (the highest timestamp written) is kept
under :data:`STREAM_TIME_KEY`, the empty key, which no version key can be.

Retention: a version is needed while it was valid at some time in
``[stream time - history_ms, ...)``, i.e. until its successor's timestamp falls at or
before that *horizon*. :class:`History` queues each superseded version with its
successor's timestamp and hands out those due, oldest first; the table deletes them with a
changelog tombstone each. A key whose latest version is a delete older than the horizon
is dropped entirely. Queries older than the horizon cannot be answered exactly any more
and are refused (:func:`check_as_of`), the same whether or not the purge has run yet; writes
older than the horizon are dropped (:func:`write_version`), so what a partition answers
never depends on when its purges ran.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from streamjoin.errors import ConfigurationError, HistoryExpired, StoreError
from streamjoin.state.keys import KEY_LENGTH_BYTES, MAX_UINT64, length_prefixed

__all__ = [
    "DELETED",
    "PURGE_BATCH",
    "STREAM_TIME_KEY",
    "VALUE",
    "History",
    "VersionView",
    "as_of",
    "check_as_of",
    "check_history_ms",
    "check_timestamp",
    "decode_version",
    "encode_version",
    "key_of",
    "purge",
    "read_as_of",
    "read_latest",
    "timestamp_of",
    "version_group",
    "version_key",
    "version_range",
    "versions_until",
    "write_version",
]

#: marker byte of a stored version holding a value (the value follows)
VALUE = b"\x01"
#: a stored version saying the key was deleted at its timestamp
DELETED = b"\x00"
#: where a partition keeps its stream time (8-byte big-endian); never a version key
STREAM_TIME_KEY = b""
#: the most versions one flush of one partition purges (the rest wait for the next flush)
PURGE_BATCH = 10_000
_TIME_BYTES = 8
_MIN_VERSION_KEY = KEY_LENGTH_BYTES + _TIME_BYTES
#: sorts after every 8-byte timestamp
_PAST_EVERY_TIME = b"\xff" * (_TIME_BYTES + 1)


def check_history_ms(table: str, history_ms: object) -> int:
    """``history_ms`` as a validated int (milliseconds, >= 0: 0 keeps only the latest)."""
    if isinstance(history_ms, bool) or not isinstance(history_ms, int):
        raise ConfigurationError(
            f"table {table!r}: history_ms must be an int (milliseconds), "
            f"got {type(history_ms).__name__}"
        )
    if history_ms < 0:
        raise ConfigurationError(f"table {table!r}: history_ms must be >= 0, got {history_ms}")
    return history_ms


def check_timestamp(table: str, timestamp_ms: object) -> int:
    """A version's timestamp, validated (an int in [0, 2**64))."""
    if (
        isinstance(timestamp_ms, bool)
        or not isinstance(timestamp_ms, int)
        or not 0 <= timestamp_ms <= MAX_UINT64
    ):
        raise ConfigurationError(
            f"versioned table {table!r}: timestamps are ints in [0, 2**64) ms, got {timestamp_ms!r}"
        )
    return timestamp_ms


# ------------------------------------------------------------------ layout


def version_key(key: bytes, timestamp_ms: int) -> bytes:
    """The store (and changelog) key of ``key``'s version at ``timestamp_ms``."""
    return length_prefixed(key) + timestamp_ms.to_bytes(_TIME_BYTES, "big")


def version_range(key: bytes) -> tuple[bytes, bytes]:
    """``[start, end)`` holding exactly ``key``'s versions (the end begins with the start:
    a partition grouping keys by :func:`version_group` scans only that key's writes)."""
    prefix = length_prefixed(key)
    return prefix, prefix + _PAST_EVERY_TIME


def version_group(stored_key: bytes) -> bytes | None:
    """The group of a stored key (or of a scan bound) for
    :meth:`TablePartition.group_keys_by`: its length-prefixed user key, which every version
    of that key begins with and no other key does; None for the clock (and anything shorter
    than its own length prefix says)."""
    end = KEY_LENGTH_BYTES + int.from_bytes(stored_key[:KEY_LENGTH_BYTES], "big")
    return stored_key[:end] if len(stored_key) >= end else None


def versions_until(key: bytes, timestamp_ms: int) -> tuple[bytes, bytes]:
    """``[start, end)`` holding ``key``'s versions at or before ``timestamp_ms``: the last
    one in it is the version valid at ``timestamp_ms``."""
    prefix = length_prefixed(key)
    if timestamp_ms >= MAX_UINT64:
        return version_range(key)
    return prefix, prefix + (timestamp_ms + 1).to_bytes(_TIME_BYTES, "big")


def timestamp_of(stored_key: bytes) -> int:
    """The timestamp of a version key."""
    return int.from_bytes(stored_key[-_TIME_BYTES:], "big")


def key_of(stored_key: bytes) -> bytes:
    """The user key of a version key."""
    if len(stored_key) < _MIN_VERSION_KEY:
        raise StoreError(
            f"a versioned table's store key has {len(stored_key)} bytes, too few for a "
            "version (was the table declared without history_ms before? Reset its state "
            "and changelog to make an existing table versioned)"
        )
    return stored_key[KEY_LENGTH_BYTES:-_TIME_BYTES]


def encode_version(value: bytes | None) -> bytes:
    """A version's stored value (None: a delete)."""
    return DELETED if value is None else VALUE + value


def decode_version(stored: bytes) -> bytes | None:
    """The value of a stored version (None: the key was deleted at that time)."""
    marker = stored[:1]
    if marker == VALUE:
        return stored[1:]
    if marker == DELETED and len(stored) == 1:
        return None
    raise StoreError(
        f"a versioned table's stored value starts with {marker!r}, not a version marker "
        "(was the table declared without history_ms before? Reset its state and changelog)"
    )


def as_of(versions: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """The value valid at the end of ``versions`` (a key's versions, oldest first, up to the
    time asked: :func:`versions_until`); None when there is none or it was deleted."""
    if not versions:
        return None
    return decode_version(versions[-1][1])


def check_as_of(table: str, timestamp_ms: int, horizon: int | None) -> None:
    """Refuse an as-of query older than the retained history (its answer may be purged)."""
    if horizon is not None and timestamp_ms < horizon:
        raise HistoryExpired(
            f"versioned table {table!r}: as_of={timestamp_ms} is older than the history "
            f"kept ({horizon} = stream time - history_ms): that version may be purged. "
            "Raise history_ms to look further back"
        )


# ------------------------------------------------------------------ retention


class History:
    """One versioned table partition's stream time and its versions waiting to be purged.

    The queue holds ``(due time, version key)``: a superseded version is due at its
    successor's timestamp (a later out-of-order write between them only makes the true
    successor earlier, so a version is never purged too soon), a latest delete at its own
    timestamp. An entry is due once its time is at or before the horizon; the table checks
    each due entry against the store before deleting (stale entries are skipped).
    """

    __slots__ = ("_queue", "history_ms", "persisted_time", "stream_time")

    def __init__(self, history_ms: int, stream_time: int | None = None) -> None:
        self.history_ms = history_ms
        #: the highest version timestamp written (None: nothing yet)
        self.stream_time = stream_time
        #: the stream time last stored under STREAM_TIME_KEY
        self.persisted_time = stream_time
        self._queue: list[tuple[int, bytes]] = []

    @classmethod
    def rebuild(cls, history_ms: int, stored: Iterable[tuple[bytes, bytes]]) -> History:
        """The history of a partition holding ``stored`` (its store's pairs, in key order)."""
        history = cls(history_ms)
        stream_time: int | None = None
        previous: bytes | None = None
        previous_prefix = b""
        previous_value = b""
        for stored_key, value in stored:
            if stored_key == STREAM_TIME_KEY:
                clock = int.from_bytes(value, "big")
                history.persisted_time = clock
                stream_time = clock if stream_time is None else max(stream_time, clock)
                continue
            timestamp = timestamp_of(stored_key)
            prefix = stored_key[:-_TIME_BYTES]
            if previous is not None:
                if prefix == previous_prefix:
                    history._queue.append((timestamp, previous))
                elif previous_value == DELETED:
                    history._queue.append((timestamp_of(previous), previous))
            if stream_time is None or timestamp > stream_time:
                stream_time = timestamp
            previous, previous_prefix, previous_value = stored_key, prefix, value
        if previous is not None and previous_value == DELETED:
            history._queue.append((timestamp_of(previous), previous))
        heapq.heapify(history._queue)
        history.stream_time = stream_time
        return history

    @property
    def horizon(self) -> int | None:
        """The oldest time whose answer is still kept exactly (None: all of it)."""
        now = self.stream_time
        return None if now is None else now - self.history_ms

    def observe(self, timestamp_ms: int) -> None:
        """A version at ``timestamp_ms`` was written: stream time moves to it if later."""
        if self.stream_time is None or timestamp_ms > self.stream_time:
            self.stream_time = timestamp_ms

    def superseded(self, stored_key: bytes, successor_ms: int) -> None:
        """The version ``stored_key`` now has a successor at ``successor_ms``."""
        heapq.heappush(self._queue, (successor_ms, stored_key))

    def deleted_latest(self, stored_key: bytes) -> None:
        """``stored_key`` is a delete with no successor: the key goes once it is old."""
        heapq.heappush(self._queue, (timestamp_of(stored_key), stored_key))

    def waiting(self) -> int:
        """Entries queued (stale ones included)."""
        return len(self._queue)

    def take_due(self, limit: int = PURGE_BATCH) -> list[bytes]:
        """Up to ``limit`` version keys due for purging, oldest due first (each may be
        stale: the caller checks it against the store)."""
        horizon = self.horizon
        due: list[bytes] = []
        if horizon is None:
            return due
        queue = self._queue
        while queue and len(due) < limit and queue[0][0] <= horizon:
            due.append(heapq.heappop(queue)[1])
        return due

    def take_stream_time(self) -> bytes | None:
        """Stream time's stored form if it moved since last taken, else None."""
        now = self.stream_time
        if now is None or now == self.persisted_time:
            return None
        self.persisted_time = now
        return now.to_bytes(_TIME_BYTES, "big")


# ------------------------------------------------------------------ operations on a partition


class VersionView(Protocol):
    """What the operations below need of a partition (a
    :class:`~streamjoin.state.table_partition.TablePartition` is one)."""

    def lookup(self, key: bytes) -> bytes | None: ...

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]: ...

    def put(self, key: bytes, value: bytes | None) -> None: ...

    def delete(self, key: bytes) -> None: ...


def read_latest(view: VersionView, key: bytes) -> bytes | None:
    """``key``'s latest value (None: absent or deleted)."""
    return as_of(list(view.scan(*version_range(key))))


def read_as_of(view: VersionView, key: bytes, timestamp_ms: int) -> bytes | None:
    """``key``'s value valid at ``timestamp_ms`` (the caller checks the horizon first)."""
    return as_of(list(view.scan(*versions_until(key, timestamp_ms))))


def write_version(
    view: VersionView, history: History, key: bytes, value: bytes | None, timestamp_ms: int
) -> bool:
    """Write ``key``'s version at ``timestamp_ms`` (None: a delete), queueing for purging
    the version it supersedes and, if it is not the latest, itself. A write older than the
    horizon is dropped (False), as Kafka Streams drops it: the versions it would fall
    between may be purged already (a delete after it), so storing it could resurrect it."""
    horizon = history.horizon
    if horizon is not None and timestamp_ms < horizon:
        return False
    new_key = version_key(key, timestamp_ms)
    before: bytes | None = None
    after: int | None = None
    for stored_key, _ in view.scan(*version_range(key)):
        version_time = timestamp_of(stored_key)
        if version_time < timestamp_ms:
            before = stored_key
        elif version_time > timestamp_ms:
            after = version_time
            break
    view.put(new_key, encode_version(value))
    history.observe(timestamp_ms)
    if before is not None:
        history.superseded(before, timestamp_ms)
    if after is not None:
        history.superseded(new_key, after)
    elif value is None:
        history.deleted_latest(new_key)
    return True


def purge(view: VersionView, history: History, limit: int = PURGE_BATCH) -> int:
    """Delete up to ``limit`` versions out of history (each a changelog tombstone once
    flushed) and store stream time if it moved; returns how many went."""
    retry: list[bytes] = []
    purged = 0
    horizon = history.horizon
    for stored_key in history.take_due(limit):
        stored = view.lookup(stored_key)
        if stored is None:
            continue  # stale: purged already
        start, end = version_range(key_of(stored_key))
        if stored == DELETED:
            # a delete with nothing before it equals nothing: it goes once the versions it
            # ended went (they are due no later, so they normally went first)
            if next(view.scan(start, stored_key), None) is not None:
                retry.append(stored_key)
                continue
        else:
            successor = next(view.scan(stored_key + b"\x00", end), None)
            if successor is None:
                continue  # stale: rewritten since as the latest, which always stays
            successor_ms = timestamp_of(successor[0])
            if horizon is not None and successor_ms > horizon:
                # stale: queued for an earlier successor (or as a delete, since rewritten
                # at the same time with a value); still valid at the horizon
                history.superseded(stored_key, successor_ms)
                continue
        view.delete(stored_key)
        purged += 1
    for stored_key in retry:
        history.deleted_latest(stored_key)
    clock = history.take_stream_time()
    if clock is not None:
        view.put(STREAM_TIME_KEY, clock)
    return purged
