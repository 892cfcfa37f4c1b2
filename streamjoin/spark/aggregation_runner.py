"""Aggregation runners: the pure per-partition part of an aggregation's backfill and bootstrap.

A Spark task hands :class:`AggregationRunner` one partition's records of the aggregation's
input topic, in the order the worker would have taken them, and gets back the results a
worker sends (``emit="update"``: every changed window; ``emit="close"``: each window's
final result) or the windowed table's state (the store a worker would hold). No Spark and
no Kafka here, so the same code is tested against the test driver without a session.

It is the worker's own code over an in-memory table partition, not a copy of it:

* tumbling and hopping windows: :class:`~streamjoin.state.window_partition.WindowPartition`
  (stream time, the late check, the close and expiry passes) and the per-event steps of
  :meth:`WindowedTable.update <streamjoin.windowed.WindowedTable.update>` (the event's
  windows, each window's state through the aggregator), in the shared window layout;
* sliding and session windows:
  :class:`~streamjoin.state.aggregate_windows.SlidingAggregates` and
  :class:`~streamjoin.state.aggregate_windows.SessionAggregates` themselves.

The partition is flushed every :attr:`AggregationRunner.flush_every` records and at the end,
as a worker flushes on each commit: the flush runs the close pass (final results) and the
expiry pass. Results never depend on when flushes run, except where a worker's would not
either (``docs/spark.md``: a record later than the retention).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sortedcontainers import SortedDict

from streamjoin.aggregations import Aggregator, StateCodec
from streamjoin.codecs import Codec
from streamjoin.errors import ConfigurationError
from streamjoin.events import Event, RawRecord
from streamjoin.joins.core import MAX_TIMESTAMP_MS
from streamjoin.partitioner import partition_for_key
from streamjoin.spark.runners import OutputRecord
from streamjoin.state.aggregate_windows import (
    Changed,
    SessionAggregates,
    SlidingAggregates,
)
from streamjoin.state.table_partition import Emitted, TablePartition
from streamjoin.state.window_layout import table_keys
from streamjoin.state.window_partition import Closing, WindowPartition, WindowStats
from streamjoin.state.windows import (
    HoppingWindows,
    SessionWindows,
    SlidingWindows,
    TumblingWindows,
    WindowSpec,
)
from streamjoin.windowed_aggregation import window_result

if TYPE_CHECKING:
    from streamjoin.config import AppConfig
    from streamjoin.windowed_aggregation import WindowedAggregation

__all__ = [
    "AggregateRecord",
    "AggregationRunner",
    "Rekey",
    "SortedStore",
    "window_headers",
]

#: one record of the aggregation's input as a runner takes it: ``(key, value, timestamp_ms,
#: offset)``; ``offset`` is the record's offset in its partition (or its position there)
AggregateRecord = tuple[bytes, bytes | None, int, int]

#: ``"results"``: what a worker sends; ``"state"``: the table partition a worker holds
Mode = Literal["results", "state"]


def window_headers(start: int, end: int) -> tuple[tuple[str, bytes], ...]:
    """The headers of a result record (as the workers send them)."""
    return (("window-start", b"%d" % start), ("window-end", b"%d" % end))


@dataclass
class Rekey:
    """``app.aggregate(key=...)``'s re-keying, as the repartition agent does it: decode with
    the original topic's codecs, call the key function, encode the new key and the value
    with the repartition topic's codecs. Picklable (no App inside)."""

    key: Callable[[Event], Any]
    topic: str
    key_codec: Codec
    value_codec: Codec
    new_key_codec: Codec
    new_value_codec: Codec

    def __call__(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        offset: int,
        timestamp_ms: int,
    ) -> tuple[bytes | None, bytes | None]:
        """The record's ``(new key, value)`` bytes (a None key: the aggregation skips it)."""
        event = Event(
            None if key is None else self.key_codec.loads(key),
            None if value is None else self.value_codec.loads(value),
            self.topic,
            partition,
            offset,
            timestamp_ms,
        )
        new_key = self.key(event)
        return (
            None if new_key is None else self.new_key_codec.dumps(new_key),
            None if event.value is None else self.new_value_codec.dumps(event.value),
        )


