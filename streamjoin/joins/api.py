"""Declared joins: decorators that wire the pure join core into agents, tables and topics.

* stream-stream (windowed): ``@app.join(left_topic, right_topic, window=..., grace=...)``
  runs one agent over both inputs (partition p of each read in timestamp order, so
  stream time advances the same way whatever the fetch order) with a join buffer (a
  table with a changelog, so a join survives crashes and moves with its partition)
  and calls the decorated function for every joined (or, for left/outer joins,
  unmatched) pair; with ``close_idle_after=``, the windows of a partition whose input
  stopped close on wall-clock time (see :mod:`streamjoin.joins.idle`), their unmatched
  results sent with the commit;
* stream-table: ``@app.join(stream_topic, table)`` enriches each event with the
  table's value for its key: for a topic table, as of the event's timestamp (the
  table's agent reads the stream too, in timestamp order with the table's topic);
* table-table: ``@app.join(left_table, right_table)`` maintains the join of two
  topic-backed tables as a table and emits every change.

Declaring a join declares its co-partition group (inputs and buffers); inputs with
different partition counts are rejected at startup (see ``App.group_by`` to
repartition one side).
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from streamjoin.agents import ON_ERROR_CHOICES
from streamjoin.context import EventContext, OutgoingRecord, current_event
from streamjoin.errors import (
    ArgumentTypeError,
    ConfigurationError,
    InternalError,
    JoinError,
    TableAccessError,
)
from streamjoin.events import Event
from streamjoin.global_tables import GlobalTable
from streamjoin.joins.core import JoinOutput, JoinSpec, StreamStreamJoin
from streamjoin.joins.enrich import JoinFunction, TableEnricher, handle_batches
from streamjoin.joins.foreign_key_api import ForeignKeyDeclarations, declare_foreign_key_join
from streamjoin.joins.global_join import GlobalJoinDeclarations, declare_global_join
from streamjoin.joins.idle import IdleClock
from streamjoin.joins.results import PLAIN_RESULTS as _PLAIN_RESULTS
from streamjoin.joins.run_state import JoinPartition, JoinStats
from streamjoin.stream import INTERNAL_AGENT_BATCH, Stream
from streamjoin.tables import Table
from streamjoin.topics import Topic

if TYPE_CHECKING:
    from streamjoin.state.table_partition import TablePartition

log = logging.getLogger("streamjoin.joins")

How = Literal["inner", "left", "outer"]
TimestampExtractor = Callable[[Event], int]


def _ms(value: timedelta | int | float) -> int:
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def _idle_ms(join: str, value: timedelta | float) -> int:
    """``close_idle_after=`` in milliseconds: a timedelta or a number of seconds (a
    wall-clock bound, in the unit of ``App(commit_interval=...)``)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"join {join!r}: close_idle_after= is a timedelta or a number of seconds, got {value!r}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(
            f"join {join!r}: close_idle_after= must be a positive duration, got {value!r}"
        )
    return max(1, round(seconds * 1000))


@dataclass(frozen=True, slots=True)
class _Ready:
    """A join function's result, computed but not yet sent."""

    value: Any


async def _call(fun: JoinFunction, key: Any, left: Any, right: Any) -> Any:
    result = fun(key, left, right)
    if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
        result = await result
    return result


class Declarations(Protocol):
    """What declaring a join needs from the App (the facade implements it)."""

    table_sources: dict[str, Topic]
    joins: dict[str, Any]

    def topic(self, name: str) -> Topic: ...

    def table(
        self, name: str, *, copartitioned_with: Any = (), value_serializer: Any = None
    ) -> Table: ...

    def agent(
        self, topic: Any, *, name: str | None = None, on_error: Any = "stop"
    ) -> Callable[[Any], Any]: ...

    def attach_reader(self, table: Table, topic: Topic) -> None: ...

    def on_table_update(self, table: Table, listener: Callable[[Any], Awaitable[None]]) -> None: ...

    def read_in_order(
        self,
        table: Table,
        stream: Topic,
        handler: Callable[[Event], Awaitable[object] | None],
        *,
        join: str,
        on_error: Any,
    ) -> bool: ...


