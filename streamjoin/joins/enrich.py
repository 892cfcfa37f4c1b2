"""An enriching join's work for one event: look the row up, call the join function, send
the result. The stream-table join and the stream-global-table join build a handler once
and call it for every event of their stream.

Compiled with mypyc (:mod:`streamjoin.compiled`): it is the per-event path of every
enrichment, and runs as native code from the batch loop (:func:`handle_batches`, or a
topic table's agent) to the result's send.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from streamjoin.events import Event
from streamjoin.joins.results import ResultSender
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.tables import Table
from streamjoin.topics import Topic
from streamjoin.versioned_tables import TOO_LATE, VersionedTable

__all__ = ["EventHandler", "JoinFunction", "global_enricher", "handle_batches", "table_enricher"]

#: ``fun(key, event value, row)``: the join's result (or an awaitable of it)
JoinFunction = Callable[[Any, Any, Any], Any]
#: one event's join: None when it is done, or what is left to await (most events need no
#: coroutine: only an async join function or an output without room)
EventHandler = Callable[[Event], Awaitable[object] | None]


def table_enricher(
    table: Table, inner: bool, fun: JoinFunction, output: Topic | None
) -> EventHandler:
    """A stream-table join's handler: the row of the event's key now, or, on a versioned
    table, as of the event's timestamp."""
    results = ResultSender(output)
    if isinstance(table, VersionedTable):
        versioned = table

        def enrich_as_of(event: Event) -> Awaitable[object] | None:
            # An event older than the table's history is dropped and counted
            # (``table.too_late``): its row may be purged, so no answer would be reliable.
            key = event.key
            current = versioned.lookup_for_join(key, event.timestamp)
            if current is TOO_LATE:
                versioned.count_too_late()
                return None
            if current is None and inner:
                return None
            return results.emit(event, fun(key, event.value, current))

        return enrich_as_of

    def enrich(event: Event) -> Awaitable[object] | None:
        key = event.key
        current = table.get(key)
        if current is None and inner:
            return None
        return results.emit(event, fun(key, event.value, current))

    return enrich


def global_enricher(
    lookup: Callable[[Any], Any],
    key: Callable[[Event], Any],
    inner: bool,
    fun: JoinFunction,
    output: Topic | None,
) -> EventHandler:
    """A stream-global-table join's handler: the row of ``key(event)`` in the local copy."""
    results = ResultSender(output)

    def enrich(event: Event) -> Awaitable[object] | None:
        row = lookup(key(event))
        if row is None and inner:
            return None
        return results.emit(event, fun(event.key, event.value, row))

    return enrich


async def handle_batches(events: Stream, handler: EventHandler) -> None:
    """An enriching join's agent: every event of its stream through ``handler``."""
    async for batch in events.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
        for event in batch:
            pending = handler(event)
            if pending is not None:
                await pending
