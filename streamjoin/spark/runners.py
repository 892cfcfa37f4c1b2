"""Join runners: the pure per-partition part of a backfill (no Spark, no Kafka).

A Spark task hands a runner one join partition's records, already in the order a
worker would have processed them, and gets the encoded outputs back. Keeping this
free of PySpark lets the same code be tested against a brute-force oracle and
against the workers without a Spark session.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from streamjoin.codecs import Codec
from streamjoin.joins.core import (
    MAX_TIMESTAMP_MS,
    JoinInput,
    JoinOutput,
    JoinSpec,
    StreamStreamJoin,
    TableTableJoin,
)
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.partitioner import partition_for_key

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.joins.api import (
        StreamStreamJoinDecl,
        StreamTableJoinDecl,
        TableTableJoinDecl,
    )
    from streamjoin.topics import Topic

__all__ = [
    "JoinRunner",
    "OutputRecord",
    "Record",
    "Runner",
    "StreamTableRunner",
    "TableTableRunner",
]

#: one input record as a runner takes it: ``(side, key, value, timestamp_ms)``; ``value`` None
#: is a null value (a table side's tombstone)
Record = tuple[str, bytes, bytes | None, int]


@dataclass(frozen=True)
class OutputRecord:
    """One encoded result: ``partition`` of the output topic (-1: no key), the join's timestamp."""

    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    #: record headers (an aggregation's window bounds; joins send none)
    headers: tuple[tuple[str, bytes], ...] = ()


