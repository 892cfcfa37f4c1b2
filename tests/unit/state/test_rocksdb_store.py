"""RocksDB backend: persistence, crash atomicity of data + offset, corruption handling, locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict, WriteBatch

from streamjoin.errors import StoreCorrupted, StoreError, StoreLocked
from streamjoin.state.keys import (
    META_CHANGELOG_OFFSET,
    META_FORMAT_VERSION,
    META_PARTITION,
    META_TABLE,
    METADATA_COLUMN_FAMILY,
    partition_metadata_key,
)
from streamjoin.state.rocksdb import (
    RocksDBOptions,
    RocksDBStorePartition,
    destroy,
    open_or_rebuild,
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "stores" / "counts"  # the table's database; the store is partition 3


@pytest.fixture
def opened(path: Path) -> Iterator[list[RocksDBStorePartition]]:
    """Stores a test opens are appended here and closed at teardown, even on failure."""
    stores: list[RocksDBStorePartition] = []
    yield stores
    for store in stores:
        store.close()


def open_store(
    opened: list[RocksDBStorePartition], path: Path, table: str = "counts", partition: int = 3
) -> RocksDBStorePartition:
    store = RocksDBStorePartition(path, table=table, partition=partition)
    opened.append(store)
    return store


def set_metadata(path: Path, **values: bytes) -> None:
    """Rewrite partition 3's metadata behind the store's back, as another version or a bug
    might."""
    names = {
        "format": META_FORMAT_VERSION,
        "table": META_TABLE,
        "partition": META_PARTITION,
        "offset": META_CHANGELOG_OFFSET,
    }
    opts = Options(raw_mode=True)
    families = Rdict.list_cf(str(path), opts)
    db = Rdict(str(path), opts, column_families={f: opts for f in families if f != "default"})
    meta = db.get_column_family(METADATA_COLUMN_FAMILY)
    for name, value in values.items():
        meta[partition_metadata_key(3, names[name])] = value
    del meta
    db.close()


# ------------------------------------------------------------------ persistence


def test_data_offset_and_deletes_survive_reopen(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    store.write({b"a": b"1", b"b": b"2", b"\xff": b"3"}, 41)
    store.write({b"b": None}, 42)
    store.close()
    again = open_store(opened, path)
    assert list(again.items()) == [(b"a", b"1"), (b"\xff", b"3")]
    assert again.changelog_offset() == 42


def test_bounded_scans_among_deletion_tombstones(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    """Ranges are exact whatever surrounds them: a live key just past the end, or a long run
    of deleted keys (scans pass RocksDB an upper bound, so they do not walk that run)."""
    store = open_store(opened, path)
    keys = [i.to_bytes(4, "big") for i in range(20_000)]
    store.write(dict.fromkeys(keys, b"v"), 1)
    store.write(dict.fromkeys(keys[10:19_990]), 2)  # deleted: everything but both ends
    assert [k for k, _ in store.items(keys[5], keys[12])] == keys[5:10]
    assert list(store.items(keys[100], keys[19_000])) == []
    assert [k for k, _ in store.items(keys[19_980], keys[19_992])] == keys[19_990:19_992]
    assert [k for k, _ in store.items(keys[19_998], None)] == keys[19_998:]
    assert [k for k, _ in store.items(None, keys[2])] == keys[:2]


def test_new_store_creates_missing_parents_and_has_no_offset(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    assert path.is_dir()
    assert store.changelog_offset() is None
    store.close()
    assert open_store(opened, path).changelog_offset() is None


def test_every_write_is_one_batch_with_the_offset_inside(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    real_db = store._db
    batches: list[int] = []

    class RecordingDb:
        def __getattr__(self, name: str) -> Any:
            return getattr(real_db, name)

        def write(self, batch: WriteBatch, *args: Any) -> None:
            batches.append(len(batch))
            assert real_db is not None
            real_db.write(batch, *args)

    store._db = RecordingDb()  # type: ignore[assignment]
    store.write({b"a": b"1", b"b": b"2", b"c": None}, 5)
    store.write({b"d": b"4"}, None)
    store._db = real_db
    assert batches == [4, 1]  # 3 data entries + the offset in one batch; no offset, no entry


def test_a_write_that_fails_in_rocksdb_applies_neither_data_nor_offset(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    store.write({b"a": b"1"}, 1)
    real_db = store._db

    class FailingDb:
        def __getattr__(self, name: str) -> Any:
            return getattr(real_db, name)

        def write(self, batch: WriteBatch, *args: Any) -> None:
            raise OSError("disk full")

    store._db = FailingDb()  # type: ignore[assignment]
    with pytest.raises(StoreError, match="disk full"):
        store.write({b"a": b"2", b"b": b"2"}, 2)
    store._db = real_db
    assert store.changelog_offset() == 1
    store.close()
    again = open_store(opened, path)
    assert list(again.items()) == [(b"a", b"1")]
    assert again.changelog_offset() == 1


CRASHING_WRITER = textwrap.dedent(
    """
    import sys
    from streamjoin.state.rocksdb import RocksDBStorePartition

    store = RocksDBStorePartition(sys.argv[1], table="counts", partition=3)
    i = 0
    while True:
        # batch i: its own key, a shared "latest" key, and offset i, all in one write
        store.write({b"k%08d" % i: b"x" * 100, b"latest": str(i).encode()}, i)
        if i == 200:
            print("ready", flush=True)
        i += 1
    """
)


def test_kill_9_mid_stream_leaves_data_and_offset_consistent(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)  # lands at an arbitrary point of the write loop
    finally:
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    store = open_store(opened, path)
    offset = store.changelog_offset()
    assert offset is not None and offset >= 200
    # the offset names exactly the last batch whose data is present: never more, never less
    assert store.get(b"latest") == str(offset).encode()
    keys = [k for k, _ in store.items(b"k", b"l")]
    assert keys == [b"k%08d" % i for i in range(offset + 1)]


# ------------------------------------------------------------------ corruption


def corrupt_current(path: Path) -> None:
    (path / "CURRENT").write_bytes(b"\x00\x01garbage\n")


def corrupt_manifest(path: Path) -> None:
    for manifest in path.glob("MANIFEST-*"):
        manifest.write_bytes(os.urandom(256))


def junk_without_rocksdb(path: Path) -> None:
    destroy(path)
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("not a database")


def foreign_table(path: Path) -> None:
    set_metadata(path, table=b"orders")


def foreign_partition(path: Path) -> None:
    set_metadata(path, partition=b"7")


def future_format(path: Path) -> None:
    set_metadata(path, format=b"99")


def garbled_offset(path: Path) -> None:
    set_metadata(path, offset=b"forty-two")


def plain_rocksdb_without_metadata(path: Path) -> None:
    """Partition 3's column family holds data, but no metadata names it (as an interrupted
    wipe, which deletes the metadata first, would leave it)."""
    destroy(path)
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    db = Rdict(str(path), opts, column_families={"3": opts})
    data = db.get_column_family("3")
    data[b"a"] = b"1"
    del data
    db.close()


@pytest.mark.parametrize(
    ("damage", "cause", "where"),
    [
        (corrupt_current, "RocksDB failed to open it", ""),
        (corrupt_manifest, "RocksDB failed to open it", ""),
        (junk_without_rocksdb, "no RocksDB CURRENT file", ""),
        (foreign_table, "belongs to 'orders', not table 'counts'", "3"),
        (foreign_partition, "belongs to partition 7, not 3", "3"),
        (future_format, "unknown format version 99", "3"),
        (garbled_offset, "is not an integer", "3"),
        (plain_rocksdb_without_metadata, "no streamjoin metadata", "3"),
    ],
)
def test_damaged_stores_are_reported_as_corrupted_naming_path_and_cause(
    opened: list[RocksDBStorePartition], path: Path, damage: Any, cause: str, where: str
) -> None:
    """A database that does not open is named by its directory; a damaged partition by
    its column family (``<database>/<partition>``): only that partition is rebuilt."""
    store = open_store(opened, path)
    store.write({b"a": b"1"}, 9)
    store.close()
    damage(path)
    with pytest.raises(StoreCorrupted) as info:
        open_store(opened, path)
    assert str(path) in str(info.value)
    assert cause in str(info.value)
    assert info.value.path == (path / where if where else path)


def test_open_or_rebuild_reports_wipes_and_opens_an_empty_store(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    store.write({b"a": b"1"}, 9)
    store.close()
    corrupt_current(path)
    (path / "stray-file").write_text("left over")
    reported: list[StoreCorrupted] = []
    rebuilt = open_or_rebuild(path, "counts", 3, reported.append)
    opened.append(rebuilt)
    assert len(reported) == 1 and str(path) in str(reported[0])
    assert list(rebuilt.items()) == []
    assert rebuilt.changelog_offset() is None  # recovery replays the whole changelog
    assert not (path / "stray-file").exists()
    rebuilt.write({b"b": b"2"}, 0)
    rebuilt.close()
    assert open_store(opened, path).changelog_offset() == 0  # fresh metadata is valid


def test_open_or_rebuild_keeps_a_healthy_store(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    store.write({b"a": b"1"}, 9)
    store.close()
    reported: list[StoreCorrupted] = []
    again = RocksDBStorePartition.open_or_rebuild(path, "counts", 3, reported.append)
    opened.append(again)
    assert reported == []
    assert again.get(b"a") == b"1" and again.changelog_offset() == 9


def test_open_or_rebuild_never_wipes_a_store_in_use(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    store.write({b"a": b"1"}, 9)
    reported: list[StoreCorrupted] = []
    with pytest.raises(StoreLocked, match=str(path)):
        open_or_rebuild(path, "counts", 3, reported.append)
    assert reported == []
    assert store.get(b"a") == b"1"


def test_a_store_locked_by_another_process_is_locked_not_corrupted(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    open_store(opened, path).write({b"a": b"1"}, 1)
    script = textwrap.dedent(
        """
        import sys
        from streamjoin.errors import StoreLocked
        from streamjoin.state.rocksdb import RocksDBStorePartition
        try:
            RocksDBStorePartition(sys.argv[1], table="counts", partition=3)
        except StoreLocked:
            sys.exit(0)
        sys.exit(1)
        """
    )
    result = subprocess.run([sys.executable, "-c", script, str(path)], timeout=60)
    assert result.returncode == 0


# ------------------------------------------------------------------ handles and options


def test_close_releases_the_lock_despite_unfinished_scans(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    store.write({b"a": b"1", b"b": b"2"}, 1)
    started = store.items()
    next(started)
    never_started = store.items()
    store.close()
    again = open_store(opened, path)  # rocksdict would raise "lock hold by current process"
    assert again.get(b"b") == b"2"
    del started, never_started


def test_abandoned_scans_do_not_pin_the_store(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    store = open_store(opened, path)
    store.write({b"a": b"1", b"b": b"2"}, 1)
    for _ in store.items():
        break
    store.close()
    open_store(opened, path)


def test_destroy_removes_the_directory_and_ignores_missing_ones(
    opened: list[RocksDBStorePartition], path: Path
) -> None:
    open_store(opened, path).close()
    destroy(path)
    assert not path.exists()
    destroy(path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"write_buffer_size": 0},
        {"parallelism": -1},
        {"max_background_jobs": True},
        {"compression": "brotli"},
    ],
)
def test_invalid_options_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="RocksDBOptions"):
        RocksDBOptions(**kwargs)


@pytest.mark.parametrize(
    "options",
    [
        RocksDBOptions(compression="none", use_wal=False),
        RocksDBOptions(compression="zstd", sync_writes=True, write_buffer_size=1 << 20),
    ],
)
def test_option_variants_work(path: Path, options: RocksDBOptions) -> None:
    store = RocksDBStorePartition(path, table="counts", partition=3, options=options)
    try:
        store.write({b"a": b"1"}, 1)
    finally:
        store.close()
    again = RocksDBStorePartition(path, table="counts", partition=3, options=options)
    try:
        assert again.get(b"a") == b"1" and again.changelog_offset() == 1  # clean close flushes
    finally:
        again.close()


def test_a_corrupt_data_block_found_by_a_read_raises_store_corrupted(path: Path) -> None:
    """RocksDB reports a block checksum mismatch only when the block is read: the store
    opens fine. Gets raise StoreCorrupted, and a scan does too instead of ending early (an
    iterator stops being valid on a read error; it used to look like the end of the range)."""
    from tests.unit.state.state_store_support import corrupt_data_block

    store = RocksDBStorePartition(path, table="t", partition=0)
    store.write({f"key-{i:03d}".encode(): b"v" * 20 for i in range(50)}, 7)
    store.close()
    corrupt_data_block(path, "t", 0, b"key-000")
    reopened = RocksDBStorePartition(path, table="t", partition=0)
    try:
        assert reopened.changelog_offset() == 7  # opened fine
        with pytest.raises(StoreCorrupted, match=r"corrupted: a read found Corruption: block"):
            reopened.get(b"key-000")
        with pytest.raises(StoreCorrupted):
            reopened.contains(b"key-001")
        with pytest.raises(StoreCorrupted):
            list(reopened.items())
        with pytest.raises(StoreCorrupted):
            list(reopened.items(b"key-010", b"key-020"))
    finally:
        reopened.close()
