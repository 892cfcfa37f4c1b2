"""What an agent iterates: its events one at a time, or in batches (the runtime feeds it)."""

from __future__ import annotations

import math
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
)
from typing import Any, Protocol, TypeVar, overload

from streamjoin.errors import ConfigurationError
from streamjoin.event_batch import EventBatch
from streamjoin.events import Event
from streamjoin.stream_ops import Chain, echo_events, events_of, values_of
from streamjoin.topics import Topic

U = TypeVar("U")

#: how many events the framework's own agents (joins, topic tables, group_by) take at a
#: time: what is buffered, up to this many. Batches save the runtime's work per event
#: (hand-out, acknowledgement); they take them with ``per_event_errors=True``, so an error
#: still gets the agent's policy for its event alone.
INTERNAL_AGENT_BATCH = 64

__all__ = ["INTERNAL_AGENT_BATCH", "EventBatch", "EventSource", "Stream"]


class EventSource(Protocol):
    """The runtime side of a stream: hands out the next event (or batch) once the previous
    one is done."""

    def next_event(self) -> Awaitable[Event]: ...

    def events(self) -> AsyncIterator[Event]: ...

    def next_batch(
        self, max_events: int, within: float, per_event_errors: bool
    ) -> Awaitable[EventBatch]: ...


class Stream:
    """``async for event in stream`` yields :class:`Event`; ``stream.items()`` (key, value);
    ``stream.take(n, within=s)`` batches of events.

    Asking for the next event marks the previous one processed: it is committed once
    the records sent while processing it are acknowledged (at-least-once).
    """

    __slots__ = ("_source",)

    def __init__(self, source: EventSource) -> None:
        self._source = source

    def __aiter__(self) -> AsyncIterator[Event]:
        # the source's own iterator: it hands out buffered events without a coroutine each
        return self._source.events()

    def __anext__(self) -> Awaitable[Event]:
        # the source's awaitable itself, not a coroutine wrapping it: one frame less per event
        return self._source.next_event()

    async def items(self) -> AsyncIterator[tuple[Any, Any]]:
        async for event in self:
            yield event.key, event.value

    # -- stateless operators (streamjoin.stream_ops): nothing here runs per event unless
    # the agent iterates a chain they build

    def values(self) -> Chain[Any]:
        """The events' values, as Faust streams iterate them; a :class:`Chain` whose
        ``filter``/``map``/``flat_map``/``enumerate``/``echo`` work on values."""
        return Chain(lambda: values_of(self))

    def filter(
        self, pred: Callable[[Event], bool] | Callable[[Event], Awaitable[bool]]
    ) -> Chain[Event]:
        """The events for which ``pred`` (sync or async) is true (on values:
        ``stream.values().filter(pred)``)."""
        return Chain(lambda: events_of(self)).filter(pred)

    @overload
    def map(self, fn: Callable[[Event], Awaitable[U]]) -> Chain[U]: ...

    @overload
    def map(self, fn: Callable[[Event], U]) -> Chain[U]: ...

    def map(self, fn: Callable[[Event], Any]) -> Chain[Any]:
        """``fn(event)`` (sync or async) for each event."""
        return Chain(lambda: events_of(self)).map(fn)

    @overload
    def flat_map(self, fn: Callable[[Event], AsyncIterable[U]]) -> Chain[U]: ...

    @overload
    def flat_map(self, fn: Callable[[Event], Iterable[U]]) -> Chain[U]: ...

    def flat_map(self, fn: Callable[[Event], Any]) -> Chain[Any]:
        """Each item of ``fn(event)`` (an iterable or an async iterable)."""
        return Chain(lambda: events_of(self)).flat_map(fn)

    def enumerate(self, start: int = 0) -> Chain[tuple[int, Event]]:
        """``(n, event)``, n counting from ``start``."""
        return Chain(lambda: events_of(self)).enumerate(start)

    def echo(self, *topics: Topic) -> Chain[Event]:
        """Forward each event (its key and value) to every one of ``topics``, then yield
        it; the sends belong to the event (its acknowledgement or transaction)."""
        return echo_events(self, topics)

    def take(
        self, max_events: int, within: float = 0.0, *, per_event_errors: bool = False
    ) -> AsyncIterator[EventBatch]:
        """Batches of up to ``max_events`` events of one task: ``async for batch in
        stream.take(500, within=1.0)``.

        A batch holds what is buffered now; with ``within`` > 0 it waits up to that many
        seconds for more to fill it (never for the first event). A batch never mixes tasks
        (partitions): a record of another task ends it. Asking for the next batch marks the
        whole batch processed (committed once its sends are acknowledged).

        If processing raises, the agent's ``on_error`` applies to the whole batch: ``stop``
        commits none of it, ``skip`` counts all of it processed, ``dead_letter`` sends every
        one of its records to the dead-letter topic (work done after the loop, such as a bulk
        write, never happened for any of them). With ``per_event_errors=True``, for loops
        whose every effect is made per event (the framework's joins use it), the policy
        applies to the event being iterated then, alone: the events before it count as
        processed and the events after it are handed out again.
        """
        if type(max_events) is not int or max_events < 1:
            raise ConfigurationError(f"take(): max_events must be an int >= 1, got {max_events!r}")
        if not isinstance(within, int | float) or not 0 <= within < math.inf:
            raise ConfigurationError(
                f"take(): within must be a finite number of seconds >= 0, got {within!r}"
            )
        if not isinstance(per_event_errors, bool):
            raise ConfigurationError(
                f"take(): per_event_errors must be True or False, got {per_event_errors!r}"
            )
        return _Batches(self._source, max_events, float(within), per_event_errors)


class _Batches:
    """The async iterator :meth:`Stream.take` returns."""

    __slots__ = ("_max", "_per_event", "_source", "_within")

    def __init__(
        self, source: EventSource, max_events: int, within: float, per_event_errors: bool
    ) -> None:
        self._source = source
        self._max = max_events
        self._within = within
        self._per_event = per_event_errors

    def __aiter__(self) -> _Batches:
        return self

    def __anext__(self) -> Awaitable[EventBatch]:
        return self._source.next_batch(self._max, self._within, self._per_event)