@dataclass(eq=False)
class StreamStreamJoinDecl:
    """A declared windowed join of two co-partitioned streams."""

    name: str
    left: Topic
    right: Topic
    spec: JoinSpec
    buffer: Table
    output: Topic | None
    fun: JoinFunction
    left_timestamp: TimestampExtractor | None = None
    right_timestamp: TimestampExtractor | None = None
    #: close the windows of a partition that received nothing for this long (wall clock;
    #: None: only records move stream time)
    close_idle_after_ms: int | None = None
    #: what a failing join function does to an idle close's result (as for events: "stop"
    #: fails the commit, else it is logged and skipped: there is no record to dead-letter)
    on_error: Literal["stop", "skip", "dead_letter"] = "stop"
    #: the wall clock idleness is measured with, in seconds (monotonic; tests replace it)
    clock: Callable[[], float] = time.monotonic

    def handle(self, side: Literal["left", "right"], event: Event) -> Awaitable[None] | None:
        """Join one event: None when done, or what is left to await (an async join function,
        an output waiting for room); most events need no coroutine."""
        context = current_event.get()
        if context is None:
            raise TableAccessError(f"join {self.name!r}: join sides run inside agents")
        record = context.record
        if record.key is None:
            log.warning("join %s: %s has no key; it cannot join", self.name, event.position)
            return None
        extractor = self.left_timestamp if side == "left" else self.right_timestamp
        timestamp = extractor(event) if extractor is not None else event.timestamp
        part = context.task.joins.get(self.name)
        if part is None:
            part = context.task.joins[self.name] = self._new_partition(context)
            self._counters(context)  # listed (monitor, join_stats) from the first event on
        core = part.core
        stats = core.stats
        late, beyond_grace = stats.late, stats.beyond_grace
        outputs = core.process_record(
            side, record.key, record.value or b"", timestamp, event.offset
        )
        if stats.late != late or stats.beyond_grace != beyond_grace:
            counters = self._counters(context)
            dropped = stats.late != late
            counters.late += stats.late - late
            counters.beyond_grace += stats.beyond_grace - beyond_grace
            what = "late and dropped" if dropped else "beyond the grace period"
            stream_time = core.stream_time_ms
            part.late_events.note(
                (event.topic, dropped),
                lambda: (
                    f"join {self.name}: {event.position} (event time {timestamp}) is {what}; "
                    f"stream time of partition {event.partition} is {stream_time} (more are "
                    "counted and logged once per 30 s)"
                ),
                lambda count, seconds: (
                    f"join {self.name}: {count} more events {what} in the last "
                    f"{seconds:.0f} s on {event.topic}[{event.partition}]"
                ),
            )
        if outputs:
            return self._emit(outputs, self._counters(context))
        return None

    def _counters(self, context: EventContext) -> JoinStats:
        """This worker's counters of this join."""
        counters = context.join_stats.get(self.name)
        if counters is None:
            counters = context.join_stats[self.name] = self._run_counters()
        return counters

    def _run_counters(self) -> JoinStats:
        """This worker's counters of this join, as reached outside events (idle closes):
        the same object the events count into."""
        run_stats = self.buffer.link.join_stats
        counters = run_stats.get(self.name)
        if counters is None:
            counters = run_stats[self.name] = JoinStats()
        return counters

    def __post_init__(self) -> None:
        #: a coroutine function's result is awaited without asking (most join functions)
        self._is_async = inspect.iscoroutinefunction(self.fun)
        #: where a task keeps the part of this join that a flush made before any event
        #: reached the partition (close_idle_after); its first event adopts it, so that
        #: the per-event path never checks for one
        self._made_by_flush = f"\x00{self.name} (made by a flush)"

    def _new_partition(self, context: EventContext) -> JoinPartition:
        """The task's part of this join: a core over its buffer partition (made once per
        task)."""
        view = context.table_partition(self.buffer.name)
        if view is None:
            raise ConfigurationError(
                f"join {self.name!r}: its buffer is not in the task of "
                f"{context.record.topic}[{context.record.partition}]"
            )
        if self.close_idle_after_ms is None:
            return JoinPartition(self._core(view))
        made = context.task.joins.pop(self._made_by_flush, None)
        if made is not None:
            return made  # (its counters are this worker's: see _run_counters)
        return self._idle_closing_partition(view, self._counters(context))

    def partition_for_flush(self, view: TablePartition) -> None:
        """Before a flush of the buffer partition ``view`` (``close_idle_after``): make its
        task's part of this join if no event did yet, so that a partition idle since it was
        assigned (its input stopped before a restart or a rebalance) closes too."""
        tables = self.buffer.link.tables
        task = None if tables is None else tables.active_task(self.buffer.name, view.partition)
        if (
            task is not None
            and self.name not in task.joins
            and self._made_by_flush not in task.joins
            and task.tables.get(self.buffer.name) is view
        ):
            part = self._idle_closing_partition(view, self._run_counters())
            task.joins[self._made_by_flush] = part

    def _idle_closing_partition(self, view: TablePartition, counters: JoinStats) -> JoinPartition:
        """A part of this join whose windows also close while its partition is idle."""
        idle_after_ms = self.close_idle_after_ms
        if idle_after_ms is None:
            raise InternalError(f"join {self.name!r} has no close_idle_after")
        made: list[JoinPartition] = []
        # Registered before the core registers its own hook (which writes its metadata):
        # the stream time and buffer an idle close changes go into the same flush.
        view.before_take(lambda: self._close_idle(made[0], view, counters))
        core = self._core(view)
        idle = IdleClock(
            idle_after_ms,
            now_ms=self._now_ms(),
            processed=core.stats.processed,
            stream_time_ms=core.stream_time_ms,
        )
        made.append(JoinPartition(core, idle))
        return made[0]

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _core(self, view: TablePartition) -> StreamStreamJoin:
        """The join core over the buffer partition ``view`` (it reads the buffer now)."""
        core = StreamStreamJoin(self.spec, view)
        if core.stats.leftovers_dropped:
            log.warning(
                "join %s: buffer partition %d held %d events below its expiry hint, written "
                "after its metadata (a late flush of a worker that had lost the partition); "
                "dropped without output: their inputs were processed since, or are replayed",
                self.name,
                view.partition,
                core.stats.leftovers_dropped,
            )
        return core

    def _close_idle(self, part: JoinPartition, view: TablePartition, counters: JoinStats) -> None:
        """At a flush of the buffer partition: if the partition has been idle long enough,
        advance its stream time (see :class:`IdleClock`) and queue the results of the
        windows that closed to be sent with this flush (inside the transaction under
        exactly-once)."""
        idle, core = part.idle, part.core
        if part.idle_failure is not None:
            # An earlier idle close failed after its windows closed (in memory): no flush of
            # this partition may make that durable without its results.
            raise part.idle_failure
        if idle is None:
            return
        target = idle.tick(self._now_ms(), core.stats.processed, core.stream_time_ms)
        if target is None:
            return
        outputs = core.advance(target)
        if not outputs:
            return
        try:
            records = self._closed_records(outputs, counters)
        except Exception as exc:
            part.idle_failure = exc
            raise
        for record in records:
            view.emit(record)
        log.debug(
            "join %s: %s idle for %d ms; stream time advanced to %d, %d unmatched results",
            self.name,
            view,
            self._now_ms() - idle.idle_since_ms,
            target,
            len(outputs),
        )

    def _closed_records(
        self, outputs: list[JoinOutput], counters: JoinStats
    ) -> list[OutgoingRecord]:
        """The join function's results for ``outputs`` (no await: this runs inside a
        flush), encoded for the output topic."""
        key_loads = self.left.key_codec.loads
        left_loads, right_loads = self.left.value_codec.loads, self.right.value_codec.loads
        output = self.output
        records: list[OutgoingRecord] = []
        for out in outputs:
            key = key_loads(out.key)
            left = left_loads(out.left) if out.left is not None else None
            right = right_loads(out.right) if out.right is not None else None
            try:
                result = self.fun(key, left, right)
                if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()  # (a coroutine never awaited would warn)
                    raise JoinError(
                        f"join {self.name!r}: its function returned an awaitable for an idle "
                        "close; with close_idle_after= it must return its result directly"
                    )
                if result is not None and output is not None:
                    records.append(
                        (
                            output.name,
                            output.key_codec.dumps(key),
                            output.value_codec.dumps(result),
                            None,
                            (),
                            out.timestamp_ms,
                        )
                    )
            except Exception:
                if self.on_error == "stop":
                    raise
                log.exception(
                    "join %s: the join function failed on an unmatched result closed on an "
                    "idle partition (key %r); skipped (on_error=%r)",
                    self.name,
                    key,
                    self.on_error,
                )
                continue
            counters.emitted += 1
            counters.idle_emitted += 1
        return records

    def _emit(self, outputs: list[JoinOutput], counters: JoinStats) -> Awaitable[None] | None:
        """Call the join function on each result (in order) and send what it returns; None
        when all of it is done, else a coroutine that does the rest from the first result
        that needs an await."""
        if self._is_async:
            return self._emit_from(outputs, 0, counters, None)
        key_loads = self.left.key_codec.loads
        left_loads, right_loads = self.left.value_codec.loads, self.right.value_codec.loads
        fun, output = self.fun, self.output
        key_bytes: bytes | None = None
        key: Any = None
        for index, out in enumerate(outputs):
            if out.key != key_bytes:  # an event's matches share its key: decoded once
                key_bytes, key = out.key, key_loads(out.key)
            left = left_loads(out.left) if out.left is not None else None
            right = right_loads(out.right) if out.right is not None else None
            result = fun(key, left, right)
            if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
                return self._emit_from(outputs, index, counters, result)
            if result is not None and output is not None:
                at = out.timestamp_ms
                if output.try_send(key=key, value=result, timestamp_ms=at) is None:
                    return self._emit_from(outputs, index, counters, _Ready(result))
            counters.emitted += 1
        return None

    async def _emit_from(
        self,
        outputs: list[JoinOutput],
        start: int,
        counters: JoinStats,
        first: Awaitable[Any] | _Ready | None,
    ) -> None:
        """:meth:`_emit` from ``outputs[start]`` on, awaiting where needed; ``first`` is that
        output's result if the caller already has it (awaitable or ready to send)."""
        key_loads = self.left.key_codec.loads
        left_loads, right_loads = self.left.value_codec.loads, self.right.value_codec.loads
        fun, output, is_async = self.fun, self.output, self._is_async
        for index in range(start, len(outputs)):
            out = outputs[index]
            key = key_loads(out.key)
            declined = False  # try_send declined this result already
            if index == start and first is not None:
                declined = isinstance(first, _Ready)
                result = first.value if isinstance(first, _Ready) else await first
            else:
                left = left_loads(out.left) if out.left is not None else None
                right = right_loads(out.right) if out.right is not None else None
                result = (
                    await fun(key, left, right) if is_async else await _call(fun, key, left, right)
                )
            if result is not None and output is not None:
                at = out.timestamp_ms
                if declined or output.try_send(key=key, value=result, timestamp_ms=at) is None:
                    await output.send(key=key, value=result, timestamp_ms=at)
            counters.emitted += 1


