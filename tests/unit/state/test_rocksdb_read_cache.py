"""The RocksDB store's read cache: gets always answer what RocksDB holds, whatever the
cache's bound, evictions, writes, failures and reopens."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import WriteBatch
from state_store_support import write_both

from streamjoin.errors import ConfigurationError, StoreError
from streamjoin.state.rocksdb import RocksDBOptions, RocksDBStorePartition, _entry_size
from streamjoin.state.table_partition import TablePartition

TINY = RocksDBOptions(read_cache_entries=3)


def open_store(path: Path, options: RocksDBOptions = TINY, **kw: Any) -> RocksDBStorePartition:
    return RocksDBStorePartition(path, table="t", partition=0, options=options, **kw)


#: a few small entries fit, two large ones do not (an entry costs its bytes + 100)
SMALL_BYTES = RocksDBOptions(read_cache_entries=10, read_cache_bytes=250)


def check_cache_shape(store: RocksDBStorePartition) -> None:
    """Bounded by entries and bytes, the bytes counted right, and the FIFO order holds
    exactly the cached keys."""
    assert len(store._cache) <= store._cache_bound
    assert list(store._cache_order) == list(store._cache)
    assert store._cache_bytes == sum(_entry_size(k, v) for k, v in store._cache.items())
    assert store._cache_bytes <= store._cache_bytes_bound


ALL_KEYS = [b"", b"a", b"b", b"c", b"\xff"]  # more than the cache holds (3)
KEYS = st.sampled_from(ALL_KEYS)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("get"), KEYS),
        st.tuples(
            st.just("write"),
            st.dictionaries(KEYS, st.one_of(st.none(), st.binary(max_size=90)), max_size=4),
        ),
        st.tuples(st.just("reopen"), st.none()),
    ),
    min_size=5,
    max_size=60,
)


@settings(
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@pytest.mark.parametrize("options", [TINY, SMALL_BYTES], ids=["3 entries", "250 bytes"])
@given(ops=OPS)
def test_gets_match_a_dict_model_with_constant_eviction(
    tmp_path: Path, options: RocksDBOptions, ops: list[tuple[str, Any]]
) -> None:
    path = tmp_path / f"store-{next(_ids)}"
    store = open_store(path, options)
    model: dict[bytes, bytes] = {}
    try:
        for op, arg in ops:
            if op == "get":
                assert store.get(arg) == model.get(arg)
                assert store.contains(arg) == (arg in model)
            elif op == "write":
                write_both(store, model, arg)
            else:
                store.close()
                store = open_store(path, options)
            check_cache_shape(store)
        for key in ALL_KEYS:
            assert store.get(key) == model.get(key)
    finally:
        store.close()


_ids = itertools.count()


def test_a_key_read_absent_then_written_is_read_back(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    try:
        assert store.get(b"k") is None
        assert store._cache == {b"k": None}  # the absence is cached
        store.write({b"k": b"1"}, 1)
        assert store._cache == {b"k": b"1"}  # written through
        assert store.get(b"k") == b"1"
        store.write({b"k": None}, 2)
        assert store.get(b"k") is None
        assert not store.contains(b"k")
    finally:
        store.close()


def test_writes_update_cached_keys_and_do_not_insert_others(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    try:
        store.write({b"a": b"1"}, None)
        assert store._cache == {}
        assert store.get(b"a") == b"1"
        store.write({b"a": b"2", b"b": b"2"}, None)
        assert store._cache == {b"a": b"2"}
        for key in (b"b", b"c", b"d"):  # a, b, c, d: a is evicted first (FIFO)
            store.get(key)
        assert list(store._cache) == [b"b", b"c", b"d"]
        check_cache_shape(store)
        value = store.get(b"b")
        assert type(value) is bytes and value == b"2"
    finally:
        store.close()


class _DbWhoseWriteFails:
    """Wraps the store's Rdict; ``write`` raises, after applying the batch if ``applied``
    (an outcome in doubt: RocksDB may have applied a batch it reports as failed)."""

    def __init__(self, real: Any, applied: bool) -> None:
        self.real = real
        self.applied = applied

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def write(self, batch: WriteBatch, *args: Any) -> None:
        if self.applied:
            self.real.write(batch, *args)
        raise OSError("disk full")


@pytest.mark.parametrize("applied", [False, True], ids=["not-applied", "applied"])
def test_a_failing_rocksdb_write_leaves_no_stale_cached_value(
    tmp_path: Path, applied: bool
) -> None:
    store = open_store(tmp_path / "s")
    try:
        store.write({b"a": b"1"}, 1)
        assert store.get(b"a") == b"1" and store.get(b"b") is None  # both cached
        real = store._db
        store._db = _DbWhoseWriteFails(real, applied)  # type: ignore[assignment]
        with pytest.raises(StoreError, match="disk full"):
            store.write({b"a": b"2", b"b": b"2"}, 2)
        store._db = real
        assert store._cache == {}
        check_cache_shape(store)
        # whatever RocksDB holds now, gets say the same
        assert store.get(b"a") == (b"2" if applied else b"1")
        assert store.get(b"b") == (b"2" if applied else None)
    finally:
        store.close()


def test_a_write_refused_before_rocksdb_changes_nothing(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    try:
        store.write({b"a": b"1"}, 1)
        assert store.get(b"a") == b"1"
        with pytest.raises(TypeError):
            store.write({b"a": b"2", b"b": "not bytes"}, 2)  # type: ignore[dict-item]
        assert store.get(b"a") == b"1" and store.get(b"b") is None
    finally:
        store.close()


def test_read_only_handles_do_not_cache(tmp_path: Path) -> None:
    path = tmp_path / "s"
    writer = open_store(path)
    try:
        writer.write({b"a": b"1"}, 1)
        reader = open_store(path, read_only=True)  # no lock: coexists with the writer
        try:
            assert reader._cache_bound == 0
            assert reader.get(b"a") == b"1"
            assert reader.get(b"missing") is None
            assert reader._cache == {}
        finally:
            reader.close()
    finally:
        writer.close()


def test_zero_entries_disables_the_cache(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", RocksDBOptions(read_cache_entries=0))
    try:
        store.write({b"a": b"1"}, 1)
        assert store.get(b"a") == b"1" and store.get(b"b") is None
        store.write({b"a": b"2"}, 2)
        assert store.get(b"a") == b"2"
        assert store._cache == {}
    finally:
        store.close()


def test_the_default_bound() -> None:
    assert RocksDBOptions().read_cache_entries == 10_000


@pytest.mark.parametrize("bad", [-1, True, False, 1.5, "10"])
def test_bad_cache_bounds_are_refused_naming_the_option(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"RocksDBOptions\.read_cache_entries"):
        RocksDBOptions(read_cache_entries=bad)


def test_a_closed_store_answers_no_get_even_for_a_cached_key(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    store.write({b"a": b"1"}, 1)
    assert store.get(b"a") == b"1" and store.get(b"b") is None
    store.close()
    assert store._cache == {}
    with pytest.raises(StoreError, match="is closed"):
        store.get(b"a")
    store._cache[b"a"] = b"1"  # even if an entry survived close, the closed check comes first
    with pytest.raises(StoreError, match="is closed"):
        store.get(b"a")
    with pytest.raises(StoreError, match="is closed"):
        store.contains(b"b")


def test_a_value_larger_than_the_byte_bound_is_read_but_not_cached(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", RocksDBOptions(read_cache_bytes=1_000))
    try:
        store.write({b"big": b"x" * 2_000, b"small": b"y"}, None)
        assert store.get(b"big") == b"x" * 2_000
        assert store.get(b"small") == b"y"
        assert list(store._cache) == [b"small"]
        check_cache_shape(store)
    finally:
        store.close()


def test_a_cached_value_that_grows_evicts_the_oldest_entries(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", RocksDBOptions(read_cache_bytes=1_000))
    try:
        store.write({b"a": b"1", b"b": b"2", b"c": b"3"}, None)
        for key in (b"a", b"b", b"c"):
            store.get(key)
        store.write({b"c": b"z" * 700}, None)  # 3 entries of ~100 + 700 bytes: over 1,000
        assert list(store._cache) == [b"b", b"c"]
        assert store.get(b"c") == b"z" * 700
        check_cache_shape(store)
    finally:
        store.close()


def test_the_byte_bound_is_validated(tmp_path: Path) -> None:
    assert RocksDBOptions().read_cache_bytes == 1024 * 1024
    with pytest.raises(ConfigurationError, match=r"RocksDBOptions\.read_cache_bytes"):
        RocksDBOptions(read_cache_bytes=-1)
    store = open_store(tmp_path / "s", RocksDBOptions(read_cache_bytes=0))
    try:
        store.write({b"a": b"1"}, None)
        assert store.get(b"a") == b"1"
        assert not store._cache
    finally:
        store.close()


@settings(
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_a_table_partition_reading_the_cache_itself_answers_as_the_store(
    tmp_path: Path, ops: list[tuple[str, Any]]
) -> None:
    """``TablePartition.lookup`` answers a hit of the store's ``read_cache`` without calling
    ``get``: through evictions, writes and reopens it answers what RocksDB holds."""
    path = tmp_path / f"table-{next(_ids)}"
    store = open_store(path)
    part = TablePartition("t", 0, store)
    model: dict[bytes, bytes] = {}
    try:
        for op, arg in ops:
            if op == "get":
                assert part.lookup(arg) == model.get(arg)
            elif op == "write":
                write_both(store, model, arg)
            else:
                store.close()
                store = open_store(path)
                part = TablePartition("t", 0, store)
            assert store.read_cache is store._cache
            check_cache_shape(store)
    finally:
        store.close()


def test_a_table_partition_over_a_closed_store_answers_no_cached_key(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    part = TablePartition("t", 0, store)
    store.write({b"a": b"1"}, 1)
    assert part.lookup(b"a") == b"1" and store.read_cache == {b"a": b"1"}
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        part.lookup(b"a")
