"""Aggregations declared on a stream: ``app.aggregate(topic, window=..., agg=...)``.

A declaration is a :class:`WindowedAggregation`: which topic (after an optional
re-keying through ``app.group_by``), which windows, which aggregator, where results go.
``app.aggregate`` makes from it

* an :class:`AggregateTable`: a windowed table holding each (key, window)'s aggregator
  *state* (what its changelog holds, so a moved or restored partition carries on) and
  showing its *result* to every reader (interactive queries, ``windows_of``,
  ``table[key]``);
* an agent (``<name>.aggregate``) that adds each record's value to the windows of its
  key and, with ``emit="update"`` and ``emit_to``, sends the new result of every window
  it changed.

Tumbling and hopping windows are the windowed table's own (``WindowedTable.update``,
with its late-record check and its ``emit="close"`` pass). Sliding and session windows
are applied by :mod:`streamjoin.state.aggregate_windows` (pure) to the same partition;
sliding windows also keep the key's recent records in a second table,
``<name>-records``. The per-window arithmetic is the aggregator's
(:mod:`streamjoin.aggregations`, pure), so a batch job can compute the same results
from the same pure parts; this module is the thin shell between them and the tables.

Result records are keyed by the aggregation's key; their value is
``{"start": ..., "end": ..., "value": <result>}`` and their headers carry
``window-start``/``window-end``, as a windowed table's final results do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Protocol, cast

from streamjoin.aggregations import Aggregator, StateCodec, aggregator_of
from streamjoin.codecs import Codec
from streamjoin.context import TaskScope, current_event
from streamjoin.errors import ConfigurationError, TableAccessError
from streamjoin.events import Event
from streamjoin.state import window_layout as layout
from streamjoin.state.aggregate_windows import (
    Changed,
    SessionAggregates,
    SlidingAggregates,
)
from streamjoin.state.table_partition import Emitted, TablePartition
from streamjoin.state.windows import (
    HoppingWindows,
    SessionWindows,
    SlidingWindows,
    TumblingWindows,
    WindowSpec,
)
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.tables import Table
from streamjoin.topics import Topic
from streamjoin.windowed import Emit, WindowCloseCallback, WindowedTable

__all__ = [
    "AggregateTable",
    "AggregationDeclarations",
    "DynamicWindows",
    "WindowedAggregation",
    "declare_aggregation",
    "window_result",
]

#: windows known from the key's records, not from a timestamp alone
DynamicWindows = SlidingWindows | SessionWindows
DynamicAggregates = SlidingAggregates | SessionAggregates


def window_result(start: int, end: int, result: Any) -> dict[str, Any]:
    """The value of one result record: the window and its result (keyed by the key)."""
    return {"start": start, "end": end, "value": result}


def window_headers(start: int, end: int) -> list[tuple[str, bytes]]:
    """The headers of one result record (as a windowed table's final results carry them)."""
    return [("window-start", b"%d" % start), ("window-end", b"%d" % end)]


@dataclass(eq=False)
class AggregateTable(WindowedTable):
    """The windowed table an aggregation keeps: states stored, results shown.

    Its value codec is a :class:`~streamjoin.aggregations.StateCodec`: the changelog and
    store hold the aggregator's states; ``value_codec.loads`` (what queries,
    ``windows_of`` and ``local_items`` decode with) gives results, and so do
    ``table[key]`` and ``get``. Only the aggregation writes it.
    """

    kind = "aggregation"
    aggregator: Aggregator | None = field(default=None, repr=False)
    #: sliding or session windows (None: tumbling or hopping, in ``windows``)
    dynamic: DynamicWindows | None = None
    #: sliding windows: the table keeping the key's recent records
    records: Table | None = field(default=None, repr=False)
    #: sliding windows: decodes a kept record's value (its topic's value codec)
    load_record_value: Callable[[bytes], Any] | None = field(default=None, repr=False)
    #: sliding or session windows with emit="close": where final results go
    final_to: Topic | None = None
    final_callback: WindowCloseCallback | None = field(default=None, repr=False)
    closes_dynamic: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        # ``update`` hands the stored *state* to the aggregation (results are for readers)
        self._load_value = self._state_codec().load_state

    def _state_codec(self) -> StateCodec:
        codec = self.value_codec
        if not isinstance(codec, StateCodec):
            raise ConfigurationError(f"aggregate table {self.name!r} needs a StateCodec")
        return codec

    def _spec(self) -> WindowSpec:
        if self.dynamic is not None:
            raise TableAccessError(
                f"aggregation {self.name!r} has {type(self.dynamic).__name__}: a time has no "
                "one window to read (Faust's relative_to_* views); use "
                "table.windows_with_ends(key, from_ms, to_ms)"
            )
        return super()._spec()

    @property
    def closes_windows(self) -> bool:
        return self.emit == "close" or self.closes_dynamic

    def __getitem__(self, key: Any) -> Any:
        if self.dynamic is not None:
            raise TableAccessError(
                f"aggregation {self.name!r} has {type(self.dynamic).__name__}: an event has "
                "no one window to read; use table.windows_of(key, from_ms, to_ms)"
            )
        raw = self._current_value(key)
        if raw is None:
            raise KeyError(key)
        return self.value_codec.loads(raw)

    def get(self, key: Any, default: Any = None) -> Any:
        if self.dynamic is not None:
            self[key]  # (raises, naming the problem)
        raw = self._current_value(key)
        return default if raw is None else self.value_codec.loads(raw)

    def window_end(self, start: int, raw: bytes) -> int:
        """The end of the stored window ``raw`` starting at ``start`` (sessions vary)."""
        spec = self.dynamic if self.dynamic is not None else self.windows
        size = getattr(spec, "size_ms", 0)
        return self._state_codec().window_end(start, raw, size)

    def windows_with_ends(self, key: Any, from_ms: int, to_ms: int) -> list[tuple[int, int, Any]]:
        """``(start, end, result)`` of ``key``'s windows starting in ``[from_ms, to_ms]``."""
        key_bytes = self._encode_key(key)
        view = self._state(key_bytes, writing=False)
        out = []
        for data_key, raw in view.scan(*layout.data_range(key_bytes, max(from_ms, 0), to_ms)):
            start = layout.split_data_key(data_key).time_ms
            out.append((start, self.window_end(start, raw), self.value_codec.loads(raw)))
        return out

    # ------------------------------------------------------------------ sliding and sessions

    def add_to_windows(self, event: Event, timestamp: int) -> list[Changed]:
        """Sliding or session windows: add the event's value to its key's windows; the
        windows changed (``(start, end, state)``, state None for a session merged away)."""
        context = current_event.get()
        if context is None:
            raise TableAccessError(f"aggregation {self.name!r} adds records inside its agent only")
        view = context.table_partition(self.name)
        if view is None:
            view = self._state(None, writing=False)  # (raises, naming the problem)
        part = self._dynamic_partition(context.task, view)
        key_bytes = self._encode_key(event.key)
        if isinstance(part, SessionAggregates):
            return part.add(key_bytes, timestamp, event.value)
        record = context.record
        value_bytes = record.value if record.value is not None else b""
        return part.add(key_bytes, timestamp, event.value, value_bytes, record.offset)

    def _dynamic_partition(self, task: TaskScope, view: TablePartition) -> DynamicAggregates:
        parts = cast(dict[str, Any], task.windows)  # (kept with the task's window partitions)
        part: DynamicAggregates | None = parts.get(self.name)
        if part is not None:
            return part
        spec, aggregator = self.dynamic, self.aggregator
        if aggregator is None or spec is None:
            raise ConfigurationError(f"aggregation {self.name!r} has no sliding or session spec")
        stats = self.registered_stats()
        on_close = self._dynamic_final if self.closes_dynamic else None
        if isinstance(spec, SessionWindows):
            part = SessionAggregates(
                self.name, spec, aggregator, view, on_close=on_close, stats=stats
            )
        else:
            records = None if self.records is None else task.tables.get(self.records.name)
            if records is None or self.load_record_value is None:
                raise TableAccessError(
                    f"aggregation {self.name!r}: its records table is not held with it"
                )
            part = SlidingAggregates(
                self.name,
                spec,
                aggregator,
                view,
                records,
                self.load_record_value,
                on_close=on_close,
                stats=stats,
            )
        parts[self.name] = part
        return part

    def partition_for_flush(self, view: TablePartition) -> None:
        if self.dynamic is None:
            super().partition_for_flush(view)
            return
        task = self._task_lacking_windows(view)
        if task is not None:
            self._dynamic_partition(task, view)

    def _dynamic_final(self, key_bytes: bytes, start: int, end: int, state: Any) -> Emitted | None:
        """A closed sliding window's or session's final result: to ``final_callback`` and
        the record for ``final_to``, as a closed window's of a windowed table."""
        aggregator = self.aggregator
        if aggregator is None:
            return None
        key, result = self.key_codec.loads(key_bytes), aggregator.result(state)
        return self._final_record(key, start, end, result, self.final_callback, self.final_to)

    def _final_value(self, start: int, end: int, value: Any) -> Any:
        return window_result(start, end, value)


@dataclass(eq=False)
class WindowedAggregation:
    """``app.aggregate``'s declaration: a plain value (no run-time state)."""

    name: str
    #: the topic aggregated (the repartition topic when ``key`` re-keys the stream)
    source: Topic
    table: AggregateTable
    aggregator: Aggregator
    window: WindowSpec | DynamicWindows
    emit: Emit = "update"
    emit_to: Topic | None = None
    #: the topic before re-keying, and the function that picked the new key
    original: Topic | None = None
    key: Callable[[Event], Any] | None = None
    timestamp: Callable[[Event], int] | None = None

    async def run(self, stream: Stream) -> None:
        """The agent: each record's value into the windows of its key (records with a
        null key or value are skipped, as Kafka Streams' aggregations do)."""
        add = self._add_dynamic if self.table.dynamic is not None else self._add_fixed
        async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
            for event in batch:
                if event.key is not None and event.value is not None:
                    await add(event)

    async def _add_fixed(self, event: Event) -> None:
        """Tumbling and hopping windows: through the windowed table's ``update``."""
        aggregator, value = self.aggregator, event.value
        changed: list[Any] = []

        def add(state: Any) -> Any:
            new = aggregator.add(aggregator.initial() if state is None else state, value)
            changed.append(new)
            return new

        table = self.table
        table.update(event.key, add)  # (the table leaves out the windows already closed)
        if self.emit_to is None or self.emit != "update" or not changed:
            return
        # update() went through the event's open windows, in order
        windows = table._event_partition().windows
        await self._send(
            event, [(s, e, state) for (s, e), state in zip(windows, changed, strict=True)]
        )

    def _event_time(self, event: Event) -> int:
        return event.timestamp if self.timestamp is None else self.timestamp(event)

    async def _add_dynamic(self, event: Event) -> None:
        changed = self.table.add_to_windows(event, self._event_time(event))
        if self.emit_to is not None and self.emit == "update" and changed:
            await self._send(event, changed)

    async def _send(self, event: Event, changed: list[Changed]) -> None:
        """emit="update": each changed window's new result (None: a session merged away)."""
        out = self.emit_to
        if out is None:
            return
        result = self.aggregator.result
        for start, end, state in changed:
            value = window_result(start, end, None if state is None else result(state))
            await out.send(
                key=event.key,
                value=value,
                headers=window_headers(start, end),
                timestamp_ms=event.timestamp,
            )


class AggregationDeclarations(Protocol):
    """What declaring an aggregation needs from the App (the facade implements it)."""

    tables: dict[str, Table]
    aggregations: dict[str, WindowedAggregation]

    def topic(self, name: str) -> Topic: ...

    def table(
        self,
        name: str,
        *,
        key_serializer: Any = None,
        value_serializer: Any = None,
        copartitioned_with: Any = (),
        window: Any = None,
    ) -> Table: ...

    def agent(
        self, topic: Any, *, name: str | None = None, on_error: Any = "stop"
    ) -> Callable[[Any], Any]: ...

    def group_by(
        self,
        topic: Topic | str,
        key: Callable[[Event], Any],
        *,
        name: str,
        partitions: int | None = None,
        key_serializer: str | Codec | type | None = None,
    ) -> Topic: ...


def declare_aggregation(
    app: AggregationDeclarations,
    topic: Topic | str,
    *,
    window: WindowSpec | DynamicWindows,
    agg: Aggregator | Mapping[str, Aggregator],
    name: str,
    key: Callable[[Event], Any] | None = None,
    key_serializer: str | Codec | type | None = None,
    partitions: int | None = None,
    emit: Emit = "update",
    emit_to: Topic | str | None = None,
    on_window_close: WindowCloseCallback | None = None,
    close_idle_after: timedelta | float | None = None,
    timestamp: Callable[[Event], int] | None = None,
    on_error: Any = "stop",
) -> AggregateTable:
    """The implementation of :meth:`App.aggregate <streamjoin.app.App.aggregate>`."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"an aggregation needs a name (a non-empty str), got {name!r}")
    where = f"aggregation {name!r}"
    if name in app.aggregations or name in app.tables:
        raise ConfigurationError(f"{where}: a table or aggregation {name!r} is declared already")
    if emit not in ("update", "close"):
        raise ConfigurationError(f"{where}: emit must be 'update' or 'close', got {emit!r}")
    fixed = isinstance(window, TumblingWindows | HoppingWindows)
    if not fixed and not isinstance(window, SlidingWindows | SessionWindows):
        raise ConfigurationError(
            f"{where}: window must be TumblingWindows, HoppingWindows, SlidingWindows or "
            f"SessionWindows (streamjoin.state.windows), got {window!r}"
        )
    if key is not None and not callable(key):
        raise ConfigurationError(f"{where}: key must be a function of the event, got {key!r}")
    if timestamp is not None and not callable(timestamp):
        raise ConfigurationError(
            f"{where}: timestamp must be a function of the event (ms), got {timestamp!r}"
        )
    if emit == "update" and (on_window_close is not None or close_idle_after is not None):
        raise ConfigurationError(
            f"{where}: on_window_close and close_idle_after apply with emit='close' only"
        )
    if emit == "close" and emit_to is None and on_window_close is None:
        raise ConfigurationError(
            f"{where}: emit='close' needs somewhere to put final results: emit_to=<topic> "
            "and/or on_window_close=<function(key, (start, end), value)>"
        )
    if not fixed and close_idle_after is not None:
        raise ConfigurationError(
            f"{where}: close_idle_after works with tumbling and hopping windows only (sliding "
            "and session windows close as records move stream time)"
        )
    aggregator = aggregator_of(agg)
    if isinstance(window, SessionWindows) and not aggregator.mergeable:
        raise ConfigurationError(
            f"{where}: session windows merge when a record bridges two sessions, and "
            f"{aggregator!r} cannot merge: give Reduce(fn, initial, merge=...)"
        )
    original = app.topic(topic) if isinstance(topic, str) else topic
    source = original
    if key is not None:
        source = app.group_by(
            original, key, name=name, partitions=partitions, key_serializer=key_serializer
        )
    elif key_serializer is not None or partitions is not None:
        raise ConfigurationError(
            f"{where}: key_serializer= and partitions= describe the repartition topic, "
            "which only key= makes"
        )
    results = app.topic(emit_to) if isinstance(emit_to, str) else emit_to
    codec = StateCodec(aggregator, with_end=isinstance(window, SessionWindows))
    options: dict[str, Any] = {}
    if fixed:
        options["window"] = window
        if timestamp is not None:
            options["timestamp"] = timestamp
        if emit == "close":
            options.update(
                emit="close",
                emit_to=results,
                on_window_close=on_window_close,
                close_idle_after=close_idle_after,
            )
    declared = app.table(
        name,
        key_serializer=source.key_codec,
        value_serializer=codec,
        copartitioned_with=source,
        **options,
    )
    settings = {f.name: getattr(declared, f.name) for f in fields(declared) if f.init}
    records: Table | None = None
    if isinstance(window, SlidingWindows):
        records = app.table(
            f"{name}-records",
            key_serializer=source.key_codec,
            value_serializer="raw",
            copartitioned_with=source,
        )
    # the same table, as the class that hands states to the aggregation and results to
    # readers (App.table builds a WindowedTable or a Table; every setting is kept)
    table = AggregateTable(
        **settings,
        aggregator=aggregator,
        dynamic=None if fixed else cast(DynamicWindows, window),
        records=records,
        load_record_value=source.value_codec.loads,
        final_to=None if fixed or emit != "close" else results,
        final_callback=None if fixed else on_window_close,
        closes_dynamic=not fixed and emit == "close",
    )
    app.tables[name] = table
    declaration = WindowedAggregation(
        name,
        source,
        table,
        aggregator,
        window,
        emit=emit,
        emit_to=results if emit == "update" else None,
        original=original if key is not None else None,
        key=key,
        timestamp=timestamp,
    )
    app.aggregations[name] = declaration
    app.agent(source, name=f"{name}.aggregate", on_error=on_error)(declaration.run)
    return table
