"""Declared joins: decorators that wire the pure join core into agents, tables and topics.

* stream-stream (windowed): ``@app.join(left_topic, right_topic, window=..., grace=...)``
  runs one agent per side over a shared join buffer (a table with a changelog, so a
  join survives crashes and moves with its partition) and calls the decorated
  function for every joined (or, for left/outer joins, unmatched) pair;
* stream-table: ``@app.join(stream_topic, table)`` enriches each event with the
  table's current value for its key;
* table-table: ``@app.join(left_table, right_table)`` maintains the join of two
  topic-backed tables as a table and emits every change.

Declaring a join declares its co-partition group (inputs and buffers); inputs with
different partition counts are rejected at startup (see ``App.group_by`` to
repartition one side).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from streamjoin.errors import ArgumentTypeError, InvalidJoinSpec, TableAccessError
from streamjoin.events import Event
from streamjoin.joins.core import JoinInput, JoinOutput, JoinSpec, StreamStreamJoin
from streamjoin.runtime.streams import Stream, current_record
from streamjoin.tables import Table
from streamjoin.topics import Topic

if TYPE_CHECKING:
    from streamjoin.app import App

log = logging.getLogger("streamjoin.joins")

How = Literal["inner", "left", "outer"]
JoinFunction = Callable[[Any, Any, Any], Any]
TimestampExtractor = Callable[[Event], int]


def _ms(value: timedelta | int | float) -> int:
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


async def _call(fun: JoinFunction, key: Any, left: Any, right: Any) -> Any:
    result = fun(key, left, right)
    if inspect.isawaitable(result):
        result = await result
    return result


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
    emitted: int = 0
    #: inputs dropped because their window had closed / accepted beyond the grace period
    late: int = 0
    beyond_grace: int = 0
    _cores: dict[int, StreamStreamJoin] = field(default_factory=dict, repr=False)

    async def handle(self, side: Literal["left", "right"], event: Event) -> None:
        record = current_record()
        if record is None:
            raise TableAccessError("join sides run inside agents")
        if record.key is None:
            log.warning("join %s: %s has no key; it cannot join", self.name, event.position)
            return
        extractor = self.left_timestamp if side == "left" else self.right_timestamp
        timestamp = extractor(event) if extractor is not None else event.timestamp
        core = self._core(event.partition)
        stats = core.stats
        late, beyond_grace = stats.late, stats.beyond_grace
        outputs = core.process(
            JoinInput(side, record.key, record.value or b"", timestamp, event.offset)
        )
        if stats.late != late or stats.beyond_grace != beyond_grace:
            dropped = stats.late != late
            self.late += stats.late - late
            self.beyond_grace += stats.beyond_grace - beyond_grace
            log.warning(
                "join %s: %s (event time %d) is %s; stream time of partition %d is %s",
                self.name,
                event.position,
                timestamp,
                "late and dropped" if dropped else "beyond the grace period",
                event.partition,
                core.stream_time_ms,
            )
        for out in outputs:
            await self._emit(out)

    def _core(self, partition: int) -> StreamStreamJoin:
        """The join core over the buffer's partition (kept: all its state is in the view)."""
        core = self._cores.get(partition)
        if core is None or partition not in self.buffer.ready:
            # the view checks that the partition is active (and restored) here
            core = self._cores[partition] = StreamStreamJoin(self.spec, self.buffer.view(partition))
        return core

    async def _emit(self, out: JoinOutput) -> None:
        key = self.left.key_codec.loads(out.key)
        left = self.left.value_codec.loads(out.left) if out.left is not None else None
        right = self.right.value_codec.loads(out.right) if out.right is not None else None
        result = await _call(self.fun, key, left, right)
        if result is not None and self.output is not None:
            await self.output.send(key=key, value=result, timestamp_ms=out.timestamp_ms)
        self.emitted += 1


def declare_join(
    app: App,
    left: Topic | Table,
    right: Topic | Table,
    *,
    window: timedelta | int | None = None,
    grace: timedelta | int = 0,
    how: How = "inner",
    output: Topic | str | None = None,
    name: str | None = None,
    left_timestamp: TimestampExtractor | None = None,
    right_timestamp: TimestampExtractor | None = None,
    on_error: Literal["stop", "skip", "dead_letter"] = "stop",
) -> Callable[[JoinFunction], JoinFunction]:
    """The implementation of :meth:`App.join`; see its docstring."""
    out_topic = app.topic(output) if isinstance(output, str) else output

    def register(fun: JoinFunction) -> JoinFunction:
        join_name = name or fun.__name__
        if isinstance(left, Topic) and isinstance(right, Topic):
            if window is None:
                raise InvalidJoinSpec(f"join {join_name!r}: a stream-stream join needs window=")
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
    app: App,
    name: str,
    left: Topic,
    right: Topic,
    spec: JoinSpec,
    output: Topic | None,
    fun: JoinFunction,
    left_ts: TimestampExtractor | None,
    right_ts: TimestampExtractor | None,
    on_error: Literal["stop", "skip", "dead_letter"],
) -> StreamStreamJoinDecl:
    buffer = app.table(f"{name}-buffer", copartitioned_with=[left, right], value_serializer="raw")
    decl = StreamStreamJoinDecl(name, left, right, spec, buffer, output, fun, left_ts, right_ts)
    app.joins[name] = decl

    # One agent over both inputs: partition p of each arrives in one stream, in
    # timestamp order, so stream time advances the same way whatever the fetch order.
    async def run(stream: Stream) -> None:
        async for event in stream:
            await decl.handle("left" if event.topic == left.name else "right", event)

    app.agent([left, right], name=name, on_error=on_error)(run)
    return decl


def _stream_table(
    app: App,
    name: str,
    stream: Topic,
    table: Table,
    how: How,
    output: Topic | None,
    fun: JoinFunction,
    on_error: Literal["stop", "skip", "dead_letter"],
) -> None:
    if how == "outer":
        raise InvalidJoinSpec(f"join {name!r}: a stream-table join is inner or left, not outer")
    app.attach_reader(table, stream)

    async def enrich(events: Stream) -> None:
        async for event in events:
            current = table.get(event.key)
            if current is None and how == "inner":
                continue
            result = await _call(fun, event.key, event.value, current)
            if result is not None and output is not None:
                await output.send(key=event.key, value=result, timestamp_ms=event.timestamp)

    app.agent(stream, name=f"{name}.stream", on_error=on_error)(enrich)


def _table_table(
    app: App,
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
        raise InvalidJoinSpec(
            f"join {name!r}: a table-table join needs tables read from topics "
            "(declare them with app.topic_table(topic))"
        )
    # each side's agent reads the other side's table: co-partition them all
    app.attach_reader(left, right_source)
    app.attach_reader(right, left_source)
    result = app.table(name, copartitioned_with=[left_source, right_source])

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
