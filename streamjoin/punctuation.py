"""Punctuation per task: what ``@app.punctuate`` declares, what the function is given, and
when stream-time and wall-clock punctuations are due (no event loop, no clock of its own).

A punctuation is Kafka Streams' ``ProcessorContext.schedule``: a function called for each
task of an agent (partition *p* of its co-partition group, with that partition of every
table in the group) on the actor that processes the task's events, so it never runs
while one of them does, and its table writes and sends are part of the task's commit.

* ``stream_time``: when the task's stream time (the largest record timestamp the agent
  was handed for it) reaches a multiple of the interval, before the record that moved it
  there is processed; a jump over several multiples fires once, for the latest one.
* ``wall_clock``: every interval of wall-clock time per running task, records or not.

The runtime (:mod:`streamjoin.runtime.tasks.punctuation`) runs them; the arithmetic of
*when* is here, as functions of the time it is given.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from streamjoin.agents import Agent
from streamjoin.context import Delivery, Headers
from streamjoin.errors import ConfigurationError
from streamjoin.tables import Table
from streamjoin.topics import Topic

__all__ = [
    "PUNCTUATION_TYPES",
    "Punctuation",
    "PunctuationContext",
    "PunctuationFunction",
    "PunctuationType",
    "agent_punctuated",
    "interval_ms",
    "next_stream_due",
    "next_wall_clock_due",
]

PunctuationType = Literal["stream_time", "wall_clock"]
PUNCTUATION_TYPES: tuple[PunctuationType, ...] = ("stream_time", "wall_clock")

#: a task's stream time before its first record: the first record is due (as in Kafka
#: Streams, whose stream-time schedules start at 0 and fire as soon as there is data)
NOT_STARTED = -(2**63)


@dataclass(frozen=True, slots=True)
class PunctuationContext:
    """What a punctuation function is given: which task, which punctuation, what time.

    Inside the function the task's tables read and write the task's partition as they do
    in an agent (``table[key]``, ``table.local_items()``; windowed tables:
    ``windows_of(key, ...)`` and ``local_items(context.partition)``), and ``topic.send``
    (or :meth:`send`) sends records whose acknowledgement the task's commit waits for."""

    #: the punctuation's name (the function's qualified name unless given)
    name: str
    #: the agent whose task this is
    agent: str
    #: the task's partition (partition *p* of its co-partition group)
    partition: int
    #: ``"stream_time"`` or ``"wall_clock"``
    type: PunctuationType
    #: stream time: the multiple of the interval that was reached; wall clock: the wall
    #: clock when it ran (ms since the epoch)
    timestamp_ms: int
    #: stream time: the task's stream time that reached it (the record's timestamp); wall
    #: clock: None
    stream_time_ms: int | None = None

    async def send(
        self,
        topic: Topic,
        *,
        key: Any = None,
        value: Any = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Delivery:
        """``topic.send(...)`` with the record time defaulting to :attr:`timestamp_ms`
        (as Kafka Streams forwards a punctuator's records at the punctuation time)."""
        return await topic.send(
            key=key,
            value=value,
            headers=headers,
            partition=partition,
            timestamp_ms=self.timestamp_ms if timestamp_ms is None else timestamp_ms,
        )


#: ``def f(context)`` or ``async def f(context)``
PunctuationFunction = Callable[[PunctuationContext], Awaitable[None] | None]


@dataclass(frozen=True)
class Punctuation:
    """``fun`` called for each task of agent ``agent`` every ``interval_ms`` of stream or
    wall-clock time (``type``); errors follow the agent's ``on_error``."""

    name: str
    fun: PunctuationFunction
    agent: str
    interval_ms: int
    type: PunctuationType

    def __post_init__(self) -> None:
        if self.type not in PUNCTUATION_TYPES:
            raise ConfigurationError(
                f"punctuation {self.name!r}: type must be one of {PUNCTUATION_TYPES}, "
                f"got {self.type!r}"
            )
        if type(self.interval_ms) is not int or self.interval_ms < 1:
            raise ConfigurationError(
                f"punctuation {self.name!r}: the interval must be at least 1 ms, "
                f"got {self.interval_ms!r}"
            )


def interval_ms(every: timedelta | float | None, every_ms: int | None, where: str) -> int:
    """The interval in whole milliseconds, from exactly one of ``every`` (a ``timedelta``,
    or seconds as ``app.timer`` takes them) and ``every_ms`` (an int of milliseconds)."""
    if (every is None) == (every_ms is None):
        raise ConfigurationError(
            f"{where}: give the interval once, as every=timedelta(...) (or a number of "
            f"seconds) or as every_ms=<int milliseconds>; got every={every!r}, "
            f"every_ms={every_ms!r}"
        )
    if every_ms is not None:
        if type(every_ms) is not int or every_ms < 1:
            raise ConfigurationError(
                f"{where}: every_ms must be an int of milliseconds >= 1, got {every_ms!r}"
            )
        return every_ms
    if isinstance(every, timedelta):
        millis = every / timedelta(milliseconds=1)
    elif isinstance(every, int | float) and not isinstance(every, bool):
        millis = float(every) * 1000
    else:
        raise ConfigurationError(
            f"{where}: every must be a timedelta or a number of seconds, got {every!r}"
        )
    if not math.isfinite(millis) or millis < 1 or millis != int(millis):
        raise ConfigurationError(
            f"{where}: the interval must be a whole number of milliseconds, at least 1 ms; "
            f"got every={every!r}"
        )
    return int(millis)


def next_stream_due(stream_time_ms: int, interval: int) -> tuple[int, int]:
    """Stream time reached ``stream_time_ms`` and a punctuation was due: the boundary it
    fires for (the latest multiple of ``interval`` at or before it) and the stream time
    at which it is due next (the multiple after)."""
    boundary = stream_time_ms - stream_time_ms % interval
    return boundary, boundary + interval


def next_wall_clock_due(due_ms: int, now_ms: int, interval: int) -> int:
    """A wall-clock punctuation due at ``due_ms`` ran at ``now_ms``: when it is due next,
    on its own grid (``due_ms`` plus whole intervals) and after ``now_ms``; intervals
    missed while the task was busy are skipped, not run in a burst."""
    if now_ms < due_ms:
        return due_ms
    return due_ms + interval * ((now_ms - due_ms) // interval + 1)


def agent_punctuated(
    target: object,
    agents: Mapping[str, Agent],
    copartition_groups: Sequence[tuple[str, ...]],
    where: str,
) -> str:
    """The name of the agent whose tasks ``target`` names: the agent's function or name,
    or a topic or table that exactly one declared agent reads (a table: an agent reading
    a topic co-partitioned with it)."""
    if callable(target) and not isinstance(target, Topic | Table):
        found = [a.name for a in agents.values() if target in (a, a.fun)]
        if found:
            return found[0]
        raise ConfigurationError(
            f"{where}: {getattr(target, '__qualname__', target)!r} is not a declared agent "
            "(declare the agent with @app.agent first, then punctuate it)"
        )
    if isinstance(target, str) and target in agents:
        return target
    if isinstance(target, Table):
        group = next((g for g in copartition_groups if target.changelog.name in g), ())
        topics = set(group) - {target.changelog.name}
        what = f"table {target.name!r}"
    elif isinstance(target, Topic | str):
        name = target.name if isinstance(target, Topic) else target
        topics = {name}
        what = f"topic {name!r}"
    else:
        raise ConfigurationError(
            f"{where}: punctuate an agent (its function or name), a topic or a table; "
            f"got {target!r}"
        )
    readers = sorted(a.name for a in agents.values() if topics & {t.name for t in a.topics})
    if len(readers) != 1:
        raise ConfigurationError(
            f"{where}: {what} is read by "
            + (f"{len(readers)} agents ({', '.join(readers)})" if readers else "no agent yet")
            + ": name the agent to punctuate (its function or name), declared first"
        )
    return readers[0]
