"""An enriching join's work for one event: look the row up, call the join function, send
the result. The stream-table join and the stream-global-table join build a handler once
and call it for every event of their stream.

Compiled with mypyc (:mod:`streamjoin.compiled`): it is the per-event path of every
enrichment, and runs as native code from the batch loop (:func:`handle_batches`, or a
topic table's agent) to the result's send.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Final

from streamjoin.context import current_event
from streamjoin.event_batch import EventBatch
from streamjoin.events import Event
from streamjoin.joins.results import PLAIN_RESULTS, ResultSender
from streamjoin.quick_sends import QuickOutput
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.tables import Table
from streamjoin.topics import Topic
from streamjoin.versioned_tables import TOO_LATE, VersionedTable

__all__ = [
    "EventHandler",
    "JoinFunction",
    "TableEnricher",
    "global_enricher",
    "handle_batches",
]

#: ``fun(key, event value, row)``: the join's result (or an awaitable of it)
JoinFunction = Callable[[Any, Any, Any], Any]
#: one event's join: None when it is done, or what is left to await (most events need no
#: coroutine: only an async join function or an output without room)
EventHandler = Callable[[Event], Awaitable[object] | None]

#: (``Final``: a C static when compiled, not a module dict lookup per use)
_CURRENT_EVENT: Final = current_event
_PLAIN_RESULTS: Final = PLAIN_RESULTS


class TableEnricher:
    """A stream-table join's handler: the row of the event's key now, or, on a versioned
    table, as of the event's timestamp.

    Called with one event (an :data:`EventHandler`), or given a run of a batch's events
    (:meth:`enrich_run`), which it walks itself.

    A run is one task's events, so the table's partition and the output's sender are
    found once for it, not for each event; each event is made the current one (its
    record is what ``current_record()`` and an error's policy see) before its row is
    read."""

    def __init__(self, table: Table, inner: bool, fun: JoinFunction, output: Topic | None):
        self.table = table
        self.inner = inner
        self.fun = fun
        self.output = output
        self.results = ResultSender(output)
        self.versioned: VersionedTable | None = table if isinstance(table, VersionedTable) else None
        #: a plain table (no subclass's own get), read with get_from in a run
        self.plain = type(table) is Table
        self.quick: QuickOutput | None = None if output is None else QuickOutput(output)

    def __call__(self, event: Event) -> Awaitable[object] | None:
        """One event's join: None when it is done, or what is left to await."""
        key = event.key
        versioned = self.versioned
        if versioned is not None:
            # An event older than the table's history is dropped and counted
            # (``table.too_late``): its row may be purged, so no answer would be reliable.
            current = versioned.lookup_for_join(key, event.timestamp)
            if current is TOO_LATE:
                versioned.count_too_late()
                return None
        else:
            current = self.table.get(key)
        if current is None and self.inner:
            return None
        return self.results.emit(event, self.fun(key, event.value, current))

    async def enrich_run(self, batch: EventBatch, start: int, end: int) -> None:
        """Join ``batch``'s events from ``start`` to ``end`` (excluded), in order, each
        made current in turn as iterating the batch does."""
        events = batch.events
        records = batch.records
        current = batch.current
        table = self.table
        output = self.output
        quick = self.quick
        inner = self.inner
        fun = self.fun
        i = start
        while i < end:
            state = table.event_partition() if self.plain else None
            context = _CURRENT_EVENT.get()
            if state is None or context is None:
                # a versioned or other table's own lookup, or an error to raise: per event
                current.record = records[i]
                pending = self(events[i])
                i += 1
                if pending is not None:
                    await pending
                continue
            ready = quick is not None and quick.ready()
            # From here to the next wait, the table's partition and the output's sender
            # found above serve every event.
            while i < end:
                event = events[i]
                current.record = records[i]
                i += 1
                key = event.key
                row = table.get_from(state, key)
                if row is None and inner:
                    continue
                result = fun(key, event.value, row)
                if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
                    pending = self.results.send(event, await result)
                    if pending is not None:
                        await pending
                    break  # (after a wait: found again)
                if result is None or output is None:
                    continue
                timestamp = event.timestamp
                if ready and type(timestamp) is int and timestamp >= 0:
                    sent = quick.send(key, result, timestamp)  # type: ignore[union-attr]
                    if sent is not None:
                        context.track_send(sent)
                        continue
                    await output.send(key=key, value=result, timestamp_ms=timestamp)
                    break
                pending = self.results.send(event, result)
                if pending is not None:
                    await pending
                    break


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
    """An enriching join's agent: every event of its stream through ``handler`` (a
    stream-table join's enricher walks each batch itself)."""
    async for batch in events.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
        if isinstance(handler, TableEnricher):
            await handler.enrich_run(batch, 0, len(batch.events))
            continue
        for event in batch:
            pending = handler(event)
            if pending is not None:
                await pending