@dataclass(frozen=True)
class StreamTableJoinDecl:
    """A declared join of a stream with a table (kept for the Spark twin and tooling; the
    worker runs it through the topic table's agent or an agent of its own)."""

    name: str
    stream: Topic
    table: Table
    #: the topic the table is read from (None: a table written by agents)
    table_source: Topic | None
    how: How
    output: Topic | None
    fun: JoinFunction


@dataclass(frozen=True)
class TableTableJoinDecl:
    """A declared join of two topic tables, kept as the table ``result``."""

    name: str
    left: Table
    right: Table
    left_source: Topic
    right_source: Topic
    result: Table
    how: How
    output: Topic | None
    fun: JoinFunction


def declare_join(
    app: Declarations,
    left: Topic | Table,
    right: Topic | Table | GlobalTable,
    *,
    window: timedelta | int | None = None,
    grace: timedelta | int = 0,
    how: How = "inner",
    output: Topic | str | None = None,
    name: str | None = None,
    left_timestamp: TimestampExtractor | None = None,
    right_timestamp: TimestampExtractor | None = None,
    on_error: Literal["stop", "skip", "dead_letter"] = "stop",
    close_idle_after: timedelta | float | None = None,
    foreign_key: Callable[[Any], Any] | None = None,
    key: Callable[[Event], Any] | None = None,
) -> Callable[[JoinFunction], JoinFunction]:
    """The implementation of :meth:`App.join`; see its docstring."""
    out_topic = app.topic(output) if isinstance(output, str) else output

    def register(fun: JoinFunction) -> JoinFunction:
        join_name = name or fun.__name__
        if on_error not in ON_ERROR_CHOICES:
            raise ConfigurationError(
                f"join {join_name!r}: on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}"
            )
        if close_idle_after is not None and not (
            isinstance(left, Topic) and isinstance(right, Topic)
        ):
            raise ConfigurationError(
                f"join {join_name!r}: close_idle_after= closes the windows of a stream-stream "
                "join on an idle partition; a join with a table has no windows to close"
            )
        if isinstance(right, GlobalTable):
            if not isinstance(left, Topic):
                raise ConfigurationError(
                    f"join {join_name!r}: a global table is joined with a stream (topic), "
                    f"got {type(left).__name__}"
                )
            declare_global_join(
                cast("GlobalJoinDeclarations", app),
                join_name,
                left,
                right,
                key,
                how,
                out_topic,
                fun,
                on_error,
            )
            return fun
        if key is not None:
            raise ConfigurationError(
                f"join {join_name!r}: key= picks the row of a global table "
                "(app.join(stream, app.global_table(...), key=...)); this join has none"
            )
        if foreign_key is not None:
            if not (isinstance(left, Table) and isinstance(right, Table)):
                raise ConfigurationError(
                    f"join {join_name!r}: foreign_key= joins two tables (app.topic_table); "
                    f"got ({type(left).__name__}, {type(right).__name__})"
                )
            declare_foreign_key_join(
                cast("ForeignKeyDeclarations", app),
                join_name,
                left,
                right,
                foreign_key,
                how,
                out_topic,
                fun,
                on_error,
            )
        elif isinstance(left, Topic) and isinstance(right, Topic):
            if window is None:
                raise ConfigurationError(f"join {join_name!r}: a stream-stream join needs window=")
            idle_ms = None
            if close_idle_after is not None:
                idle_ms = _idle_ms(join_name, close_idle_after)
                if how == "inner":
                    raise ConfigurationError(
                        f"join {join_name!r}: close_idle_after= emits the unmatched results of "
                        "a left or outer join on an idle partition; an inner join emits "
                        "nothing when a window closes"
                    )
                if inspect.iscoroutinefunction(fun):
                    raise ConfigurationError(
                        f"join {join_name!r}: with close_idle_after= the join function is also "
                        "called inside a commit, where nothing can be awaited: make it a plain "
                        "function (def, not async def)"
                    )
            _stream_stream(
                app,
                join_name,
                left,
                right,
                JoinSpec(_ms(window), _ms(grace), how),
                out_topic,
                fun,
                left_timestamp,
                right_timestamp,
                on_error,
                idle_ms,
            )
        elif isinstance(left, Topic) and isinstance(right, Table):
            _stream_table(app, join_name, left, right, how, out_topic, fun, on_error)
        elif isinstance(left, Table) and isinstance(right, Table):
            _table_table(app, join_name, left, right, how, out_topic, fun, on_error)
        else:
            raise ArgumentTypeError(
                "app.join takes (topic, topic), (topic, table) or (table, table); "
                f"got ({type(left).__name__}, {type(right).__name__})"
            )
        return fun

    return register


