"""Stateless stream operators: ``stream.values().filter(f).map(g).enumerate()``.

A :class:`Chain` is what an agent iterates instead of its stream: each step pulls the next
event from the stream only when the agent asks for the next item, so the guarantees of the
plain loop hold: an event the filter drops (or a ``flat_map`` turns into nothing) counts as
processed when the next one is asked for, what a step sends (``echo``) joins the event's
acknowledgement or transaction, events of a partition stay in order, and an exception in a
step's function gets the agent's ``on_error`` for the event being processed.

Inside, a chain carries ``(event, item)`` pairs, so a step late in the chain still knows
the event its item came from (``echo`` sends with the event's key).

A chain is built once per iteration and holds its own state (``enumerate``'s count): the
runtime restarts an agent function after an error it skipped, and the function builds a
new chain (the count starts again).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar, cast, overload

from streamjoin.errors import ConfigurationError, MissingFieldError
from streamjoin.events import Event
from streamjoin.topics import Topic

T = TypeVar("T")
U = TypeVar("U")

#: the source of a chain: its items, each with the event it came from
Pairs = AsyncIterator[tuple[Event, T]]


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` returns something to await (decided once, at declaration:
    no check per event)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (a callable object's async __call__)
    )


def _callable(fn: object, operator: str) -> Callable[..., Any]:
    if not callable(fn):
        raise ConfigurationError(
            f"stream.{operator}(): expected a function, got {type(fn).__qualname__} {fn!r}"
        )
    return fn


def _check_topics(topics: tuple[object, ...]) -> None:
    if not topics:
        raise ConfigurationError("stream.echo(): name at least one topic")
    for topic in topics:
        if not isinstance(topic, Topic):
            raise ConfigurationError(
                f"stream.echo(): expected Topic objects (app.topic(...)), got "
                f"{type(topic).__qualname__} {topic!r}"
            )


class Chain(Generic[T]):
    """Items of a stream through stateless steps; ``async for item in chain``.

    Built by :meth:`Stream.values() <streamjoin.stream.Stream.values>` (or a Stream's own
    operators, over events); each operator returns a new chain, the original is unchanged.
    """

    __slots__ = ("_pairs",)

    def __init__(self, pairs: Callable[[], Pairs[T]]) -> None:
        self._pairs = pairs

    def __aiter__(self) -> AsyncIterator[T]:
        return _items(self._pairs())

    def filter(self, pred: Callable[[T], bool] | Callable[[T], Awaitable[bool]]) -> Chain[T]:
        """Only the items for which ``pred`` (sync or async) is true; a dropped item's event
        counts as processed when the next item is asked for."""
        fn = _callable(pred, "filter")
        upstream = self._pairs
        if is_async(fn):
            return Chain(lambda: _filter_async(upstream(), fn))
        return Chain(lambda: _filter(upstream(), fn))

    @overload
    def map(self, fn: Callable[[T], Awaitable[U]]) -> Chain[U]: ...

    @overload
    def map(self, fn: Callable[[T], U]) -> Chain[U]: ...

    def map(self, fn: Callable[[T], Any]) -> Chain[Any]:
        """``fn(item)`` (sync or async) for each item."""
        step = _callable(fn, "map")
        upstream = self._pairs
        if is_async(step):
            return Chain(lambda: _map_async(upstream(), step))
        return Chain(lambda: _map(upstream(), step))

    @overload
    def flat_map(self, fn: Callable[[T], AsyncIterable[U]]) -> Chain[U]: ...

    @overload
    def flat_map(self, fn: Callable[[T], Iterable[U]]) -> Chain[U]: ...

    def flat_map(self, fn: Callable[[T], Any]) -> Chain[Any]:
        """Each item of ``fn(item)`` (an iterable, or an async generator): none, one or
        many items per event; the event counts as processed once the agent asks for the
        item after its last."""
        step = _callable(fn, "flat_map")
        upstream = self._pairs
        return Chain(lambda: _flat_map(upstream(), step))

    def enumerate(self, start: int = 0) -> Chain[tuple[int, T]]:
        """``(n, item)``, n counting from ``start`` (per chain: a restarted agent function
        counts again)."""
        if type(start) is not int:
            raise ConfigurationError(f"stream.enumerate(): start must be an int, got {start!r}")
        upstream = self._pairs
        return Chain(lambda: _enumerate(upstream(), start))

    def echo(self, *topics: Topic) -> Chain[T]:
        """Send each item to every one of ``topics`` (with its event's key), then yield it.

        The sends belong to the event: it is committed only once they are acknowledged
        (at-least-once), or they commit in its transaction (exactly-once)."""
        _check_topics(topics)
        upstream = self._pairs
        return Chain(lambda: _echo(upstream(), topics))


async def _items(pairs: Pairs[T]) -> AsyncIterator[T]:
    async for _, item in pairs:
        yield item


async def values_of(events: AsyncIterable[Event]) -> Pairs[Any]:
    """The source of :meth:`Stream.values`: each event with its value."""
    async for event in events:
        yield event, event.value


async def events_of(events: AsyncIterable[Event]) -> Pairs[Event]:
    """The source of a Stream's own operators: each event with itself."""
    async for event in events:
        yield event, event


async def _filter(pairs: Pairs[T], pred: Callable[[T], Any]) -> Pairs[T]:
    async for pair in pairs:
        if pred(pair[1]):
            yield pair


async def _filter_async(pairs: Pairs[T], pred: Callable[[T], Awaitable[Any]]) -> Pairs[T]:
    async for pair in pairs:
        if await pred(pair[1]):
            yield pair


async def _map(pairs: Pairs[T], fn: Callable[[T], U]) -> Pairs[U]:
    async for event, item in pairs:
        yield event, fn(item)


async def _map_async(pairs: Pairs[T], fn: Callable[[T], Awaitable[U]]) -> Pairs[U]:
    async for event, item in pairs:
        yield event, await fn(item)


async def _flat_map(pairs: Pairs[T], fn: Callable[[T], Any]) -> Pairs[U]:
    async for event, item in pairs:
        out = fn(item)
        if isinstance(out, AsyncIterable):
            async for each in cast("AsyncIterable[U]", out):
                yield event, each
        elif isinstance(out, Iterable):
            for each in cast("Iterable[U]", out):
                yield event, each
        else:
            raise ConfigurationError(
                f"stream.flat_map(): the function must return an iterable or an async "
                f"iterable, got {type(out).__qualname__} {out!r}"
            )


async def _enumerate(pairs: Pairs[T], start: int) -> Pairs[tuple[int, T]]:
    n = start
    async for event, item in pairs:
        yield event, (n, item)
        n += 1


async def _echo(pairs: Pairs[T], topics: tuple[Topic, ...]) -> Pairs[T]:
    async for event, item in pairs:
        for topic in topics:
            await topic.send(key=event.key, value=item)
        yield event, item


async def _echo_events(pairs: Pairs[Event], topics: tuple[Topic, ...]) -> Pairs[Event]:
    async for pair in pairs:
        event = pair[1]
        for topic in topics:
            await topic.send(key=event.key, value=event.value)
        yield pair


def echo_events(events: AsyncIterable[Event], topics: tuple[Topic, ...]) -> Chain[Event]:
    """:meth:`Stream.echo`: forward each event's key and value to ``topics``, then yield
    the event."""
    _check_topics(topics)
    return Chain(lambda: _echo_events(events_of(events), topics))


def field_key(field: str, where: str) -> Callable[[Event], Any]:
    """The key function of ``group_by(topic, "field")``: the value's attribute (a dataclass,
    msgspec or pydantic record) or item (a JSON object) ``field``; a value without it is an
    error of its event naming ``where`` and the field (the agent's ``on_error`` applies)."""
    if not field.isidentifier():
        raise ConfigurationError(f"{where}: {field!r} is not a field name")

    def key(event: Event) -> Any:
        value = event.value
        if isinstance(value, dict):
            if field in value:
                return value[field]
        elif hasattr(value, field):
            return getattr(value, field)
        raise MissingFieldError(
            f"{where}: the value has no field {field!r} to group by: "
            f"{type(value).__qualname__} {value!r:.80}"
        )

    return key
