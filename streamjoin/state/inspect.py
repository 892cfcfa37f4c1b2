"""Read local table state from disk for the CLI, without disturbing a running worker.

Table databases (``<state_dir>/stores/<table>``, a column family per partition) are
opened read-only (RocksDB takes no lock then), so ``streamjoin tables`` and ``streamjoin
table get`` work while a worker holds them; they see the state as of their open.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from streamjoin.errors import NotFoundError, StoreError
from streamjoin.partitioner import partition_for_key
from streamjoin.state import window_layout as layout
from streamjoin.state.keys import MAX_UINT64
from streamjoin.state.rocksdb import RocksDBStorePartition, TableDatabase, partition_path
from streamjoin.state.windows import WindowSpec

if TYPE_CHECKING:
    from streamjoin.tables import Table

T = TypeVar("T")


@dataclass(frozen=True)
class LocalPartition:
    table: str
    partition: int
    path: Path
    keys: int | None
    size_bytes: int | None
    changelog_offset: int | None
    error: str | None = None


def store_path(state_dir: Path, table: str) -> Path:
    """The table's RocksDB database under a worker's state dir."""
    return state_dir / "stores" / table


def local_partitions(state_dir: Path, table: Table) -> Iterator[LocalPartition]:
    """Every partition of ``table`` with a store under ``state_dir``."""
    root = store_path(state_dir, table.name)
    if not root.is_dir():
        return
    try:
        database = TableDatabase(root, table.name, read_only=True)
    except StoreError as exc:
        yield LocalPartition(table.name, -1, root, None, None, None, str(exc))
        return
    try:
        for partition in database.stored_partitions():
            where = partition_path(root, partition)
            try:
                store = database.partition(partition)
            except StoreError as exc:
                yield LocalPartition(table.name, partition, where, None, None, None, str(exc))
                continue
            yield LocalPartition(
                table.name,
                partition,
                where,
                store.count(),
                store.size_bytes(),
                store.changelog_offset(),
            )
            store.close()
    finally:
        database.close()


def parse_key(table: Table, text: str) -> Any:
    """A key typed on the command line, as the table's key codec expects it."""
    name = table.key_codec.name
    if name == "raw":
        return text.encode()
    if name == "str":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare string for a JSON key


def _open(state_dir: Path, table: Table, partition: int) -> RocksDBStorePartition:
    path = store_path(state_dir, table.name)
    try:
        return RocksDBStorePartition(path, table=table.name, partition=partition, read_only=True)
    except StoreError as exc:
        raise NotFoundError(
            f"partition {partition} of table {table.name!r} has no readable local store "
            f"under {state_dir} ({exc}); is this the state dir of the worker that owns it?"
        ) from exc


def _find(
    state_dir: Path, table: Table, key: Any, read: Callable[[RocksDBStorePartition], T | None]
) -> tuple[int, T]:
    """(partition, ``read(store)``) for the partition ``key`` belongs to; KeyError when
    ``read`` finds nothing.

    The partition is ``murmur2(key) % partitions``. A table whose count is settled only
    when the app starts (nobody declared one) has no count here, so every local
    partition is asked instead: a key is stored in one partition only.
    """
    key_bytes = table.key_codec.dumps(key)
    if key_bytes is None:
        raise KeyError(key)
    count = table.changelog.partitions
    if count is not None:
        candidates = [partition_for_key(key_bytes, count)]
    else:
        candidates = [lp.partition for lp in local_partitions(state_dir, table) if not lp.error]
    for partition in candidates:
        store = _open(state_dir, table, partition)
        try:
            found = read(store)
        finally:
            store.close()
        if found is not None:
            return partition, found
    raise KeyError(key)


def read_value(state_dir: Path, table: Table, key: Any) -> tuple[int, Any]:
    """(partition, decoded value) of ``key`` from local state; KeyError when absent."""
    key_bytes = table.key_codec.dumps(key)

    def read(store: RocksDBStorePartition) -> Any:
        raw = None if key_bytes is None else table.stored_value(store, key_bytes)
        return None if raw is None else (table.value_codec.loads(raw),)

    partition, (value,) = _find(state_dir, table, key, read)
    return partition, value


def read_windows(
    state_dir: Path, table: Table, key: Any, spec: WindowSpec
) -> tuple[int, list[tuple[int, int, Any]]]:
    """(partition, [(window start, window end, decoded value)]) of ``key`` in a windowed
    table's local state, oldest window first; KeyError when it has none."""
    key_bytes = table.key_codec.dumps(key)

    def read(store: RocksDBStorePartition) -> list[tuple[int, int, Any]] | None:
        if key_bytes is None:
            return None
        start, end = layout.data_range(key_bytes, 0, MAX_UINT64)
        windows = [
            (entry.time_ms, entry.time_ms + spec.size_ms, table.value_codec.loads(raw))
            for entry, raw in (
                (layout.split_data_key(data_key), raw) for data_key, raw in store.items(start, end)
            )
        ]
        return windows or None

    return _find(state_dir, table, key, read)