def _stream_stream(
    app: Declarations,
    name: str,
    left: Topic,
    right: Topic,
    spec: JoinSpec,
    output: Topic | None,
    fun: JoinFunction,
    left_ts: TimestampExtractor | None,
    right_ts: TimestampExtractor | None,
    on_error: Literal["stop", "skip", "dead_letter"],
    close_idle_after_ms: int | None = None,
) -> StreamStreamJoinDecl:
    buffer = app.table(f"{name}-buffer", copartitioned_with=[left, right], value_serializer="raw")
    decl = StreamStreamJoinDecl(
        name,
        left,
        right,
        spec,
        buffer,
        output,
        fun,
        left_ts,
        right_ts,
        close_idle_after_ms=close_idle_after_ms,
        on_error=on_error,
    )
    if close_idle_after_ms is not None:
        buffer.before_flush = decl.partition_for_flush
    app.joins[name] = decl

    # One agent over both inputs: partition p of each arrives in one stream, in
    # timestamp order, so stream time advances the same way whatever the fetch order.
    left_name = left.name

    async def run(stream: Stream) -> None:
        handle = decl.handle
        async for batch in stream.take(INTERNAL_AGENT_BATCH, per_event_errors=True):
            for event in batch:
                pending = handle("left" if event.topic == left_name else "right", event)
                if pending is not None:
                    await pending

    app.agent([left, right], name=name, on_error=on_error)(run)
    return decl


