"""Local state: the store contract, its RocksDB and memory backends, sortable keys and windows.

The RocksDB backend is imported lazily so that pure users (the test driver,
window arithmetic) don't load the native library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamjoin.state.base import StorePartition
from streamjoin.state.keys import prefix_range, split_window_key, window_key
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.windows import (
    HoppingWindows,
    SessionWindows,
    SlidingWindows,
    TumblingWindows,
    WindowSpec,
)

if TYPE_CHECKING:
    from streamjoin.state.rocksdb import RocksDBOptions, RocksDBStorePartition

__all__ = [
    "HoppingWindows",
    "MemoryStorePartition",
    "RocksDBOptions",
    "RocksDBStorePartition",
    "SessionWindows",
    "SlidingWindows",
    "StorePartition",
    "TumblingWindows",
    "WindowSpec",
    "prefix_range",
    "split_window_key",
    "window_key",
]


def __getattr__(name: str) -> Any:
    if name in ("RocksDBOptions", "RocksDBStorePartition"):
        from streamjoin.state import rocksdb

        return getattr(rocksdb, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