@dataclass
class AggregationRunner:
    """One partition of a declared aggregation (picklable: no App inside)."""

    name: str
    #: the aggregation's input topic (the repartition topic when it re-keys)
    topic: str
    window: WindowSpec | SlidingWindows | SessionWindows
    aggregator: Aggregator
    emit: Literal["update", "close"]
    key_codec: Codec
    value_codec: Codec
    state_codec: StateCodec
    timestamp: Callable[[Event], int] | None
    #: the results' topic name, codecs and partition count (results mode)
    out_topic: str
    out_key_codec: Codec
    out_value_codec: Codec
    out_partitions: int
    mode: Mode = "results"
    #: emit="update": only the last result of each window (the table's final contents)
    final_only: bool = False
    #: emit="close": also close the windows still open at the end (stream time to the end
    #: of time)
    close_windows_at_end: bool = False
    #: records between two flushes (a worker flushes on each commit)
    flush_every: int = 1000
    stats: dict[str, int] = field(default_factory=dict)
    #: state mode: table name -> the partition's store after the last run
    stores: dict[str, SortedStore] = field(default_factory=dict, repr=False)

    @classmethod
    def for_aggregation(
        cls,
        config: AppConfig,
        decl: WindowedAggregation,
        out_partitions: int,
        *,
        mode: Mode = "results",
        final_only: bool = False,
        close_windows_at_end: bool = False,
    ) -> AggregationRunner:
        """The runner of ``decl``, refusing options its emission has no use for."""
        name = decl.name
        if final_only and decl.emit != "update":
            raise ConfigurationError(
                f"aggregation {name!r} emits on close: its results are final already; "
                "final_only (--final-only) applies to emit='update' aggregations"
            )
        if close_windows_at_end and (decl.emit != "close" or mode != "results"):
            raise ConfigurationError(
                f"aggregation {name!r}: close_windows_at_end (--close-windows) applies to "
                "the results of emit='close' aggregations"
            )
        codec = decl.table.value_codec
        if not isinstance(codec, StateCodec):
            raise ConfigurationError(f"aggregation {name!r}: its table has no StateCodec")
        out = decl.emit_to if decl.emit == "update" else decl.table.final_to or decl.table.emit_to
        out_key = out.key_codec if out is not None else decl.source.key_codec
        out_value = out.value_codec if out is not None else config.value_codec
        return cls(
            name,
            decl.source.name,
            decl.window,
            decl.aggregator,
            decl.emit,
            decl.source.key_codec,
            decl.source.value_codec,
            codec,
            decl.timestamp,
            out.name if out is not None else name,
            out_key,
            out_value,
            out_partitions,
            mode,
            final_only,
            close_windows_at_end,
        )

    @property
    def records_table(self) -> str:
        """Sliding windows: the table keeping the key's recent records."""
        return f"{self.name}-records"

    def run(self, partition: int, records: Iterable[AggregateRecord]) -> Iterator[OutputRecord]:
        """Aggregate one partition's records, given in the order the worker takes them.

        Results mode yields the encoded results; state mode yields nothing and leaves the
        partition's stores in :attr:`stores`. ``stats`` counts records, outputs and late
        records. Records with a null value are skipped, as the worker's agent skips them.
        """
        self.stats = {"records": 0, "outputs": 0, "late": 0}
        self.stores = {}
        part = _Partition(self, partition)
        #: final_only: (key, start) -> the window's last (key, end, state, timestamp); None:
        #: a session merged away
        last: dict[tuple[bytes, int], tuple[Any, int, Any, int] | None] = {}
        flush_every, pending = self.flush_every, 0
        results = self.mode == "results"
        update = results and self.emit == "update"
        try:
            for key, value, timestamp_ms, offset in records:
                self.stats["records"] += 1
                if value is None:
                    continue
                changed = part.add(key, value, timestamp_ms, offset)
                if update and changed:
                    for start, end, state in changed:
                        if self.final_only:
                            now = part.record_ts
                            last[(key, start)] = (
                                None if state is None else (part.key, end, state, now)
                            )
                        else:
                            yield self._result(part.key, start, end, state, part.record_ts)
                pending += 1
                if pending >= flush_every:
                    pending = 0
                    yield from self._emitted(part.flush())
            if self.close_windows_at_end:
                part.advance(MAX_TIMESTAMP_MS)
            yield from self._emitted(part.flush())
            for (_, start), found in last.items():
                if found is not None:
                    decoded_key, end, state, timestamp = found
                    yield self._result(decoded_key, start, end, state, timestamp)
        finally:
            self.stats["late"] = part.stats.late
        if not results:
            self.stores = part.stores()

    def _result(
        self, key: Any, start: int, end: int, state: Any, timestamp_ms: int
    ) -> OutputRecord:
        """emit="update": a changed window's result, as the agent sends it."""
        value = None if state is None else self.aggregator.result(state)
        return self._output(key, start, end, value, timestamp_ms)

    def _output(
        self, key: Any, start: int, end: int, value: Any, timestamp_ms: int
    ) -> OutputRecord:
        key_bytes = self.out_key_codec.dumps(key)
        partition = (
            partition_for_key(key_bytes, self.out_partitions) if key_bytes is not None else -1
        )
        encoded = self.out_value_codec.dumps(window_result(start, end, value))
        self.stats["outputs"] += 1
        return OutputRecord(partition, key_bytes, encoded, timestamp_ms, window_headers(start, end))

    def final_result(self, key_bytes: bytes, start: int, end: int, state: Any) -> OutputRecord:
        """emit="close": a closed window's final result (stamped ``end - 1``, as workers do)."""
        key = self.key_codec.loads(key_bytes)
        return self._output(key, start, end, self.aggregator.result(state), end - 1)

    def _emitted(self, records: list[OutputRecord]) -> Iterator[OutputRecord]:
        if self.mode == "results":
            yield from records