class _Caller:
    """Calls a join function the way a worker does (awaited when it returns an awaitable) and
    encodes its result for the output topic."""

    fun: Callable[[Any, Any, Any], Any]
    out_key_codec: Codec
    out_value_codec: Codec
    out_partitions: int
    stats: dict[str, int]
    _loop: asyncio.AbstractEventLoop | None

    def _call(self, key: Any, left: Any, right: Any) -> Any:
        result = self.fun(key, left, right)
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(_await(result))
        return result

    def _output(self, key: Any, value: Any, timestamp_ms: int) -> OutputRecord:
        """``value`` None is written as a null value (a tombstone)."""
        key_bytes = self.out_key_codec.dumps(key)
        partition = (
            partition_for_key(key_bytes, self.out_partitions) if key_bytes is not None else -1
        )
        self.stats["outputs"] += 1
        encoded = None if value is None else self.out_value_codec.dumps(value)
        return OutputRecord(partition, key_bytes, encoded, timestamp_ms)

    def _close_loop(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None


@dataclass
class JoinRunner(_Caller):
    """A stream-stream join partition (picklable, no App inside): the workers' join core over
    an in-memory buffer, fed in event-time order."""

    #: ties at equal timestamps: left side first (a fixed, documented order)
    side_rank: ClassVar[dict[str, int]] = {"left": 0, "right": 1}

    spec: JoinSpec
    fun: Callable[[Any, Any, Any], Any]
    key_codec: Codec
    left_codec: Codec
    right_codec: Codec
    out_key_codec: Codec
    out_value_codec: Codec
    out_partitions: int
    close_windows_at_end: bool = False
    stats: dict[str, int] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_join(
        cls,
        config: AppConfig,
        decl: StreamStreamJoinDecl,
        out_partitions: int,
        close: bool = False,
    ) -> JoinRunner:
        out_key, out_value = _output_codecs(config, decl.output, decl.left.key_codec)
        return cls(
            decl.spec,
            decl.fun,
            decl.left.key_codec,
            decl.left.value_codec,
            decl.right.value_codec,
            out_key,
            out_value,
            out_partitions,
            close,
        )

    def run(
        self,
        records: Iterable[Record],
        *,
        stream_time_at_end_ms: int | None = None,
    ) -> Iterator[OutputRecord]:
        """Join one partition's ``(side, key, value, timestamp_ms)`` records, given in processing
        order; yields encoded outputs. ``stats`` counts records, outputs and late records.

        ``stream_time_at_end_ms``: advance stream time there once the records are done. A
        backfill that splits a join partition by key gives each part only some of the
        partition's records, so without it a part would close fewer windows than the
        whole partition does (its own largest timestamp is smaller)."""
        core = StreamStreamJoin(self.spec, MemoryKeyValueView())
        seqs = {"left": 0, "right": 0}
        self.stats = {"records": 0, "outputs": 0, "late": 0}
        self._close_loop()
        try:
            for side, key, value, timestamp_ms in records:
                self.stats["records"] += 1
                seq = seqs[side]
                seqs[side] = seq + 1
                # a null value joins as empty bytes, as in the workers
                event = JoinInput(side, key, value or b"", timestamp_ms, seq)  # type: ignore[arg-type]
                for out in core.process(event):
                    yield from self._emit(out)
            end = MAX_TIMESTAMP_MS if self.close_windows_at_end else stream_time_at_end_ms
            if end is not None:
                for out in core.advance(end):
                    yield from self._emit(out)
        finally:
            self.stats["late"] = core.stats.late
            self._close_loop()

    def _emit(self, out: JoinOutput) -> Iterator[OutputRecord]:
        key = self.key_codec.loads(out.key)
        left = self.left_codec.loads(out.left) if out.left is not None else None
        right = self.right_codec.loads(out.right) if out.right is not None else None
        result = self._call(key, left, right)
        if result is not None:
            yield self._output(key, result, out.timestamp_ms)


@dataclass
class StreamTableRunner(_Caller):
    """A stream-table join partition: each stream record ("left") joins its key's row of the
    table ("right", the topic table's source records) as of the record's timestamp.

    Fed in timestamp order with the table's records first on equal timestamps, this is what
    a worker emits: the topic table's agent reads the source and the stream as one aligned
    group, source first on ties (:mod:`streamjoin.topic_tables`). Rows are kept decoded, as
    the worker's table returns them; a null value (or one decoding to None) deletes the row.
    Stream records before ``emit_from_ms`` are not joined (the table still gets every row).
    """

    #: ties at equal timestamps: the table's row first, then the stream's record
    side_rank: ClassVar[dict[str, int]] = {"right": 0, "left": 1}

    how: Literal["inner", "left"]
    fun: Callable[[Any, Any, Any], Any]
    stream_key_codec: Codec
    stream_value_codec: Codec
    table_key_codec: Codec
    table_value_codec: Codec
    out_key_codec: Codec
    out_value_codec: Codec
    out_partitions: int
    emit_from_ms: int | None = None
    stats: dict[str, int] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_join(
        cls,
        config: AppConfig,
        decl: StreamTableJoinDecl,
        out_partitions: int,
        emit_from_ms: int | None = None,
    ) -> StreamTableRunner:
        out_key, out_value = _output_codecs(config, decl.output, decl.stream.key_codec)
        return cls(
            decl.how,  # type: ignore[arg-type]  # outer is refused at declaration
            decl.fun,
            decl.stream.key_codec,
            decl.stream.value_codec,
            decl.table.key_codec,
            decl.table.value_codec,
            out_key,
            out_value,
            out_partitions,
            emit_from_ms,
        )

    def run(
        self, records: Iterable[Record], *, stream_time_at_end_ms: int | None = None
    ) -> Iterator[OutputRecord]:
        """Join one partition's records, given in processing order; yields encoded outputs.
        (``stream_time_at_end_ms`` is for windowed joins: a table join closes nothing.)"""
        rows: dict[bytes, Any] = {}
        table_key = self.table_key_codec
        table_value = self.table_value_codec
        stream_key = self.stream_key_codec
        stream_value = self.stream_value_codec
        emit_from = self.emit_from_ms
        inner = self.how == "inner"
        self.stats = {"records": 0, "outputs": 0, "late": 0}
        self._close_loop()
        try:
            for side, key, value, timestamp_ms in records:
                self.stats["records"] += 1
                if side == "right":
                    row_key = _key_bytes(table_key, table_key.loads(key))
                    _apply_row(rows, row_key, value, table_value)
                    continue
                if emit_from is not None and timestamp_ms < emit_from:
                    continue
                decoded_key = stream_key.loads(key)
                current = rows.get(_key_bytes(table_key, decoded_key))
                if current is None and inner:
                    continue
                event_value = None if value is None else stream_value.loads(value)
                result = self._call(decoded_key, event_value, current)
                if result is not None:
                    yield self._output(decoded_key, result, timestamp_ms)
        finally:
            self._close_loop()


@dataclass
class TableTableRunner(_Caller):
    """A table-table join partition: the changes of the joined table, one per update of
    either side that changes the join function's result (None: the row vanished).

    Fed in timestamp order (left first on equal timestamps), this is the sequence a worker
    emits when it applies both tables' records in that order; each change carries the
    timestamp of the record that caused it (a worker stamps it with the wall clock).
    ``final_only``: only the last change of each key, and nothing for keys whose row is
    gone at the end. Changes caused by records before ``emit_from_ms`` update the state
    but are not emitted.
    """

    side_rank: ClassVar[dict[str, int]] = {"left": 0, "right": 1}

    how: Literal["inner", "left", "outer"]
    fun: Callable[[Any, Any, Any], Any]
    left_key_codec: Codec
    left_value_codec: Codec
    right_key_codec: Codec
    right_value_codec: Codec
    #: the joined table's value codec: the worker compares a result with the stored one
    result_codec: Codec
    out_key_codec: Codec
    out_value_codec: Codec
    out_partitions: int
    final_only: bool = False
    emit_from_ms: int | None = None
    stats: dict[str, int] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_join(
        cls,
        config: AppConfig,
        decl: TableTableJoinDecl,
        out_partitions: int,
        final_only: bool = False,
        emit_from_ms: int | None = None,
    ) -> TableTableRunner:
        out_key, out_value = _output_codecs(config, decl.output, decl.left.key_codec)
        return cls(
            decl.how,
            decl.fun,
            decl.left.key_codec,
            decl.left.value_codec,
            decl.right.key_codec,
            decl.right.value_codec,
            decl.result.value_codec,
            out_key,
            out_value,
            out_partitions,
            final_only,
            emit_from_ms,
        )

    def run(
        self, records: Iterable[Record], *, stream_time_at_end_ms: int | None = None
    ) -> Iterator[OutputRecord]:
        """Join one partition's records, given in processing order; yields encoded outputs.
        (``stream_time_at_end_ms`` is for windowed joins: a table join closes nothing.)"""
        join = TableTableJoin(self.how)
        tables: dict[str, dict[bytes, Any]] = {"left": {}, "right": {}}
        codecs = {
            "left": (self.left_key_codec, self.left_value_codec),
            "right": (self.right_key_codec, self.right_value_codec),
        }
        left_key, right_key = self.left_key_codec, self.right_key_codec
        results: dict[bytes, Any] = {}
        #: final_only: each key's last change (decoded key, result or None, timestamp)
        last: dict[bytes, tuple[Any, Any, int]] = {}
        result_codec, emit_from = self.result_codec, self.emit_from_ms
        self.stats = {"records": 0, "outputs": 0, "late": 0}
        self._close_loop()
        try:
            for side, key, value, timestamp_ms in records:
                self.stats["records"] += 1
                key_codec, value_codec = codecs[side]
                decoded_key = key_codec.loads(key)
                _apply_row(tables[side], _key_bytes(key_codec, decoded_key), value, value_codec)
                left_row = tables["left"].get(_key_bytes(left_key, decoded_key))
                right_row = tables["right"].get(_key_bytes(right_key, decoded_key))
                keep = join.has_row(
                    None if left_row is None else b"", None if right_row is None else b""
                )
                joined = self._call(decoded_key, left_row, right_row) if keep else None
                result_key = _key_bytes(left_key, decoded_key)
                previous = results.get(result_key)
                if joined == previous:
                    continue
                if joined is None:
                    results.pop(result_key, None)
                else:
                    # as stored and read back by the worker's joined table
                    stored = result_codec.dumps(joined)
                    results[result_key] = None if stored is None else result_codec.loads(stored)
                if emit_from is not None and timestamp_ms < emit_from:
                    continue
                if self.final_only:
                    last[result_key] = (decoded_key, joined, timestamp_ms)
                    continue
                yield self._output(decoded_key, joined, timestamp_ms)
            if self.final_only:
                for decoded, joined, timestamp_ms in last.values():
                    if joined is not None:
                        yield self._output(decoded, joined, timestamp_ms)
        finally:
            self._close_loop()


Runner = JoinRunner | StreamTableRunner | TableTableRunner


def _output_codecs(
    config: AppConfig, output: Topic | None, default_key: Codec
) -> tuple[Codec, Codec]:
    """Key and value codecs of a join's results: its output topic's, else the input's key
    codec and the app's value codec (a join without an output topic)."""
    if output is not None:
        return output.key_codec, output.value_codec
    return default_key, config.value_codec


def _apply_row(rows: dict[bytes, Any], row_key: bytes, value: bytes | None, codec: Codec) -> None:
    """A topic table's rule for one source record: a null value, or one decoding to None,
    deletes the row; anything else replaces it (decoded, as the table returns it)."""
    row = None if value is None else codec.loads(value)
    if row is None:
        rows.pop(row_key, None)
    else:
        rows[row_key] = row


def _key_bytes(codec: Codec, key: Any) -> bytes:
    """``key`` as a table would store it (records without a key never reach a runner)."""
    return codec.dumps(key) or b""


async def _await(awaitable: Any) -> Any:
    return await awaitable
