"""``App(rocksdb=RocksDBOptions(...))`` reaches every store the worker opens."""

from __future__ import annotations

from pathlib import Path

import pytest

import streamjoin
from streamjoin.errors import ConfigurationError
from streamjoin.runtime.state import TableStores
from streamjoin.state import RocksDBOptions
from streamjoin.state.rocksdb import RocksDBStorePartition


def test_the_apps_rocksdb_options_open_its_stores(tmp_path: Path) -> None:
    options = RocksDBOptions(read_cache_entries=0, compression="none")
    app = streamjoin.App("rocks", state_dir=tmp_path, rocksdb=options)
    counts = app.table("counts", default=int, partitions=2)
    assert app.config.rocksdb is options
    stores = TableStores(app.tables, app.config.state_path, app.config.rocksdb)
    store = stores.open(counts, 1)
    try:
        assert isinstance(store, RocksDBStorePartition)
        assert store.options is options
        store.write({b"k": b"1"}, None)
        assert store.get(b"k") == b"1"
        assert not store._cache  # read_cache_entries=0: nothing cached
        assert stores.stored_offset(counts, 0) is None  # (the probe of a closed partition)
    finally:
        stores.close(counts, 1)


def test_the_default_is_rocksdb_options_defaults(tmp_path: Path) -> None:
    app = streamjoin.App("rocks", state_dir=tmp_path)
    counts = app.table("counts", default=int, partitions=1)
    stores = TableStores(app.tables, app.config.state_path, app.config.rocksdb)
    store = stores.open(counts, 0)
    try:
        assert isinstance(store, RocksDBStorePartition)
        assert store.options == RocksDBOptions()
    finally:
        stores.close(counts, 0)


def test_other_values_are_refused_by_name() -> None:
    with pytest.raises(
        ConfigurationError, match=r"rocksdb must be a streamjoin\.state\.RocksDBOptions"
    ):
        streamjoin.App("rocks", rocksdb={"read_cache_entries": 0})  # type: ignore[arg-type]
    app = streamjoin.App("rocks")
    with pytest.raises(ConfigurationError, match="rocksdb must be"):
        app.configure(rocksdb="small")
    app.configure(rocksdb=RocksDBOptions(read_cache_bytes=0))
    assert app.config.rocksdb == RocksDBOptions(read_cache_bytes=0)
