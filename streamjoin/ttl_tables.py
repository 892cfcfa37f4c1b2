"""TTL tables: plain tables whose keys expire when not written for ``ttl_ms`` of stream time.

``app.table(name, ttl_ms=N)`` makes a :class:`TtlTable`. Each stored value (in the store
and in the changelog alike) carries its write time in an 8-byte prefix, and each
partition keeps its stream time under a reserved key (see :mod:`streamjoin.state.ttl`
for why stream time, and the layout). Reads treat an expired key as absent at once;
the partition's next flushes purge expired keys (up to
:data:`~streamjoin.state.ttl.PURGE_BATCH` per flush) with a tombstone each, so restores
and standbys end up with exactly the unexpired keys, and rebuild the expiry index from
the store when the partition is next used.

Stream time here is the highest timestamp of the events that used the table's
partition (read or write): events of a co-partitioned topic that never touch the table
do not move it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from streamjoin.context import current_event
from streamjoin.errors import SparkJobError, TableAccessError
from streamjoin.quick_codecs import dump, load
from streamjoin.state.base import StorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.ttl import (
    STREAM_TIME_KEY,
    WRITE_TIME_BYTES,
    Expiry,
    stamp,
    write_time_of,
)
from streamjoin.tables import Table

__all__ = ["TtlTable", "refuse_in_spark"]


@dataclass(eq=False)
class TtlTable(Table):
    """A :class:`~streamjoin.tables.Table` whose keys expire ``ttl_ms`` of stream time
    after their last write."""

    kind = "TTL table"
    ttl_ms: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.before_flush = self.purge_expired

    # ------------------------------------------------------------ partition and clock

    def expiry_of(self, state: TablePartition) -> Expiry:
        """The partition's expiry (rebuilt from its store and buffered writes on first use:
        after a restore, a standby's promotion, or a restart)."""
        expiry = state.ttl
        if expiry is None:
            expiry = state.ttl = Expiry.rebuild(self.ttl_ms, state.scan(b"", None))
        return expiry

    def _used(self, key_bytes: bytes | None, *, writing: bool) -> tuple[TablePartition, Expiry]:
        """The partition a read or write goes to, with its expiry; stream time moves to the
        current event's timestamp (reads outside agents leave it alone)."""
        state = self._state(key_bytes, writing=writing)
        expiry = state.ttl or self.expiry_of(state)
        event = current_event.get()
        if event is not None:
            expiry.observe(event.record.timestamp)
        return state, expiry

    def _encode_key(self, key: Any) -> bytes:
        data = super()._encode_key(key)
        if data == STREAM_TIME_KEY:
            raise TableAccessError(
                f"TTL table {self.name!r}: keys must not encode to empty bytes (that key "
                "holds the partition's stream time)"
            )
        return data

    def _live(self, expiry: Expiry, raw: bytes | None) -> bytes | None:
        """The stored value without its write time, or None if absent or expired."""
        if raw is None or expiry.is_expired(write_time_of(raw)):
            return None
        return raw[WRITE_TIME_BYTES:]

    # ------------------------------------------------------------ dict API

    def __getitem__(self, key: Any) -> Any:
        key_bytes = self._encode_key(key)
        state, expiry = self._used(key_bytes, writing=False)
        raw = self._live(expiry, state.lookup(key_bytes))
        if raw is None:
            if self.default is not None:
                return self.default()
            raise KeyError(key)
        return self._load_value(raw)

    def get(self, key: Any, default: Any = None) -> Any:
        key_bytes = self._encode_key(key)
        state, expiry = self._used(key_bytes, writing=False)
        raw = self._live(expiry, state.lookup(key_bytes))
        return default if raw is None else self._load_value(raw)

    def __contains__(self, key: Any) -> bool:
        key_bytes = self._encode_key(key)
        state, expiry = self._used(key_bytes, writing=False)
        return self._live(expiry, state.lookup(key_bytes)) is not None

    def __setitem__(self, key: Any, value: Any) -> None:
        key_bytes = self._encode_key(key)
        state, expiry = self._used(key_bytes, writing=True)
        encoded = dump(self.value_codec, value)
        if encoded is None:  # (a codec encoding the value to None deletes, as in Table)
            state.delete(key_bytes)
            expiry.deleted(key_bytes)
            return
        now = expiry.stream_time or 0
        state.put(key_bytes, stamp(now, encoded))
        expiry.written(key_bytes, now)

    def __delitem__(self, key: Any) -> None:
        key_bytes = self._encode_key(key)
        state, expiry = self._used(key_bytes, writing=True)
        if self._live(expiry, state.lookup(key_bytes)) is None:
            raise KeyError(key)
        state.delete(key_bytes)
        expiry.deleted(key_bytes)

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        for state in self._local_states(partition):
            expiry = self.expiry_of(state)
            for key_bytes, raw in list(state.scan(b"", None)):
                if key_bytes == STREAM_TIME_KEY:
                    continue
                value = self._live(expiry, raw)
                if value is not None:
                    yield load(self.key_codec, key_bytes), load(self.value_codec, value)

    def stored_value(
        self, store: StorePartition | TablePartition, key_bytes: bytes
    ) -> bytes | None:
        if key_bytes == STREAM_TIME_KEY:
            return None
        raw = store.get(key_bytes)
        if raw is None:
            return None
        expiry = store.ttl if isinstance(store, TablePartition) else None
        if expiry is None:  # a store read as it is: its stored stream time is the clock
            clock = store.get(STREAM_TIME_KEY)
            expiry = Expiry(self.ttl_ms, None if clock is None else write_time_of(clock))
        return self._live(expiry, raw)

    # ------------------------------------------------------------ purging (at flush)

    def purge_expired(self, state: TablePartition) -> None:
        """This table's ``before_flush``: delete up to a batch of expired keys (a changelog
        tombstone each) and store the partition's stream time if it moved."""
        expiry = self.expiry_of(state)
        due = expiry.take_due()
        for key in due:
            state.delete(key)
        if due:
            counts = self.link.ttl_expired
            counts[self.name] = counts.get(self.name, 0) + len(due)
        clock = expiry.take_stream_time()
        if clock is not None:
            state.put(STREAM_TIME_KEY, clock)


def refuse_in_spark(what: str, *tables: object) -> None:
    """Refuse a Spark job over a TTL table (``app.topic_table(..., ttl_ms=)``): which rows
    a worker had expired depends on each partition's stream time as the worker read it,
    which a job over the whole topic does not reproduce."""
    for table in tables:
        if isinstance(table, TtlTable):
            raise SparkJobError(
                f"{what}: table {table.name!r} is a TTL table (ttl_ms=): the rows a worker "
                "has expired depend on each partition's stream time as it read them, which "
                "a Spark job does not reproduce; the Spark jobs do not build TTL tables"
            )
