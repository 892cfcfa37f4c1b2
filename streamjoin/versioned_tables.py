"""Versioned tables: plain tables that also answer "what was the value at time ts".

``app.table(name, history_ms=N)`` (or ``app.topic_table(topic, history_ms=N)``) makes a
:class:`VersionedTable`. Every write is a *version* at a timestamp (the current event's,
unless given), kept for N ms of the partition's stream time (the highest timestamp
written) and, the latest of each key, for ever. ``table[key]`` and ``table.get(key)``
read the latest version; ``table.get(key, as_of=ts)`` the one valid at ts, refusing
(:class:`~streamjoin.errors.HistoryExpired`) a ts older than the history kept. A
stream-table join with a versioned table looks each event's row up as of the event's
timestamp, so an event that arrives after a newer row still meets the row of its time.

Layout, changelog and retention are in :mod:`streamjoin.state.versions`: one store key
(and changelog key) per version, so compaction keeps the history, restores and standbys
rebuild the same store, and a purged version is a changelog tombstone. Purging runs at
flushes, bounded per flush, like a TTL table's expiry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from streamjoin.context import current_event
from streamjoin.errors import HistoryExpired, TableAccessError
from streamjoin.quick_codecs import dump, load
from streamjoin.state.base import StorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.versions import (
    STREAM_TIME_KEY,
    History,
    as_of,
    check_as_of,
    check_timestamp,
    decode_version,
    key_of,
    purge,
    read_as_of,
    read_latest,
    timestamp_of,
    version_group,
    version_range,
    write_version,
)
from streamjoin.tables import Table

__all__ = ["TOO_LATE", "VersionedTable"]

#: what :meth:`VersionedTable.lookup_for_join` returns for an event older than the history
TOO_LATE: Any = object()


@dataclass(eq=False)
class VersionedTable(Table):
    """A :class:`~streamjoin.tables.Table` keeping each key's values over ``history_ms``
    of stream time, readable as of a timestamp."""

    kind = "versioned table"
    history_ms: int = 0
    #: partition -> (its runtime partition, the history index made for it): rebuilt from
    #: the store when the partition object changes (a restore, a promotion, a restart)
    _histories: dict[int, tuple[TablePartition, History]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.before_flush = self.purge_history

    @property
    def too_late(self) -> int:
        """Stream-table join events dropped on this worker (running, or its last run) for
        being older than the history (metric ``streamjoin_table_too_late_lookups_total``)."""
        return self.link.too_late.get(self.name, 0)

    @property
    def late_writes(self) -> int:
        """Writes dropped on this worker (running, or its last run) for being older than
        the history, see :meth:`put` (metric ``streamjoin_table_late_writes_total``)."""
        return self.link.late_writes.get(self.name, 0)

    def count_too_late(self) -> None:
        """A stream-table join dropped an event older than the history (see ``too_late``)."""
        counts = self.link.too_late
        counts[self.name] = counts.get(self.name, 0) + 1

    def history_of(self, state: TablePartition) -> History:
        """The partition's history index (rebuilt from its store and buffered writes on
        first use)."""
        entry = self._histories.get(state.partition)
        if entry is not None and entry[0] is state:
            return entry[1]
        state.group_keys_by(version_group)  # scans of one key's versions read its writes only
        history = History.rebuild(self.history_ms, state.scan(b"", None))
        self._histories[state.partition] = (state, history)
        return history

    # ------------------------------------------------------------ reads

    def __getitem__(self, key: Any) -> Any:
        key_bytes = self._encode_key(key)
        raw = read_latest(self._state(key_bytes, writing=False), key_bytes)
        if raw is None:
            if self.default is not None:
                return self.default()
            raise KeyError(key)
        return self._load_value(raw)

    def get(self, key: Any, default: Any = None, *, as_of: int | None = None) -> Any:
        """The latest value of ``key``, or (``as_of=ts``) the one valid at ts: the newest
        version at or before ts; ``default`` when there is none or it was deleted. Raises
        :class:`~streamjoin.errors.HistoryExpired` for a ts older than the history kept."""
        key_bytes = self._encode_key(key)
        state = self._state(key_bytes, writing=False)
        if as_of is None:
            raw = read_latest(state, key_bytes)
        else:
            timestamp = check_timestamp(self.name, as_of)
            check_as_of(self.name, timestamp, self.history_of(state).horizon)
            raw = read_as_of(state, key_bytes, timestamp)
        return default if raw is None else self._load_value(raw)

    def lookup_for_join(self, key: Any, timestamp_ms: int) -> Any:
        """A stream-table join's row for an event of ``timestamp_ms``: the value as of it,
        None, or :data:`TOO_LATE` when the event is older than the history kept."""
        try:
            return self.get(key, as_of=max(timestamp_ms, 0))
        except HistoryExpired:
            return TOO_LATE

    def versions(self, key: Any) -> list[tuple[int, Any]]:
        """Every version of ``key`` kept, oldest first: ``(timestamp, value)``, value None
        for a delete (purged versions are gone; ones due but not yet purged are listed)."""
        key_bytes = self._encode_key(key)
        state = self._state(key_bytes, writing=False)
        out: list[tuple[int, Any]] = []
        for stored_key, stored in list(state.scan(*version_range(key_bytes))):
            raw = decode_version(stored)
            out.append((timestamp_of(stored_key), None if raw is None else self._load_value(raw)))
        return out

    def __contains__(self, key: Any) -> bool:
        key_bytes = self._encode_key(key)
        return read_latest(self._state(key_bytes, writing=False), key_bytes) is not None

    def local_items(self, partition: int | None = None) -> Iterator[tuple[Any, Any]]:
        """The latest value of each key of the local partitions (deleted keys left out)."""
        for state in self._local_states(partition):
            latest: tuple[bytes, bytes] | None = None
            for stored_key, stored in list(state.scan(b"", None)):
                if stored_key == STREAM_TIME_KEY:
                    continue
                key_bytes = key_of(stored_key)
                if latest is not None and latest[0] != key_bytes:
                    yield from self._item(*latest)
                latest = (key_bytes, stored)
            if latest is not None:
                yield from self._item(*latest)

    def _item(self, key_bytes: bytes, stored: bytes) -> Iterator[tuple[Any, Any]]:
        raw = decode_version(stored)
        if raw is not None:
            yield load(self.key_codec, key_bytes), load(self.value_codec, raw)

    def stored_value(
        self, store: StorePartition | TablePartition, key_bytes: bytes
    ) -> bytes | None:
        start, end = version_range(key_bytes)
        if isinstance(store, TablePartition):
            return as_of(list(store.scan(start, end)))
        return as_of(store.range_items(start, end))

    # ------------------------------------------------------------ writes

    def _timestamp(self, timestamp: int | None) -> int:
        if timestamp is not None:
            return check_timestamp(self.name, timestamp)
        event = current_event.get()
        if event is None:
            raise TableAccessError(
                f"versioned table {self.name!r} can only be written from an agent processing "
                "an event"
            )
        return max(event.record.timestamp, 0)

    def put(self, key: Any, value: Any, *, timestamp: int | None = None) -> None:
        """Write ``value`` as ``key``'s version at ``timestamp`` (default: the current
        event's timestamp); an older timestamp than the latest adds a past version. A
        timestamp older than the history kept (stream time - ``history_ms``) is dropped
        and counted in ``late_writes``, as Kafka Streams does."""
        key_bytes = self._encode_key(key)
        state = self._state(key_bytes, writing=True)
        self._write(state, key_bytes, dump(self.value_codec, value), self._timestamp(timestamp))

    def delete(self, key: Any, *, timestamp: int | None = None) -> None:
        """Record that ``key`` is absent from ``timestamp`` on (default: the current
        event's timestamp), whether or not it had a value."""
        key_bytes = self._encode_key(key)
        state = self._state(key_bytes, writing=True)
        self._write(state, key_bytes, None, self._timestamp(timestamp))

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        key_bytes = self._encode_key(key)
        state = self._state(key_bytes, writing=True)
        if read_latest(state, key_bytes) is None:
            raise KeyError(key)
        self._write(state, key_bytes, None, self._timestamp(None))

    def _write(
        self, state: TablePartition, key_bytes: bytes, value: bytes | None, timestamp: int
    ) -> None:
        if not write_version(state, self.history_of(state), key_bytes, value, timestamp):
            counts = self.link.late_writes
            counts[self.name] = counts.get(self.name, 0) + 1

    # ------------------------------------------------------------ retention (at flush)

    def purge_history(self, state: TablePartition) -> None:
        """This table's ``before_flush``: delete up to a batch of versions out of history
        (a changelog tombstone each) and store the partition's stream time if it moved."""
        purge(state, self.history_of(state))
