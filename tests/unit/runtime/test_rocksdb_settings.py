"""``App(rocksdb=RocksDBOptions(...))`` reaches every store the worker opens."""

from __future__ import annotations

from pathlib import Path

import pytest

import streamjoin
from streamjoin.errors import ConfigurationError
from streamjoin.runtime.table_state.service import TableStores
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


def _options_file(store_dir: Path) -> str:
    """The OPTIONS file RocksDB writes into a store: what it actually runs with."""
    newest = max(store_dir.rglob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    return newest.read_text()


@pytest.mark.parametrize(("bits", "filtered"), [(10, True), (0, False)])
def test_stores_have_bloom_filters_unless_turned_off(
    tmp_path: Path, bits: int, filtered: bool
) -> None:
    """Whole-key bloom filters in SST files (by default): a read of a key the store does
    not hold skips the files instead of searching each."""
    app = streamjoin.App(
        "rocks", state_dir=tmp_path, rocksdb=RocksDBOptions(bloom_filter_bits=bits)
    )
    counts = app.table("counts", default=int, partitions=1)
    stores = TableStores(app.tables, app.config.state_path, app.config.rocksdb)
    store = stores.open(counts, 0)
    try:
        assert isinstance(store, RocksDBStorePartition)
        store.write({b"k": b"1"}, None)
        assert store.get(b"k") == b"1" and store.get(b"absent") is None
        written = _options_file(stores.database_path("counts"))
    finally:
        stores.close(counts, 0)
    assert ("filter_policy=bloomfilter\n" in written) is filtered
    # no memtable filters: each would take memory in every partition's memtable
    assert "memtable_prefix_bloom_size_ratio=0.000000" in written


def test_bloom_filter_bits_must_be_an_int_of_at_least_zero() -> None:
    with pytest.raises(ConfigurationError, match="bloom_filter_bits must be an int >= 0"):
        RocksDBOptions(bloom_filter_bits=-1)


def test_one_database_per_table_with_bounded_budgets_in_its_options(tmp_path: Path) -> None:
    """Every partition of a table is a column family of one database; its OPTIONS file
    shows the shared block cache, the small per-partition write buffers, the bounded open
    files and info LOG."""
    options = RocksDBOptions(block_cache_bytes=32 << 20, max_open_files=100)
    app = streamjoin.App("rocks", state_dir=tmp_path, rocksdb=options)
    counts = app.table("counts", default=int, partitions=4)
    stores = TableStores(app.tables, app.config.state_path, app.config.rocksdb)
    try:
        for p in range(4):
            stores.open(counts, p).write({b"k": str(p).encode()}, p)
        assert [d.name for d in (tmp_path / "stores").iterdir()] == ["counts"]
        written = _options_file(stores.database_path("counts"))
        assert stores.on_disk() == [("counts", p) for p in range(4)]
        assert [stores.stored_offset(counts, p) for p in range(4)] == [0, 1, 2, 3]
    finally:
        stores.close_all()
    for family in ("0", "1", "2", "3"):
        assert f'[CFOptions "{family}"]' in written
    assert "max_open_files=100" in written
    assert "write_buffer_size=16777216" in written  # each partition's memtable
    assert "max_log_file_size=1048576" in written
    assert "cache_index_and_filter_blocks=true" in written


def test_a_workers_databases_share_one_cache_and_write_buffer_budget(tmp_path: Path) -> None:
    app = streamjoin.App("rocks", state_dir=tmp_path)
    counts = app.table("counts", default=int, partitions=2)
    totals = app.table("totals", default=int, partitions=2)
    stores = TableStores(app.tables, app.config.state_path, app.config.rocksdb)
    try:
        for table in (counts, totals):
            for p in range(2):
                stores.open(table, p).write({b"k" * 10: b"v" * 1000}, None)
        first, second = stores.database(counts), stores.database(totals)
        assert first.budget is second.budget is stores.budget()
        assert stores.budget().block_cache.get_usage() <= 64 << 20
        assert stores.budget().usage()["write_buffer_bytes"] > 0  # the memtables, counted
    finally:
        stores.close_all()
