"""Read local table state from disk for the CLI, without disturbing a running worker.

Stores are opened read-only (RocksDB takes no lock then), so ``streamjoin
tables`` and ``streamjoin table get`` work while a worker holds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamjoin.errors import NotFoundError
from streamjoin.partitioner import partition_for_key
from streamjoin.state.base import StoreError
from streamjoin.state.rocksdb import RocksDBStorePartition

if TYPE_CHECKING:
    from streamjoin.tables import Table


@dataclass(frozen=True)
class LocalPartition:
    table: str
    partition: int
    path: Path
    keys: int | None
    size_bytes: int | None
    changelog_offset: int | None
    error: str | None = None


def store_path(state_dir: Path, table: str, partition: int) -> Path:
    return state_dir / "tables" / table / str(partition)


def local_partitions(state_dir: Path, table: Table) -> Iterator[LocalPartition]:
    """Every partition of ``table`` with a store under ``state_dir``."""
    root = state_dir / "tables" / table.name
    if not root.is_dir():
        return
    for child in sorted(root.iterdir(), key=lambda p: (len(p.name), p.name)):
        if not (child.is_dir() and child.name.isdigit()):
            continue
        partition = int(child.name)
        try:
            store = RocksDBStorePartition(
                child, table=table.name, partition=partition, read_only=True
            )
        except StoreError as exc:
            yield LocalPartition(table.name, partition, child, None, None, None, str(exc))
            continue
        try:
            yield LocalPartition(
                table.name,
                partition,
                child,
                store.count(),
                store.size_bytes(),
                store.changelog_offset(),
            )
        finally:
            store.close()


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


def read_value(state_dir: Path, table: Table, key: Any) -> tuple[int, Any]:
    """(partition, decoded value) of ``key`` from local state; KeyError when absent."""
    key_bytes = table.key_codec.dumps(key)
    if key_bytes is None:
        raise KeyError(key)
    partition = partition_for_key(key_bytes, table.partitions)
    path = store_path(state_dir, table.name, partition)
    try:
        store = RocksDBStorePartition(path, table=table.name, partition=partition, read_only=True)
    except StoreError as exc:
        raise NotFoundError(
            f"partition {partition} of table {table.name!r} has no readable local store "
            f"under {state_dir} ({exc}); is this the state dir of the worker that owns it?"
        ) from exc
    try:
        raw = store.get(key_bytes)
    finally:
        store.close()
    if raw is None:
        raise KeyError(key)
    return partition, table.value_codec.loads(raw)
