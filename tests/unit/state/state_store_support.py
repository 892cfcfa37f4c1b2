"""Shared helpers for the store tests (imported by conftest and the test modules)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

from streamjoin.state.base import StorePartition
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.rocksdb import RocksDBStorePartition

BACKENDS = ("memory", "rocksdb")


class StoreFactory:
    """Opens fresh stores of one backend and closes them all at teardown."""

    def __init__(self, backend: str, root: Path) -> None:
        self.backend = backend
        self.root = root
        self._opened: list[StorePartition] = []
        self._ids = itertools.count()

    def fresh(self, table: str = "t", partition: int = 0) -> StorePartition:
        store: StorePartition
        if self.backend == "memory":
            store = MemoryStorePartition(table=table, partition=partition)
        else:
            path = self.root / f"store-{next(self._ids)}"
            store = RocksDBStorePartition(path, table=table, partition=partition)
        self._opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self._opened:
            store.close()


def corrupt_data_block(store_dir: Path, table: str, partition: int, key: bytes) -> Path:
    """Flush a closed RocksDB table database into SST files, then overwrite bytes at the
    start of each SST whose key range holds ``key`` (the partition's, and any other
    partition's whose range covers it): its first data block. The database still opens
    (footer, index and metadata are intact); a read of that block fails its checksum.
    Overwriting (not flipping) makes a second call on the same file harmless. Returns the
    first SST."""
    store = RocksDBStorePartition(store_dir, table=table, partition=partition)
    try:
        db = store._db
        assert db is not None
        db.flush()
        files = [
            f for f in db.live_files() if f["start_key"] <= key <= f["end_key"] and f["level"] >= 0
        ]
    finally:
        store.close()
    assert files, f"no SST of {store_dir} holds {key!r}"
    for found in files:
        sst = store_dir / found["name"].lstrip("/")
        data = bytearray(sst.read_bytes())
        for i in range(8, 72):
            data[i] = 0xA5
        sst.write_bytes(bytes(data))
    return store_dir / files[0]["name"].lstrip("/")


def write_both(
    store: StorePartition, model: dict[bytes, bytes], writes: Mapping[bytes, bytes | None]
) -> None:
    """Apply ``writes`` (None: delete) to the store and to the dict model of it."""
    store.write(writes, None)
    for key, value in writes.items():
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