def _stream_table(
    app: Declarations,
    name: str,
    stream: Topic,
    table: Table,
    how: How,
    output: Topic | None,
    fun: JoinFunction,
    on_error: Literal["stop", "skip", "dead_letter"],
) -> None:
    if how == "outer":
        raise ConfigurationError(f"join {name!r}: a stream-table join is inner or left, not outer")
    app.attach_reader(table, stream)
    source = app.table_sources.get(table.name)
    app.joins[name] = StreamTableJoinDecl(name, stream, table, source, how, output, fun)
    handler = TableEnricher(table, how == "inner", fun, output)
    # A topic table's own agent reads the stream too: rows and events in one timestamp order.
    if app.read_in_order(table, stream, handler, join=name, on_error=on_error):
        return

    # A table written by agents: nothing orders its writes against the stream.
    async def run(events: Stream) -> None:
        await handle_batches(events, handler)

    app.agent(stream, name=f"{name}.stream", on_error=on_error)(run)


def _table_table(
    app: Declarations,
    name: str,
    left: Table,
    right: Table,
    how: How,
    output: Topic | None,
    fun: JoinFunction,
    on_error: Literal["stop", "skip", "dead_letter"],
) -> None:
    left_source = app.table_sources.get(left.name)
    right_source = app.table_sources.get(right.name)
    if left_source is None or right_source is None:
        raise ConfigurationError(
            f"join {name!r}: a table-table join needs tables read from topics "
            "(declare them with app.topic_table(topic))"
        )
    # each side's agent reads the other side's table: co-partition them all
    app.attach_reader(left, right_source)
    app.attach_reader(right, left_source)
    result = app.table(name, copartitioned_with=[left_source, right_source])
    app.joins[name] = TableTableJoinDecl(
        name, left, right, left_source, right_source, result, how, output, fun
    )

    def present(value: Any) -> bool:
        return value is not None

    async def recompute(key: Any) -> None:
        lv, rv = left.get(key), right.get(key)
        keep = (
            (present(lv) and present(rv))
            if how == "inner"
            else present(lv)
            if how == "left"
            else present(lv) or present(rv)
        )
        joined = await _call(fun, key, lv, rv) if keep else None
        previous = result.get(key)
        if joined == previous:
            return
        if joined is None:
            if key in result:
                del result[key]
        else:
            result[key] = joined
        if output is not None:
            await output.send(key=key, value=joined)

    for table in (left, right):
        app.on_table_update(table, recompute)
