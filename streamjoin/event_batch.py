"""A batch of events handed out by ``stream.take()``, iterated per event.

Compiled with mypyc (:mod:`streamjoin.compiled`): iterating a batch is on every batched
agent's per-event path, the framework's joins included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from streamjoin.events import Event

__all__ = ["CurrentEvent", "EventBatch"]


class CurrentEvent(Protocol):
    """What a batch moves from event to event as it is iterated (the runtime's context of
    the event being processed: tables and ``current_record()`` read its record)."""

    record: Any


class EventBatch:
    """Events of one task (one partition of each input), handed out together by
    :meth:`Stream.take`.

    Iterating the batch makes each event in turn the current one: a table read or write, a
    windowed table's window and ``current_record()`` inside the loop see that event, as in
    ``async for event in stream``. The whole batch counts as processed when the agent asks
    for the next batch.
    """

    __slots__ = ("current", "events", "records")

    def __init__(self, events: list[Event], records: list[Any], current: CurrentEvent):
        #: the events and their records, read as they are by the framework's joins, which
        #: walk a batch themselves (making each record current as iterating does)
        self.events = events
        self.records = records
        self.current = current

    def __len__(self) -> int:
        return len(self.events)

    def __bool__(self) -> bool:
        return bool(self.events)

    def __iter__(self) -> Iterator[Event]:
        current = self.current
        for record, event in zip(self.records, self.events, strict=True):
            current.record = record
            yield event

    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` of each event (each made current in turn, as by iterating)."""
        for event in self:
            yield event.key, event.value

    def __repr__(self) -> str:
        return f"<EventBatch of {len(self.events)} events>"
