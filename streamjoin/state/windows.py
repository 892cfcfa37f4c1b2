"""Window definitions (pure): tumbling, hopping, sliding and session windows; their units,
grace and retention.

Every window is half-open, ``(start, end)`` in milliseconds since the epoch, holding the
records with ``start <= timestamp < end`` (one convention for every kind, so storage,
expiry and emission treat them alike). Tumbling and hopping windows are epoch-aligned and
known from a timestamp alone (:meth:`TumblingWindows.windows_for`); sliding and session
windows depend on the key's other records, so :mod:`streamjoin.state.sliding` and
:mod:`streamjoin.state.sessions` compute them.

Durations are :class:`datetime.timedelta` (``size=timedelta(minutes=5)``) or ints of
milliseconds by keyword (``size_ms=300_000``). A bare number is refused: Faust's windows
took seconds and streamjoin's took milliseconds, so its unit would be a guess.

Two moments in a window's life, against the partition's *stream time* (the largest
record timestamp it has seen):

* it **closes** once ``stream_time >= close_time(end)``, which is ``end + grace`` (sessions
  also wait out their gap: ``end + gap + grace``): its result is final, and a later record
  for it is *late* (dropped and counted);
* it **expires** (is deleted) once ``stream_time >= end + retention``; retention
  ``None`` keeps windows forever; it may be shorter than the window (Faust's ``expires``)
  but not than ``grace`` (a window deleted before it closes would start again from
  nothing at its next record).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Final, Literal, Never, Protocol

from streamjoin.errors import ConfigurationError

__all__ = [
    "UNSET",
    "AnyWindows",
    "HoppingWindows",
    "SessionWindows",
    "SlidingWindows",
    "TumblingWindows",
    "Window",
    "WindowSpec",
    "check_timestamp",
    "may_start_between",
]

#: a window ``(start, end)``, half-open, in ms since the epoch
Window = tuple[int, int]


class _Unset(Enum):
    UNSET = "UNSET"


#: the default of ``retention``/``retention_ms``: not given (``None`` means "never expire")
UNSET: Final = _Unset.UNSET


class WindowSpec(Protocol):
    """What a windowed table (:mod:`streamjoin.windowed`) needs from a window definition:
    windows known from a timestamp alone (tumbling and hopping).

    How windows are stored is :mod:`streamjoin.state.window_layout`.
    """

    @property
    def size_ms(self) -> int: ...

    @property
    def grace_ms(self) -> int: ...

    @property
    def retention_ms(self) -> int | None: ...

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]: ...

    def expired(self, window_end_ms: int, stream_time_ms: int) -> bool: ...

    def close_time(self, window_end_ms: int) -> int: ...


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


# ------------------------------------------------------------------ units


_MICROSECONDS_PER_MS = 1000


def _duration_ms(owner: str, name: str, duration: object, duration_ms: object) -> int | None:
    """The duration ``name`` given as ``name=timedelta`` or ``name_ms=int``, in ms (None if
    neither); errors name the argument and both accepted forms."""
    if duration is not None and duration_ms is not None:
        raise ConfigurationError(f"{owner}: give {name}= or {name}_ms=, not both")
    if duration is not None:
        if isinstance(duration, timedelta):
            micros = duration // timedelta(microseconds=1)
            ms, rest = divmod(micros, _MICROSECONDS_PER_MS)
            if rest:
                raise ConfigurationError(
                    f"{owner}: {name}={duration!r} is not a whole number of milliseconds"
                )
            return ms
        if isinstance(duration, int | float) and not isinstance(duration, bool):
            raise ConfigurationError(
                f"{owner}: {name} {duration!r} is a bare number, so its unit would be a "
                f"guess: write {name}=timedelta(seconds={duration!r}) or "
                f"{name}_ms={duration!r} (milliseconds)"
            )
        raise ConfigurationError(
            f"{owner}: {name} must be a datetime.timedelta (or {name}_ms= an int of "
            f"milliseconds), got {duration!r}"
        )
    if duration_ms is not None:
        if isinstance(duration_ms, bool) or not isinstance(duration_ms, int):
            raise ConfigurationError(
                f"{owner}: {name}_ms must be an int of milliseconds (or {name}= a "
                f"datetime.timedelta), got {duration_ms!r}"
            )
        return duration_ms
    return None


def _no_extra_positionals(owner: str, takes: str, extra: tuple[object, ...]) -> None:
    if extra:
        raise ConfigurationError(
            f"{owner} takes {takes} positionally (as datetime.timedelta); pass "
            f"grace=/grace_ms= and retention=/retention_ms= by keyword, got the extra "
            f"positional arguments {extra!r}"
        )


def _required(owner: str, name: str, value: int | None, *, minimum: int = 1) -> int:
    if value is None:
        raise ConfigurationError(
            f"{owner} needs {name}= (a datetime.timedelta) or {name}_ms= (an int of ms)"
        )
    if value < minimum:
        raise ConfigurationError(f"{owner}: {name}_ms must be >= {minimum}, got {value}")
    return value


def _grace(owner: str, grace: object, grace_ms: object) -> int:
    value = _duration_ms(owner, "grace", grace, grace_ms)
    return 0 if value is None else _required(owner, "grace", value, minimum=0)


def _retention(
    owner: str, retention: object, retention_ms: object, *, default: int, grace_ms: int
) -> int | None:
    """``retention_ms``: ``default`` when not given, None when given as None (never expire)."""
    if retention is not UNSET and retention_ms is not UNSET:
        raise ConfigurationError(f"{owner}: give retention= or retention_ms=, not both")
    if retention is UNSET and retention_ms is UNSET:
        return default
    if retention is None or retention_ms is None:
        return None  # (the one given) windows never expire
    given = _duration_ms(
        owner,
        "retention",
        None if retention is UNSET else retention,
        None if retention_ms is UNSET else retention_ms,
    )
    if given is None:
        return default  # (not reached: one of them is a value)
    if given < grace_ms:
        raise ConfigurationError(
            f"{owner}: retention_ms ({given}) must be >= grace_ms ({grace_ms}): a window "
            "deleted before it closes would start again from nothing at its next record"
        )
    return given


def _grace_and_retention(
    owner: str,
    grace: object,
    grace_ms: object,
    retention: object,
    retention_ms: object,
    *,
    extent_ms: int,
) -> tuple[int, int | None]:
    """``(grace_ms, retention_ms)`` of a window kind whose windows span ``extent_ms``:
    retention defaults to ``extent + grace``."""
    grace_value = _grace(owner, grace, grace_ms)
    retention_value = _retention(
        owner, retention, retention_ms, default=extent_ms + grace_value, grace_ms=grace_value
    )
    return grace_value, retention_value


def _freeze(spec: object, **fields: object) -> None:
    """Set the fields of a frozen spec (from its ``__init__``)."""
    for name, value in fields.items():
        object.__setattr__(spec, name, value)


def check_timestamp(timestamp_ms: int) -> None:
    """Refuses a timestamp that is not an int >= 0 (ms since the epoch)."""
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0:
        raise ConfigurationError(
            f"timestamps are ints >= 0 (ms since the epoch), got {timestamp_ms!r}"
        )


def _windows_for(timestamp_ms: int, size_ms: int, step_ms: int) -> list[tuple[int, int]]:
    """Windows ``[s, s + size)`` with ``s`` a non-negative multiple of ``step`` containing ts."""
    check_timestamp(timestamp_ms)
    last = timestamp_ms - timestamp_ms % step_ms
    # first start s with s > ts - size, i.e. s >= ts - size + 1, rounded up to a step
    lowest = timestamp_ms - size_ms + 1
    first = max(0, -(-lowest // step_ms) * step_ms)
    return [(start, start + size_ms) for start in range(first, last + 1, step_ms)]


# ------------------------------------------------------------------ kinds


class _GraceAndRetention:
    """What every window kind does with its ``grace_ms`` and ``retention_ms``."""

    __slots__ = ()
    grace_ms: int
    retention_ms: int | None

    def expired(self, window_end_ms: int, stream_time_ms: int) -> bool:
        """True once ``stream_time >= window_end + retention`` (never without retention)."""
        retention_ms = self.retention_ms
        return retention_ms is not None and stream_time_ms >= window_end_ms + retention_ms

    def close_time(self, window_end_ms: int) -> int:
        """The stream time at which the window ending at ``window_end_ms`` closes."""
        return window_end_ms + self.grace_ms


@dataclass(frozen=True, slots=True, init=False)
class TumblingWindows(_GraceAndRetention):
    """Back-to-back windows of ``size``: every timestamp is in exactly one.

    ``TumblingWindows(timedelta(minutes=1), grace=timedelta(seconds=10))`` or
    ``TumblingWindows(size_ms=60_000, grace_ms=10_000)``; retention defaults to
    ``size + grace`` (counted from the window's end), ``retention=None`` never expires.
    """

    size_ms: int
    grace_ms: int
    retention_ms: int | None

    def __init__(
        self,
        size: timedelta | None = None,
        *positional: Never,
        size_ms: int | None = None,
        grace: timedelta | None = None,
        grace_ms: int | None = None,
        retention: timedelta | Literal[_Unset.UNSET] | None = UNSET,
        retention_ms: int | Literal[_Unset.UNSET] | None = UNSET,
    ) -> None:
        owner = "TumblingWindows"
        size_value = _required(owner, "size", _duration_ms(owner, "size", size, size_ms))
        _no_extra_positionals(owner, "only its size", positional)
        grace_value, retention_value = _grace_and_retention(
            owner, grace, grace_ms, retention, retention_ms, extent_ms=size_value
        )
        _freeze(self, size_ms=size_value, grace_ms=grace_value, retention_ms=retention_value)

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        # the one window, without the general hopping arithmetic (once per table access)
        if type(timestamp_ms) is not int or timestamp_ms < 0:
            check_timestamp(timestamp_ms)
        start = timestamp_ms - timestamp_ms % self.size_ms
        return [(start, start + self.size_ms)]


@dataclass(frozen=True, slots=True, init=False)
class HoppingWindows(_GraceAndRetention):
    """Windows of ``size`` starting every ``step``; a timestamp is in up to
    ``ceil(size / step)`` of them (fewer near the epoch).

    ``HoppingWindows(timedelta(minutes=5), timedelta(minutes=1))`` or
    ``HoppingWindows(size_ms=300_000, step_ms=60_000)``; grace and retention as for
    :class:`TumblingWindows`.
    """

    size_ms: int
    step_ms: int
    grace_ms: int
    retention_ms: int | None

    def __init__(
        self,
        size: timedelta | None = None,
        step: timedelta | None = None,
        *positional: Never,
        size_ms: int | None = None,
        step_ms: int | None = None,
        grace: timedelta | None = None,
        grace_ms: int | None = None,
        retention: timedelta | Literal[_Unset.UNSET] | None = UNSET,
        retention_ms: int | Literal[_Unset.UNSET] | None = UNSET,
    ) -> None:
        owner = "HoppingWindows"
        size_value = _required(owner, "size", _duration_ms(owner, "size", size, size_ms))
        step_value = _required(owner, "step", _duration_ms(owner, "step", step, step_ms))
        _no_extra_positionals(owner, "its size and step", positional)
        if step_value > size_value:
            raise ConfigurationError(
                f"{owner}: step_ms ({step_value}) must be <= size_ms ({size_value}); "
                "larger steps would leave gaps no window covers"
            )
        grace_value, retention_value = _grace_and_retention(
            owner, grace, grace_ms, retention, retention_ms, extent_ms=size_value
        )
        _freeze(
            self,
            size_ms=size_value,
            step_ms=step_value,
            grace_ms=grace_value,
            retention_ms=retention_value,
        )

    def windows_for(self, timestamp_ms: int) -> list[tuple[int, int]]:
        return _windows_for(timestamp_ms, self.size_ms, self.step_ms)


@dataclass(frozen=True, slots=True, init=False)
class SlidingWindows(_GraceAndRetention):
    """Kafka Streams' sliding windows: windows of records at most ``difference`` apart.

    Kafka's window ``[start, start + difference]`` (both ends inclusive) is
    ``(start, start + difference + 1)`` here, half-open like every window, so
    ``size_ms == difference_ms + 1``. A key's windows are made by its records: for a
    record at ``t``, the window ending at ``t`` (``(t - difference, t + 1)``; for
    ``t < difference``, as in Kafka, the window ``(0, difference + 1)``) and the window
    starting at ``t + 1`` if it holds records; only windows holding records exist. Which
    windows a record creates or changes is :func:`streamjoin.state.sliding.slide`.

    ``SlidingWindows(timedelta(minutes=5), grace=timedelta(seconds=30))`` or
    ``SlidingWindows(difference_ms=300_000, grace_ms=30_000)``; retention as for
    :class:`TumblingWindows` (default ``size + grace``).
    """

    difference_ms: int
    grace_ms: int
    retention_ms: int | None

    def __init__(
        self,
        difference: timedelta | None = None,
        *positional: Never,
        difference_ms: int | None = None,
        grace: timedelta | None = None,
        grace_ms: int | None = None,
        retention: timedelta | Literal[_Unset.UNSET] | None = UNSET,
        retention_ms: int | Literal[_Unset.UNSET] | None = UNSET,
    ) -> None:
        owner = "SlidingWindows"
        difference_value = _required(
            owner, "difference", _duration_ms(owner, "difference", difference, difference_ms)
        )
        _no_extra_positionals(owner, "only its difference", positional)
        grace_value, retention_value = _grace_and_retention(
            owner, grace, grace_ms, retention, retention_ms, extent_ms=difference_value + 1
        )
        _freeze(
            self,
            difference_ms=difference_value,
            grace_ms=grace_value,
            retention_ms=retention_value,
        )

    @property
    def size_ms(self) -> int:
        """The length of every window, half-open: ``difference_ms + 1``."""
        return self.difference_ms + 1

    def reach(self, timestamp_ms: int) -> tuple[int, int]:
        """``(low, high)``, inclusive: the timestamps of the key's records that a record at
        ``timestamp_ms`` needs to know of (:func:`~streamjoin.state.sliding.slide`)."""
        return timestamp_ms - self.difference_ms - 1, timestamp_ms + self.difference_ms + 1


@dataclass(frozen=True, slots=True, init=False)
class SessionWindows(_GraceAndRetention):
    """Sessions: a key's records with no more than ``gap`` between consecutive ones.

    A session is ``(first timestamp, last timestamp + 1)``, half-open like every window.
    A record within ``gap`` of a session joins it (a difference of exactly ``gap`` still
    joins); one within ``gap`` of two sessions merges them. A session can change until
    no record within grace can reach it any more, so it closes once
    ``stream_time >= end + gap + grace`` (:meth:`close_time`; with Kafka Streams' inclusive
    end ``last``, that is ``stream_time > last + gap + grace``, Kafka's rule). How a record
    joins or merges sessions is :func:`streamjoin.state.sessions.session_for`.

    ``SessionWindows(timedelta(minutes=30))`` or ``SessionWindows(gap_ms=1_800_000)``;
    retention (from the session's end) defaults to ``gap + grace`` and must be at least
    that, so that no session is deleted while a record can still join it.
    """

    gap_ms: int
    grace_ms: int
    retention_ms: int | None

    def __init__(
        self,
        gap: timedelta | None = None,
        *positional: Never,
        gap_ms: int | None = None,
        grace: timedelta | None = None,
        grace_ms: int | None = None,
        retention: timedelta | Literal[_Unset.UNSET] | None = UNSET,
        retention_ms: int | Literal[_Unset.UNSET] | None = UNSET,
    ) -> None:
        owner = "SessionWindows"
        gap_value = _required(owner, "gap", _duration_ms(owner, "gap", gap, gap_ms))
        _no_extra_positionals(owner, "only its gap", positional)
        grace_value, retention_value = _grace_and_retention(
            owner, grace, grace_ms, retention, retention_ms, extent_ms=gap_value
        )
        if retention_value is not None and retention_value < gap_value + grace_value:
            raise ConfigurationError(
                f"{owner}: retention_ms ({retention_value}) must be >= gap_ms + grace_ms "
                f"({gap_value + grace_value}): a session deleted before it closes would "
                "lose the records a later one should merge with"
            )
        _freeze(self, gap_ms=gap_value, grace_ms=grace_value, retention_ms=retention_value)

    def reach(self, timestamp_ms: int) -> tuple[int, int]:
        """``(low, high)``, inclusive: a record at ``timestamp_ms`` joins every session of
        its key with a record in this range, i.e. every session ``(start, end)`` with
        ``start <= high`` and ``end > low`` (:func:`~streamjoin.state.sessions.session_for`)."""
        return timestamp_ms - self.gap_ms, timestamp_ms + self.gap_ms

    def close_time(self, window_end_ms: int) -> int:
        """The stream time at which the session ending at ``window_end_ms`` closes:
        ``end + gap + grace``."""
        return window_end_ms + self.gap_ms + self.grace_ms


#: every window kind (sliding and session windows need the key's other records, so
#: windowed tables take a :class:`WindowSpec`; aggregations take any of them)
AnyWindows = TumblingWindows | HoppingWindows | SlidingWindows | SessionWindows
