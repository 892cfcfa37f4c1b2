"""Shared helpers for the store tests (imported by conftest and the test modules)."""

from __future__ import annotations

import itertools
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
