"""Tables: dict-like state backed by one local store per partition and a compacted changelog.

A write made while an agent processes an event of partition *p* goes to the
table's partition *p* of that event's task (the table is co-partitioned with the
event's topic; anything else is a :class:`TableAccessError`, never a silent write
to the wrong partition). Writes are buffered in the task's
:class:`~streamjoin.state.table_partition.TablePartition` and applied to the
store, together with the changelog offset, when the worker commits: changelog
first, then the store, then the source offsets (at-least-once).

A :class:`Table` is a declaration: it holds no state. The runtime owns the
partitions and reaches them to the table through :mod:`streamjoin.context`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from streamjoin.codecs import Codec
from streamjoin.context import RuntimeLink, current_channel_agent, current_event
from streamjoin.errors import TableAccessError
from streamjoin.quick_codecs import dump, load
from streamjoin.quick_partition import partition_of
from streamjoin.remembered_values import value_loader
from streamjoin.state.base import StorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.topics import Topic

__all__ = ["STORE_KINDS", "StoreKind", "Table"]

#: (``Final``: a C static when compiled, not a module dict lookup per use)
_CURRENT_EVENT: Final = current_event

#: where a table's partitions keep their state: a RocksDB database under the state dir,
#: or memory (empty at every start, restored in full from the changelog)
StoreKind = Literal["rocksdb", "memory"]
STORE_KINDS: tuple[StoreKind, ...] = ("rocksdb", "memory")


@dataclass(eq=False)
class Table:
    """A partitioned key/value table; ``table[key]`` inside agents, like a dict."""

    name: str
    key_codec: Codec
    value_codec: Codec
    changelog: Topic
    default: Callable[[], Any] | None = None
    #: source topics whose events may write this table (its co-partition group)
    writers: frozenset[str] = frozenset()
    #: how the running worker's partitions are reached (set by the App)
    link: RuntimeLink = field(default_factory=RuntimeLink, repr=False)
    #: called by the flusher with each of the table's partitions before its writes are
    #: taken, even one no event touched since it was assigned (set by the declaration that
    #: owns the table: a join closing idle partitions makes its per-task state there)
    before_flush: Callable[[TablePartition], None] | None = field(default=None, repr=False)
    #: ``"rocksdb"`` or ``"memory"`` (an app without a state dir keeps every table in memory)
    store: StoreKind = "rocksdb"
    #: decodes stored values (JSON values are remembered: see :mod:`~streamjoin.remembered_values`)
    _load_value: Callable[[bytes], Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._load_value = value_loader(self.value_codec)

    @property
    def partitions(self) -> int:
        count = self.changelog.partitions or self.link.partitions.get(self.changelog.name)
        if count is None:
            raise TableAccessError(
                f"table {self.name!r} has no partition count before the app starts: none "
                "was declared, so it is settled at start (an existing topic's count, else "
                "the app's topic_partitions)"
            )
        return count

    # -------------------------------------------------------------- partition routing

    def _state(self, key_bytes: bytes | None, *, writing: bool) -> TablePartition:
        """The partition a read or write goes to: the current event's task's, or (reads
        outside agents) the key's partition when it is active here."""
        event = _CURRENT_EVENT.get()
        if event is not None:
            state = event.table_partition(self.name)
            if state is None:
                record = event.record
                raise TableAccessError(
                    f"table {self.name!r} used while processing {record.topic!r}, which is "
                    f"not co-partitioned with it (co-partitioned: "
                    f"{sorted(self.writers) or 'none'}). Declare "
                    f"app.table({self.name!r}, copartitioned_with=...) or repartition the "
                    "stream first."
                )
            return state
        if writing and (channel_agent := current_channel_agent.get()) is not None:
            raise TableAccessError(
                f"table {self.name!r} cannot be written from channel agent {channel_agent!r}: "
                "an in-memory channel's events belong to no partition, and a table's "
                "partition is written only by the agent processing an event of it. Send the "
                "record to an agent on a topic (an agent with no topic, @app.agent(), reads a "
                "durable one) and write the table there"
            )
        if writing:
            raise TableAccessError(
                f"table {self.name!r} can only be written from an agent processing an event"
            )
        if key_bytes is None:
            raise TableAccessError(f"table {self.name!r}: None keys have no partition")
        return self.active_partition(partition_of(key_bytes, self.partitions))

    def active_partition(self, partition: int) -> TablePartition:
        """Partition ``partition`` when it is active and restored on this worker."""
        tables = self.link.tables
        state = None if tables is None else tables.active_partition(self.name, partition)
        if state is None:
            restoring = tables is not None and tables.held_partition(self.name, partition)
            raise TableAccessError(
                f"partition {partition} of table {self.name!r} is not active on this worker"
                + (" (still restoring)" if restoring else "")
            )
        return state

    def active_partitions(self) -> list[int]:
        """Partitions of this table active and restored here."""
        tables = self.link.tables
        return [] if tables is None else tables.active_partitions(self.name)

    def _encode_key(self, key: Any) -> bytes:
        data: bytes | None = dump(self.key_codec, key)
        if data is None:
            raise TableAccessError(f"table {self.name!r}: keys must not encode to None")
        return data

    # -------------------------------------------------------------- dict API

    def __getitem__(self, key: Any) -> Any:
        key_bytes = self._encode_key(key)
        raw = self._state(key_bytes, writing=False).lookup(key_bytes)
        if raw is None:
            if self.default is not None:
                return self.default()
            raise KeyError(key)
        return self._load_value(raw)

    def get(self, key: Any, default: Any = None) -> Any:
        # (_encode_key and _state's usual path inlined: a stream-table join reads once per
        # event)
        key_bytes = dump(self.key_codec, key)
        if key_bytes is None:
            key_bytes = self._encode_key(key)  # raises
        state = self.event_partition()
        if state is None:
            state = self._state(key_bytes, writing=False)  # outside agents, or raises
        raw = state.lookup(key_bytes)
        return default if raw is None else self._load_value(raw)

    def event_partition(self) -> TablePartition | None:
        """The current event's task's partition of this table (None outside agents, or
        not co-partitioned: then :meth:`get` says why). For a caller reading the table for
        every event of a batch, all of one task: it finds the partition once and reads it
        with :meth:`get_from`."""
        event = _CURRENT_EVENT.get()
        return None if event is None else event.table_partition(self.name)

    def get_from(self, state: TablePartition, key: Any) -> Any:
        """A plain table's :meth:`get` of ``key`` (None when absent) from ``state``, the
        partition that :meth:`event_partition` gave for the batch being processed."""
        key_bytes = dump(self.key_codec, key)
        if key_bytes is None:
            key_bytes = self._encode_key(key)  # raises
        raw = state.lookup(key_bytes)
        return None if raw is None else self._load_value(raw)

    def __contains__(self, key: Any) -> bool:
        key_bytes = self._encode_key(key)
        return self._state(key_bytes, writing=False).lookup(key_bytes) is not None

    def __setitem__(self, key: Any, value: Any) -> None:
        key_bytes = self._encode_key(key)
        state = self._state(key_bytes, writing=True)
        state.put(key_bytes, dump(self.value_codec, value))

    def __delitem__(self, key: Any) -> None:
        key_bytes = self._encode_key(key)
        state = self._state(key_bytes, writing=True)
        if state.lookup(key_bytes) is None:
            raise KeyError(key)
        state.delete(key_bytes)

    def _local_states(self, partition: int | None) -> list[TablePartition]:
        if partition is not None:
            event = _CURRENT_EVENT.get()
            if event is not None and event.record.partition == partition:
                return [self._state(None, writing=False)]
            return [self.active_partition(partition)]
        if _CURRENT_EVENT.get() is not None:
            return [self._state(None, writing=False)]
        return [self.active_partition(p) for p in self.active_partitions()]

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """Items of the local active partitions (or one of them), pending writes included.

        Inside an agent, ``partition`` defaults to the current event's partition.
        """
        for state in self._local_states(partition):
            # materialized: the caller may write to the table while iterating
            for key_bytes, value_bytes in list(state.scan(b"", None)):
                yield load(self.key_codec, key_bytes), load(self.value_codec, value_bytes)

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self.local_items()

    def keys(self) -> Iterator[Any]:
        # (generator functions, not expressions: compiled, an expression becomes a list)
        for key, _ in self.local_items():
            yield key

    def values(self) -> Iterator[Any]:
        for _, value in self.local_items():
            yield value

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def stored_value(
        self, store: StorePartition | TablePartition, key_bytes: bytes
    ) -> bytes | None:
        """The encoded value of ``key_bytes`` in a partition's store, read outside agents
        (the interactive-query endpoint); None when absent (or, in a TTL table, expired)."""
        return store.get(key_bytes)

    def view(self, partition: int) -> TablePartition:
        """Byte-level access to one active partition (join buffers, windowed tables)."""
        return self.active_partition(partition)
