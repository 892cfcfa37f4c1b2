"""What an agent iterates: its events, one at a time (the runtime feeds it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol

from streamjoin.events import Event


class EventSource(Protocol):
    """The runtime side of a stream: hands out the next event once the previous one is done."""

    def next_event(self) -> Awaitable[Event]: ...


class Stream:
    """``async for event in stream`` yields :class:`Event`; ``stream.items()`` (key, value).

    Asking for the next event marks the previous one processed: it is committed once
    the records sent while processing it are acknowledged (at-least-once).
    """

    __slots__ = ("_source",)

    def __init__(self, source: EventSource) -> None:
        self._source = source

    def __aiter__(self) -> Stream:
        return self

    def __anext__(self) -> Awaitable[Event]:
        # the source's awaitable itself, not a coroutine wrapping it: one frame less per event
        return self._source.next_event()

    async def items(self) -> AsyncIterator[tuple[Any, Any]]:
        async for event in self:
            yield event.key, event.value
