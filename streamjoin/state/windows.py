"""Window arithmetic (pure) and a windowed view over any store partition.

Windows are epoch-aligned, ``[start, end)`` in milliseconds. Retention counts
from the window's *end*: a window is kept while
``stream_time < window_end + retention`` and expires as soon as
``stream_time >= window_end + retention``. Stream time is whatever the caller
tracks (normally the largest event timestamp seen by the partition).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from streamjoin.errors import ArgumentTypeError, WindowError
from streamjoin.state.base import StorePartition
from streamjoin.state.keys import (
    KEY_LENGTH_BYTES,
    MAX_UINT64,
    WINDOW_DATA_PREFIX,
    WINDOW_EXPIRY_PREFIX,
    encode_uint64,
    length_prefixed,
    prefix_range,
    split_window_key,
    window_key,
    window_key_prefix,
)

__all__ = [
    "HoppingWindows",
    "TumblingWindows",
    "WindowError",
    "WindowSpec",
    "WindowedStore",
]


class WindowSpec(Protocol):
    """What :class:`WindowedStore` needs from a window definition."""

    @property
    def size_ms(self) -> int: ...

    @property
    def retention_ms(self) -> int: ...

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]: ...

    def expired(self, window_end_ms: int, stream_time_ms: int) -> bool: ...


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise WindowError(f"{name} must be a positive int, got {value!r}")


def _check_timestamp(timestamp_ms: int) -> None:
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0:
        raise WindowError(f"timestamps are ints >= 0 (ms since the epoch), got {timestamp_ms!r}")


def _windows_for(timestamp_ms: int, size_ms: int, step_ms: int) -> list[tuple[int, int]]:
    """Windows ``[s, s + size)`` with ``s`` a non-negative multiple of ``step`` containing ts."""
    _check_timestamp(timestamp_ms)
    last = timestamp_ms - timestamp_ms % step_ms
    # first start s with s > ts - size, i.e. s >= ts - size + 1, rounded up to a step
    lowest = timestamp_ms - size_ms + 1
    first = max(0, -(-lowest // step_ms) * step_ms)
    return [(start, start + size_ms) for start in range(first, last + 1, step_ms)]


def _expired(window_end_ms: int, stream_time_ms: int, retention_ms: int) -> bool:
    return stream_time_ms >= window_end_ms + retention_ms


@dataclass(frozen=True)
class TumblingWindows:
    """Back-to-back windows of ``size_ms``: every timestamp is in exactly one."""

    size_ms: int
    retention_ms: int

    def __post_init__(self) -> None:
        _positive_int("size_ms", self.size_ms)
        _positive_int("retention_ms", self.retention_ms)
        if self.retention_ms < self.size_ms:
            raise WindowError(
                f"retention_ms ({self.retention_ms}) must be >= size_ms ({self.size_ms})"
            )

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        return _windows_for(timestamp_ms, self.size_ms, self.size_ms)

    def expired(self, window_end_ms: int, stream_time_ms: int) -> bool:
        """True once ``stream_time >= window_end + retention``."""
        return _expired(window_end_ms, stream_time_ms, self.retention_ms)


@dataclass(frozen=True)
class HoppingWindows:
    """Windows of ``size_ms`` starting every ``step_ms``; a timestamp is in up to
    ``ceil(size / step)`` of them (fewer near the epoch)."""

    size_ms: int
    step_ms: int
    retention_ms: int

    def __post_init__(self) -> None:
        _positive_int("size_ms", self.size_ms)
        _positive_int("step_ms", self.step_ms)
        _positive_int("retention_ms", self.retention_ms)
        if self.step_ms > self.size_ms:
            raise WindowError(
                f"step_ms ({self.step_ms}) must be <= size_ms ({self.size_ms}); "
                "larger steps would leave gaps no window covers"
            )
        if self.retention_ms < self.size_ms:
            raise WindowError(
                f"retention_ms ({self.retention_ms}) must be >= size_ms ({self.size_ms})"
            )

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        return _windows_for(timestamp_ms, self.size_ms, self.step_ms)

    def expired(self, window_end_ms: int, stream_time_ms: int) -> bool:
        """True once ``stream_time >= window_end + retention``."""
        return _expired(window_end_ms, stream_time_ms, self.retention_ms)


#: expired windows deleted per store write; bounds memory when a lot expires at once
EXPIRE_BATCH = 10_000


class WindowedStore:
    """Per-(key, window start) values over a :class:`StorePartition`.

    Two namespaces share the store (see :mod:`streamjoin.state.keys`):

    - ``WINDOW_DATA_PREFIX + window_key(key, start)`` -> value: a key's windows are
      contiguous and start-ordered, so :meth:`fetch` is one range scan;
    - ``WINDOW_EXPIRY_PREFIX + start (8 bytes) + length-prefixed key`` -> ``b""``: the
      same windows ordered by start, so :meth:`expire` reads only expired entries.

    Both entries of a window are written in the same atomic ``write()``. All
    windows have the same size, so start order is also end order.
    """

    def __init__(self, store: StorePartition, windows: WindowSpec) -> None:
        self.store = store
        self.windows = windows

    # ---------------------------------------------------------------- encoding

    @staticmethod
    def _data_key(key: bytes, window_start_ms: int) -> bytes:
        return WINDOW_DATA_PREFIX + window_key(key, window_start_ms)

    @staticmethod
    def _expiry_key(key: bytes, window_start_ms: int) -> bytes:
        return WINDOW_EXPIRY_PREFIX + encode_uint64(window_start_ms) + length_prefixed(key)

    @staticmethod
    def _data_key_from_expiry(expiry_key: bytes) -> bytes:
        body = expiry_key[len(WINDOW_EXPIRY_PREFIX) :]
        start, prefixed_key = body[:8], body[8:]
        if len(prefixed_key) < KEY_LENGTH_BYTES:
            raise WindowError(f"malformed window expiry entry {expiry_key!r}")
        return WINDOW_DATA_PREFIX + prefixed_key + start

    def writes_for(
        self, key: bytes, window_start_ms: int, value: bytes | None
    ) -> dict[bytes, bytes | None]:
        """The store writes that set (or, for None, delete) one window; for batching."""
        _check_timestamp(window_start_ms)
        index_value = None if value is None else b""
        return {
            self._data_key(key, window_start_ms): value,
            self._expiry_key(key, window_start_ms): index_value,
        }

    # ---------------------------------------------------------------- operations

    def put(
        self,
        key: bytes,
        window_start_ms: int,
        value: bytes,
        changelog_offset: int | None = None,
    ) -> None:
        if not isinstance(value, bytes):
            raise ArgumentTypeError(f"window values are bytes, got {type(value).__name__}")
        self.store.write(self.writes_for(key, window_start_ms, value), changelog_offset)

    def put_many(
        self,
        entries: Iterable[tuple[bytes, int, bytes | None]],
        changelog_offset: int | None = None,
    ) -> None:
        """Set or delete (value None) many windows in one atomic store write."""
        writes: dict[bytes, bytes | None] = {}
        for key, start, value in entries:
            writes.update(self.writes_for(key, start, value))
        self.store.write(writes, changelog_offset)

    def delete(self, key: bytes, window_start_ms: int, changelog_offset: int | None = None) -> None:
        self.store.write(self.writes_for(key, window_start_ms, None), changelog_offset)

    def get(self, key: bytes, window_start_ms: int) -> bytes | None:
        _check_timestamp(window_start_ms)
        return self.store.get(self._data_key(key, window_start_ms))

    def fetch(self, key: bytes, from_ms: int, to_ms: int) -> list[tuple[int, bytes]]:
        """Windows of ``key`` whose start is in ``[from_ms, to_ms]`` (both inclusive, like
        Kafka Streams' ``WindowStore.fetch``), in start order."""
        _check_timestamp(from_ms)
        _check_timestamp(to_ms)
        if to_ms < from_ms:
            return []
        lower = self._data_key(key, from_ms)
        if to_ms < MAX_UINT64:
            upper: bytes | None = self._data_key(key, to_ms + 1)
        else:
            upper = prefix_range(WINDOW_DATA_PREFIX + window_key_prefix(key))[1]
        skip = len(WINDOW_DATA_PREFIX)
        return [
            (split_window_key(data_key[skip:])[1], value)
            for data_key, value in self.store.items(lower, upper)
        ]

    def expiry_cutoff(self, stream_time_ms: int) -> int:
        """Windows whose start is below this are expired at ``stream_time_ms``.

        ``start + size + retention <= stream_time`` rearranged; may be <= 0 (nothing expired).
        """
        return stream_time_ms - self.windows.size_ms - self.windows.retention_ms + 1

    def expire(self, stream_time_ms: int, changelog_offset: int | None = None) -> int:
        """Delete every expired window; returns how many.

        Scans only the expiry index below the cutoff, in chunks of
        :data:`EXPIRE_BATCH` windows per atomic write. ``changelog_offset`` goes
        with the last write (alone if nothing expired), so the stored offset is
        never ahead of the deletions.
        """
        cutoff = min(self.expiry_cutoff(stream_time_ms), MAX_UINT64)
        removed = 0
        if cutoff > 0:
            index_start = WINDOW_EXPIRY_PREFIX
            index_end = WINDOW_EXPIRY_PREFIX + encode_uint64(cutoff)
            while True:
                writes: dict[bytes, bytes | None] = {}
                for index_key, _ in self.store.items(index_start, index_end):
                    writes[index_key] = None
                    writes[self._data_key_from_expiry(index_key)] = None
                    if len(writes) >= 2 * EXPIRE_BATCH:
                        break
                if not writes:
                    break
                removed += len(writes) // 2
                last_chunk = len(writes) < 2 * EXPIRE_BATCH
                self.store.write(writes, changelog_offset if last_chunk else None)
                if last_chunk:
                    return removed
        if changelog_offset is not None:
            self.store.write({}, changelog_offset)
        return removed