class _Partition:
    """The worker's window code over one in-memory table partition (and, for sliding
    windows, the records table's)."""

    def __init__(self, runner: AggregationRunner, partition: int) -> None:
        self.runner = runner
        self.partition = partition
        self.views: dict[str, TablePartition] = {}
        self.closed: list[OutputRecord] = []
        self.stats = WindowStats()
        self.key: Any = None
        self.record_ts = 0
        view = self._view(runner.name)
        closes = runner.emit == "close"
        window = runner.window
        self.fixed: WindowPartition | None = None
        self.dynamic: SessionAggregates | SlidingAggregates | None = None
        if isinstance(window, SessionWindows):
            self.dynamic = SessionAggregates(
                runner.name,
                window,
                runner.aggregator,
                view,
                on_close=self._on_close_dynamic if closes else None,
                stats=self.stats,
            )
        elif isinstance(window, SlidingWindows):
            self.dynamic = SlidingAggregates(
                runner.name,
                window,
                runner.aggregator,
                view,
                self._view(runner.records_table),
                runner.value_codec.loads,
                on_close=self._on_close_dynamic if closes else None,
                stats=self.stats,
            )
        elif isinstance(window, TumblingWindows | HoppingWindows):
            closing = Closing(self._on_close_fixed, self.stats) if closes else None
            self.fixed = WindowPartition(runner.name, window, view, closing, self.stats)
        else:
            raise ConfigurationError(f"aggregation {runner.name!r}: unknown window {window!r}")

    def _view(self, table: str) -> TablePartition:
        view = TablePartition(table, self.partition, SortedStore())
        self.views[table] = view
        return view

    def add(self, key: bytes, value: bytes, timestamp_ms: int, offset: int) -> list[Changed]:
        """One record (key and value bytes of the input topic), as the agent adds it."""
        runner = self.runner
        decoded_key = runner.key_codec.loads(key)
        decoded = runner.value_codec.loads(value)
        if decoded_key is None or decoded is None:
            return []  # (the agent skips records whose key or value decode to None)
        self.key, self.record_ts = decoded_key, timestamp_ms
        ts = timestamp_ms
        if runner.timestamp is not None:
            event = Event(decoded_key, decoded, runner.topic, self.partition, offset, timestamp_ms)
            ts = runner.timestamp(event)
        # the table stores the key as its codec encodes the decoded key
        key_bytes = runner.key_codec.dumps(decoded_key) or b""
        dynamic = self.dynamic
        if isinstance(dynamic, SessionAggregates):
            return dynamic.add(key_bytes, ts, decoded)
        if dynamic is not None:
            return dynamic.add(key_bytes, ts, decoded, value, offset)
        return self._add_fixed(key_bytes, key, value, decoded, ts, timestamp_ms, offset)

    def _add_fixed(
        self,
        key_bytes: bytes,
        raw_key: bytes,
        raw_value: bytes,
        value: Any,
        ts: int,
        record_ts: int,
        offset: int,
    ) -> list[Changed]:
        """Tumbling and hopping windows: ``WindowedTable._event_partition`` (with its late
        check), then ``update``."""
        part = self.fixed
        assert part is not None
        windows = part.spec.windows_for(ts)
        latest = part.latest
        if latest is not None and windows[0][1] + part.grace_ms <= latest:
            # the earliest window has closed: the record is late for it (and maybe the
            # others), whatever the emission (as WindowedTable._event_partition)
            record = RawRecord(
                self.runner.topic, self.partition, offset, record_ts, raw_key, raw_value
            )
            windows = part.open_windows(windows, record, ts)
            part.record = record
            part.count_late()
        if latest is None or ts > latest:
            part.latest = ts
        view, codec, aggregator = part.view, self.runner.state_codec, self.runner.aggregator
        changed: list[Changed] = []
        for start, end in windows:
            data_key, index_key = table_keys(key_bytes, start)
            raw = view.get(data_key)
            state = aggregator.initial() if raw is None else codec.load_state(raw)
            new = aggregator.add(state, value)
            view.put(data_key, codec.dumps(new))
            if raw is None:
                part.index_new_window(index_key, start)
            changed.append((start, end, new))
        return changed

    def advance(self, stream_time_ms: int) -> None:
        """Move the stream time on (to close every window at the end of the input)."""
        if self.fixed is not None:
            self.fixed.latest = stream_time_ms
        elif self.dynamic is not None:
            self.dynamic.latest = stream_time_ms

    def flush(self) -> list[OutputRecord]:
        """A worker's flush: the passes (close, expiry), then the writes into the stores;
        returns the final results the close passes produced."""
        for view in self.views.values():
            view.take_pending()
            view.take_emitted()
            view.finish_flush(None)
        closed, self.closed = self.closed, []
        return closed

    def stores(self) -> dict[str, SortedStore]:
        return {table: self._store(view) for table, view in self.views.items()}

    @staticmethod
    def _store(view: TablePartition) -> SortedStore:
        store = view.store
        assert isinstance(store, SortedStore)
        return store

    def _on_close_fixed(self, key_bytes: bytes, start: int, end: int, raw: bytes) -> Emitted | None:
        state = self.runner.state_codec.load_state(raw)
        self.closed.append(self.runner.final_result(key_bytes, start, end, state))
        return None

    def _on_close_dynamic(
        self, key_bytes: bytes, start: int, end: int, state: Any
    ) -> Emitted | None:
        self.closed.append(self.runner.final_result(key_bytes, start, end, state))
        return None


class SortedStore:
    """An in-memory store partition for a runner: a sorted dict, so a flush of many new
    windows costs ``O(log n)`` per key (the memory backend's sorted list shifts on every
    insert). Same contract (``StorePartition``); the changelog offset is kept, unused."""

    def __init__(self) -> None:
        self._data: SortedDict[bytes, bytes] = SortedDict()
        self._offset: int | None = None

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def contains(self, key: bytes) -> bool:
        return key in self._data

    def items(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        data = self._data
        keys = list(data.irange(start, end, inclusive=(True, False)))
        return ((key, data[key]) for key in keys if key in data)

    def range_items(self, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        return list(self.items(start, end))

    def write(self, writes: Mapping[bytes, bytes | None], changelog_offset: int | None) -> None:
        data = self._data
        for key, value in writes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if changelog_offset is not None:
            self._offset = changelog_offset

    def changelog_offset(self) -> int | None:
        return self._offset

    def count(self) -> int:
        return len(self._data)

    def size_bytes(self) -> int:
        return sum(len(k) + len(v) for k, v in self._data.items())

    def close(self) -> None:
        self._data = SortedDict()
