"""Timers, crontabs and app tasks: what ``@app.timer``, ``@app.crontab`` and ``@app.task``
declare, and when a timer fires (pure: no event loop, no clock of its own).

A declaration is a frozen value: a name, the user's coroutine function, its schedule,
whether only the group's leader runs it, and what an error does. The worker
(``runtime.scheduled``) runs them; everything it decides about *when* is a function here,
given the time: :meth:`Every.next_fire` (an interval, on the monotonic clock),
:meth:`Crontab.next_fire` (a cron expression in a timezone, on the wall clock, through
``croniter``), and :func:`should_run` (the leader gate, asked at every tick).

Missed ticks are skipped, never run late in a burst (as in Faust): a run that overran
its interval (or a crontab's next time) is followed by the next tick still ahead.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from streamjoin.errors import ConfigurationError

__all__ = [
    "ON_ERROR_POLICIES",
    "AppTask",
    "Crontab",
    "Every",
    "OnTimerError",
    "Timer",
    "TimerFunction",
    "check_on_error",
    "interval_seconds",
    "scheduled_function",
    "should_run",
    "timezone_named",
]

#: what a timer or app task calls: ``async def fun() -> None``
TimerFunction = Callable[[], Awaitable[None]]
#: ``stop``: log, and stop the worker with the error as the app's failure; ``skip``: log,
#: count, and go on (a timer keeps ticking; an app task stays ended)
OnTimerError = Literal["stop", "skip"]
ON_ERROR_POLICIES: tuple[str, ...] = ("stop", "skip")


def interval_seconds(interval: timedelta | float, where: str) -> float:
    """``interval`` in seconds: a ``timedelta``, or a number of seconds (as Faust's
    ``app.timer`` takes it); refuses anything not positive and finite."""
    if isinstance(interval, timedelta):
        seconds = interval.total_seconds()
    elif isinstance(interval, int | float) and not isinstance(interval, bool):
        seconds = float(interval)
    else:
        raise ConfigurationError(
            f"{where}: the interval must be a timedelta or a number of seconds, got {interval!r}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{where}: the interval must be more than 0, got {interval!r}")
    return seconds


def timezone_named(timezone: str | tzinfo | None, where: str) -> tzinfo:
    """A timezone from its IANA name (``"Europe/Paris"``) or a ``tzinfo``; None is UTC."""
    if timezone is None:
        return UTC
    if isinstance(timezone, tzinfo):
        return timezone
    if isinstance(timezone, str):
        try:
            return ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    raise ConfigurationError(
        f"{where}: unknown timezone {timezone!r} (an IANA name such as 'Europe/Paris', or a tzinfo)"
    )


@dataclass(frozen=True)
class Every:
    """Fires every ``seconds``, the first time one interval after the timer starts.

    Ticks stay on the grid ``start + k * seconds`` (no drift, however long runs take)."""

    seconds: float

    def next_fire(self, start: float, after: float) -> float:
        """The first tick ``start + k * seconds`` (``k >= 1``) later than ``after``: the
        ticks a run overran are skipped."""
        if after < start:
            return start + self.seconds
        k = math.floor((after - start) / self.seconds) + 1
        due = start + k * self.seconds
        return due if due > after else due + self.seconds

    def describe(self) -> str:
        return f"every {self.seconds:g}s"


@dataclass(frozen=True)
class Crontab:
    """Fires at the times of a cron expression in ``timezone``: five fields (minute, hour,
    day of month, month, day of week), or six with seconds last (``"*/10 * * * * *"``)."""

    expression: str
    timezone: tzinfo

    @classmethod
    def parse(cls, expression: str, timezone: str | tzinfo | None, where: str) -> Crontab:
        """Checked at declaration: a bad expression or an unknown timezone is a
        :class:`ConfigurationError` naming it."""
        zone = timezone_named(timezone, where)
        if not isinstance(expression, str) or not croniter.is_valid(expression):
            raise ConfigurationError(
                f"{where}: invalid cron expression {expression!r} (five fields: minute hour "
                "day-of-month month day-of-week, or six with seconds last)"
            )
        return cls(expression, zone)

    def next_fire(self, after: float) -> float:
        """The first time of the expression later than ``after`` (seconds since the epoch):
        the times a run overran are skipped."""
        start = datetime.fromtimestamp(after, tz=UTC).astimezone(self.timezone)
        following: datetime = croniter(self.expression, start).get_next(datetime)
        return following.timestamp()

    def describe(self) -> str:
        return f"crontab {self.expression!r} ({self.timezone})"


@dataclass(frozen=True)
class Timer:
    """``@app.timer`` or ``@app.crontab``: ``fun`` run on ``schedule``, never twice at once."""

    name: str
    fun: TimerFunction
    schedule: Every | Crontab
    #: only the group's leader runs it (asked at every tick)
    on_leader: bool = False
    on_error: OnTimerError = "stop"


@dataclass(frozen=True)
class AppTask:
    """``@app.task``: ``fun`` started once with the worker (``on_leader``: while this
    worker leads the group; started again if it leads again), cancelled when it stops."""

    name: str
    fun: TimerFunction
    on_leader: bool = False
    on_error: OnTimerError = "stop"


def scheduled_function(fun: Callable[..., Any], app: object, where: str) -> TimerFunction:
    """The zero-argument coroutine function to call for ``fun``: ``async def f()``, or
    ``async def f(app)`` (as Faust allows), given ``app``."""
    if not inspect.iscoroutinefunction(fun):
        raise ConfigurationError(f"{where}: {fun!r} must be an async function (async def)")
    required = [
        p
        for p in inspect.signature(fun).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not required:
        return cast(TimerFunction, fun)
    if len(required) == 1:
        return cast(TimerFunction, functools.partial(fun, app))
    raise ConfigurationError(
        f"{where}: {fun.__qualname__} takes {len(required)} arguments; it is called with "
        "none, or with the app"
    )


def check_on_error(on_error: str, where: str) -> OnTimerError:
    if on_error not in ON_ERROR_POLICIES:
        raise ConfigurationError(f"{where}: on_error must be 'stop' or 'skip', got {on_error!r}")
    return cast(OnTimerError, on_error)


def should_run(on_leader: bool, leading: bool) -> bool:
    """Whether a timer runs at this tick here: every worker runs it, or only the leader."""
    return leading or not on_leader
