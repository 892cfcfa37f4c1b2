"""One RocksDB database per table: partitions as column families, rebuilt and deleted
alone, staged bootstrap partitions, the old layout discarded, the open-files check."""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import streamjoin
from streamjoin.errors import StoreCorrupted
from streamjoin.runtime.table_state.service import TableStores
from streamjoin.state.rocksdb import TableDatabase, write_staged_partition
from streamjoin.state.rocksdb_options import (
    RocksDBOptions,
    ensure_open_files_limit,
    open_files_needed,
)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_many_partitions_share_one_database_and_a_few_files(tmp_path: Path) -> None:
    before = _fds()
    database = TableDatabase(tmp_path / "counts", "counts", partitions=range(200))
    try:
        for p in range(200):
            database.partition(p).write({b"k": str(p).encode()}, p)
        # one LOCK, LOG, WAL, MANIFEST...: not 6 per partition (1,200), nor a directory
        # handle per column family created
        assert _fds() - before < 30
        assert database.stored_partitions() == list(range(200))
    finally:
        database.close()
    again = TableDatabase(tmp_path / "counts", "counts")
    try:
        assert [again.stored_offset(p) for p in (0, 199)] == [0, 199]
        assert again.partition(42).get(b"k") == b"42"
    finally:
        again.close()


def test_a_damaged_partition_is_rebuilt_alone(tmp_path: Path) -> None:
    database = TableDatabase(tmp_path / "counts", "counts", partitions=range(3))
    try:
        for p in range(3):
            database.partition(p).write({b"k": b"v"}, 5)
        database.partition(1).close()
        # partition 1's metadata now names another table
        meta, handle = database.metadata
        meta[b"1/table"] = b"orders"
        del meta, handle
        reported: list[StoreCorrupted] = []
        rebuilt = database.open_or_rebuild(1, reported.append)
        assert [r.path for r in reported] == [tmp_path / "counts" / "1"]
        assert list(rebuilt.items()) == [] and rebuilt.changelog_offset() is None
        assert database.partition(0).get(b"k") == b"v"  # the others are untouched
        assert database.stored_offset(2) == 5
    finally:
        database.close()


def test_data_left_without_metadata_is_discarded_not_trusted(tmp_path: Path) -> None:
    """A wipe deletes the metadata first, then the column family: a crash in between
    leaves data nobody vouches for."""
    database = TableDatabase(tmp_path / "counts", "counts", partitions=[0])
    try:
        database.partition(0).write({b"stale": b"1"}, 7)
        database.partition(0).close()
        meta, handle = database.metadata
        for name in (b"format-version", b"table", b"partition", b"changelog-offset"):
            del meta[b"0/" + name]
        del meta, handle
        with pytest.raises(StoreCorrupted, match="holds data but no streamjoin metadata"):
            database.partition(0)
        fresh = database.open_or_rebuild(0, lambda exc: None)
        assert list(fresh.items()) == [] and fresh.changelog_offset() is None
    finally:
        database.close()


def test_staged_partitions_are_ingested_with_their_offsets(tmp_path: Path) -> None:
    path = tmp_path / "profiles"
    write_staged_partition(path, 0, [(b"a", b"1"), (b"b", b"2")], 11)
    write_staged_partition(path, 3, [(b"c", b"3")], 4)
    database = TableDatabase(path, "profiles", partitions=range(4))
    try:
        assert database.stored_partitions() == [0, 3]
        assert list(database.partition(0).items()) == [(b"a", b"1"), (b"b", b"2")]
        assert database.partition(3).changelog_offset() == 4
        assert database.partition(0).changelog_offset() == 11
        assert not (path / "staged").exists()
    finally:
        database.close()


def test_stores_in_the_old_layout_are_discarded_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = tmp_path / "tables" / "counts" / "0"
    old.mkdir(parents=True)
    (old / "CURRENT").write_text("MANIFEST-000001\n")
    app = streamjoin.App("rocks", state_dir=tmp_path)
    counts = app.table("counts", default=int, partitions=1)
    stores = TableStores(app.tables, app.config.state_path, app.config.rocksdb)
    try:
        with caplog.at_level(logging.WARNING, logger="streamjoin.state"):
            store = stores.open(counts, 0)
        assert store.changelog_offset() is None  # restored from the changelog
        assert not (tmp_path / "tables").exists()
        assert "old layout (a RocksDB database per partition" in caplog.text
    finally:
        stores.close_all()


_LOW_HARD_LIMIT = textwrap.dedent(
    """
    import resource
    from streamjoin.errors import ConfigurationError
    from streamjoin.state.rocksdb_options import RocksDBOptions, ensure_open_files_limit

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))  # (for good: a child process)
    assert ensure_open_files_limit(1, RocksDBOptions()) == 1024  # 522 fit
    try:
        ensure_open_files_limit(3, RocksDBOptions(max_open_files=1000))
    except ConfigurationError as exc:
        print(exc)
    """
)


def test_a_file_limit_too_low_names_ulimit_and_the_numbers() -> None:
    assert open_files_needed(3, RocksDBOptions(max_open_files=1000)) == 3 * (1000 + 10) + 256
    result = subprocess.run(
        [sys.executable, "-c", _LOW_HARD_LIMIT], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert "ulimit -n 3286" in message and "limit is 1024 (hard limit 1024)" in message
    assert "RocksDBOptions.max_open_files" in message


def test_a_low_soft_limit_is_raised_towards_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit ({hard}) leaves no room to raise")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (600, hard))
        assert ensure_open_files_limit(4, RocksDBOptions()) >= open_files_needed(
            4, RocksDBOptions()
        )
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 1320
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
