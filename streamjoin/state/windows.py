"""Window arithmetic (pure): tumbling and hopping windows, and when they expire.

Windows are epoch-aligned, ``[start, end)`` in milliseconds. Retention counts
from the window's *end*: a window is kept while
``stream_time < window_end + retention`` and expires as soon as
``stream_time >= window_end + retention``. Stream time is whatever the caller
tracks (normally the largest event timestamp seen by the partition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from streamjoin.errors import ConfigurationError

__all__ = [
    "HoppingWindows",
    "TumblingWindows",
    "WindowSpec",
    "may_start_between",
]


class WindowSpec(Protocol):
    """What a windowed table (:mod:`streamjoin.windowed`) needs from a window definition.

    How windows are stored is :mod:`streamjoin.state.window_layout`.
    """

    @property
    def size_ms(self) -> int: ...

    @property
    def retention_ms(self) -> int: ...

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]: ...

    def expired(self, window_end_ms: int, stream_time_ms: int) -> bool: ...


def may_start_between(spec: WindowSpec, low: int, high: int) -> bool:
    """Whether a window of ``spec`` can start in ``(low, high]``: windows start at multiples
    of their step, so an expiry pass whose cutoff moved less than that finds nothing new.
    True for a spec of another kind (nothing known about its starts)."""
    if isinstance(spec, TumblingWindows):
        step = spec.size_ms
    elif isinstance(spec, HoppingWindows):
        step = spec.step_ms
    else:
        return True
    return high >= 0 and high - high % step > low  # (windows start at 0 or later)


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive int, got {value!r}")


def _check_timestamp(timestamp_ms: int) -> None:
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0:
        raise ConfigurationError(
            f"timestamps are ints >= 0 (ms since the epoch), got {timestamp_ms!r}"
        )


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
            raise ConfigurationError(
                f"retention_ms ({self.retention_ms}) must be >= size_ms ({self.size_ms})"
            )

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        # the one window, without the general hopping arithmetic (once per table access)
        if type(timestamp_ms) is not int or timestamp_ms < 0:
            _check_timestamp(timestamp_ms)
        start = timestamp_ms - timestamp_ms % self.size_ms
        return [(start, start + self.size_ms)]

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
            raise ConfigurationError(
                f"step_ms ({self.step_ms}) must be <= size_ms ({self.size_ms}); "
                "larger steps would leave gaps no window covers"
            )
        if self.retention_ms < self.size_ms:
            raise ConfigurationError(
                f"retention_ms ({self.retention_ms}) must be >= size_ms ({self.size_ms})"
            )

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        return _windows_for(timestamp_ms, self.size_ms, self.step_ms)

    def expired(self, window_end_ms: int, stream_time_ms: int) -> bool:
        """True once ``stream_time >= window_end + retention``."""
        return _expired(window_end_ms, stream_time_ms, self.retention_ms)
