"""What keeps a topic-backed table (``app.topic_table``) up to date, and in step with the
streams joined with it.

The table's source topic and every stream joined with the table (stream-table joins) are
read by ONE agent, partition by partition, in timestamp order (an aligned group, with the
source first on equal timestamps). So a stream event is enriched with the row of its key
as of its own timestamp (the latest row at or before it), whatever the fetch order: on a
backlog, rows are not overtaken by the events that need them, and an event older than its
row does not see it. One agent also means one writer of the table.

That order cannot fix a stream record that is out of order within its own partition (its
timestamp is older than records before it): it is read after rows newer than itself. A
versioned table (``history_ms=``) answers it anyway: its join looks the row up as of the
record's timestamp (:mod:`streamjoin.versioned_tables`), as the Spark backfill does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streamjoin.agents import OnError
from streamjoin.codecs import RawCodec, StrCodec
from streamjoin.context import current_event
from streamjoin.errors import ConfigurationError
from streamjoin.events import Event
from streamjoin.joins.enrich import TableEnricher
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.tables import Table
from streamjoin.topics import Topic
from streamjoin.versioned_tables import VersionedTable

__all__ = ["TopicTableFeed"]

#: called with each key written to the table (table-table joins recompute it)
UpdateListener = Callable[[Any], Awaitable[None]]
#: a stream-table join's work for one event of its stream: None when it is done, or what
#: is left to await (most events need no coroutine)
EventHandler = Callable[[Event], Awaitable[object] | None]


@dataclass(eq=False)
class TopicTableFeed:
    """A topic-backed table's agent: materializes the source's records into the table and
    hands each joined stream's events to its joins, in one timestamp order."""

    table: Table
    source: Topic
    listeners: list[UpdateListener] = field(default_factory=list)
    #: stream topic name -> the topic and the (join name, handler) pairs reading it
    streams: dict[str, Topic] = field(default_factory=dict)
    readers: dict[str, list[tuple[str, EventHandler]]] = field(default_factory=dict)
    #: the error policy of the joins (they share this agent, so they must agree)
    on_error: OnError = "stop"

    @property
    def agent_name(self) -> str:
        return f"{self.table.name}.materialize"

    @property
    def joins(self) -> list[str]:
        return [join for handlers in self.readers.values() for join, _ in handlers]

    def add_reader(
        self, join: str, stream: Topic, handler: EventHandler, on_error: OnError
    ) -> None:
        """Let ``join`` enrich ``stream`` from this table, in timestamp order with its rows."""
        if self.readers and on_error != self.on_error:
            raise ConfigurationError(
                f"join {join!r}: on_error={on_error!r}, but join(s) "
                f"{', '.join(map(repr, self.joins))} of the same table {self.table.name!r} have "
                f"on_error={self.on_error!r}; the joins of a topic table run in one agent (its "
                f"{self.agent_name!r}, which reads the table's topic and the streams in "
                "timestamp order): give them the same on_error"
            )
        self.on_error = on_error
        self.streams[stream.name] = stream
        self.readers.setdefault(stream.name, []).append((join, handler))

    def __post_init__(self) -> None:
        #: the record's own bytes are written (no encode of the value just decoded): a
        #: plain table, whose key bytes are the record's whenever they decode (raw and str
        #: keys; JSON keys are encoded again, canonically, as lookups encode them)
        self._raw_writes = type(self.table) is Table and isinstance(
            self.table.key_codec, RawCodec | StrCodec
        )

    async def apply(self, event: Event) -> None:
        """Write one source record to the table (a null value deletes the key)."""
        table = self.table
        if self._raw_writes:
            context = current_event.get()
            state = None if context is None else context.table_partition(table.name)
            if state is not None:
                record = context.record  # type: ignore[union-attr]
                key, value = record.key, record.value
                if key is not None:
                    if value is not None:
                        state.put(key, value)
                    elif state.lookup(key) is not None:
                        state.delete(key)
                    for listener in self.listeners:
                        await listener(event.key)
                    return
        if event.value is None:
            if isinstance(table, VersionedTable):
                table.delete(event.key)  # a version even if absent now: a late delete
            elif event.key in table:
                del table[event.key]
        else:
            table[event.key] = event.value
        for listener in self.listeners:
            await listener(event.key)

    async def run(self, stream: Stream) -> None:
        source = self.source.name
        readers = self.readers
        async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
            events = batch.events
            records = batch.records
            current = batch.current
            end = len(events)
            i = 0
            while i < end:
                event = events[i]
                topic = event.topic
                handlers = readers.get(topic)
                if topic != source and handlers is not None and len(handlers) == 1:
                    enricher = handlers[0][1]
                    if isinstance(enricher, TableEnricher):
                        # a run of one stream's events, enriched together (see enrich_run)
                        run_end = i + 1
                        while run_end < end and events[run_end].topic == topic:
                            run_end += 1
                        await enricher.enrich_run(batch, i, run_end)
                        i = run_end
                        continue
                current.record = records[i]  # (what iterating the batch does)
                i += 1
                if topic == source:
                    await self.apply(event)
                if handlers is not None:
                    for _, handler in handlers:
                        pending = handler(event)
                        if pending is not None:
                            await pending
