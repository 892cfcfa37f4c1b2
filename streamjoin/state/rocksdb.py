"""RocksDB store backend (rocksdict): one database directory per table partition (I/O).

Layout: user keys live in the default column family untouched; metadata
(format version, table, partition, changelog offset) lives in the
:data:`~streamjoin.state.keys.METADATA_COLUMN_FAMILY` column family, so it can
never collide with a user key and never shows up in :meth:`items` or
:meth:`count`. Every :meth:`write` is one ``WriteBatch`` spanning both column
families: data and offset reach the WAL, and survive a crash, together.

rocksdict notes (0.3.29): keys/values are raw bytes (``raw_mode``), so nothing
is pickled; a scan's start is applied by seeking and its end both by comparing
keys here and by ``ReadOptions.set_iterate_upper_bound``. RocksDB needs that
bound: without it a seek steps over every deletion tombstone after the range
looking for a live key (milliseconds per scan once a join buffer has expired a
few hundred thousand entries, against microseconds with it).
``set_iterate_lower_bound`` is never used: rocksdict's sets the upper bound. Any
live iterator or
column-family handle keeps the database (and its LOCK file) open after
``close()``, so this class tracks and releases them.

Point reads go through a bounded per-partition read cache (see
:meth:`RocksDBStorePartition.get`): a ``dict`` lookup costs about a tenth of
``Rdict.get``. It is correct because :meth:`RocksDBStorePartition.write` is the
only writer of the directory while a writable handle is open (RocksDB's LOCK
keeps other processes out) and every call runs on one thread (the event loop).
"""

from __future__ import annotations

import enum
import shutil
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    ColumnFamily,
    DBCompressionType,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from streamjoin.errors import (
    ArgumentTypeError,
    ConfigurationError,
    StoreCorrupted,
    StoreError,
    StoreLocked,
)
from streamjoin.state.base import check_changelog_offset, unordered_items
from streamjoin.state.keys import (
    FORMAT_VERSION,
    META_CHANGELOG_OFFSET,
    META_FORMAT_VERSION,
    META_PARTITION,
    META_TABLE,
    METADATA_COLUMN_FAMILY,
)

__all__ = ["RocksDBOptions", "RocksDBStorePartition", "destroy", "open_or_rebuild"]

_MiB = 1024 * 1024
_MEMTABLE_BLOOM_RATIO = 0.01
Compression = Literal["none", "lz4", "snappy", "zstd"]


@dataclass(frozen=True)
class RocksDBOptions:
    """Tuning for a write-heavy streaming store; the defaults suit most tables.

    The WAL stays on (``use_wal``): without it a process crash loses the
    memtable, which the changelog could replay, but only by making recovery
    longer. Correctness does not depend on it: ``atomic_flush`` makes the data
    and metadata column families flush together, so even with the WAL off the
    stored offset never gets ahead of the data. Writes are not fsynced
    (``sync_writes``): a lost OS-level tail is replayed from the changelog.

    ``read_cache_entries`` and ``read_cache_bytes`` bound each store partition's
    read cache (either at 0 turns it off). 10,000 entries hold a typical partition's
    hot rows (the enrichment benchmark's table has about 1,250 per partition); the
    1 MiB bound keeps large rows from multiplying that: an entry counts its key's and
    value's bytes plus 100 (an entry with a 20-byte key and a 60-byte value takes 130
    to 190 bytes, measured). So a worker holds at most about 1 MiB per store partition
    it reads by key, 100 MiB with 100 of them. Only keys read by key (``get``,
    ``contains``) are cached, so stores that are scanned or only written (join buffers)
    stay small.
    """

    write_buffer_size: int = 64 * _MiB
    max_write_buffer_number: int = 3
    target_file_size_base: int = 64 * _MiB
    max_background_jobs: int = 4
    parallelism: int = 2
    compression: Compression = "lz4"
    use_wal: bool = True
    sync_writes: bool = False
    #: LOG (info log) files kept per store; they pile up across restarts otherwise
    keep_log_files: int = 3
    #: entries in each store partition's read cache; 0 disables it
    read_cache_entries: int = 10_000
    #: bytes of keys and values (plus about 100 per entry for the objects) in each store
    #: partition's read cache: large rows fill fewer entries
    read_cache_bytes: int = 1 * _MiB
    #: bits per key of the bloom filters over whole keys, in each SST file and in the
    #: memtables (0: none). A read of a key the store does not hold (a new window, a key
    #: seen for the first time) then skips nearly every file instead of searching each;
    #: Kafka Streams sets them too
    bloom_filter_bits: int = 10

    def __post_init__(self) -> None:
        for name in (
            "write_buffer_size",
            "max_write_buffer_number",
            "target_file_size_base",
            "max_background_jobs",
            "parallelism",
            "keep_log_files",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(
                    f"RocksDBOptions.{name} must be a positive int, got {value!r}"
                )
        for name in ("read_cache_entries", "read_cache_bytes", "bloom_filter_bits"):
            bound = getattr(self, name)
            if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
                raise ConfigurationError(
                    f"RocksDBOptions.{name} must be an int >= 0 (0 disables the cache), "
                    f"got {bound!r}"
                )
        if self.compression not in _COMPRESSION:
            raise ConfigurationError(
                f"RocksDBOptions.compression must be one of {sorted(_COMPRESSION)}, "
                f"got {self.compression!r}"
            )

    def db_options(self) -> Options:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.increase_parallelism(self.parallelism)
        opts.set_max_background_jobs(self.max_background_jobs)
        opts.set_write_buffer_size(self.write_buffer_size)
        opts.set_max_write_buffer_number(self.max_write_buffer_number)
        opts.set_target_file_size_base(self.target_file_size_base)
        opts.set_level_compaction_dynamic_level_bytes(True)
        opts.set_compression_type(_COMPRESSION[self.compression]())
        opts.set_atomic_flush(True)
        opts.set_keep_log_file_num(self.keep_log_files)
        if self.bloom_filter_bits:
            table = BlockBasedOptions()
            table.set_bloom_filter(self.bloom_filter_bits, False)  # (full filters, not per block)
            opts.set_block_based_table_factory(table)
            # a memtable's filter takes this share of the write buffer (0.64 MiB of 64 MiB:
            # about 500,000 keys at 10 bits each)
            opts.set_memtable_prefix_bloom_ratio(_MEMTABLE_BLOOM_RATIO)
            opts.set_memtable_whole_key_filtering(True)
        return opts

    def write_options(self) -> WriteOptions:
        opts = WriteOptions()
        # At runtime both are properties; rocksdict's stub wrongly declares disable_wal a method.
        opts.disable_wal = not self.use_wal  # type: ignore[method-assign, assignment]
        opts.sync = self.sync_writes
        return opts


_COMPRESSION: dict[str, Callable[[], DBCompressionType]] = {
    "none": DBCompressionType.none,
    "lz4": DBCompressionType.lz4,
    "snappy": DBCompressionType.snappy,
    "zstd": DBCompressionType.zstd,
}


def destroy(path: Path | str) -> None:
    """Delete a store directory and everything in it. Close the store first."""
    if Path(path).exists():
        shutil.rmtree(path)


def open_or_rebuild(
    path: Path | str,
    table: str,
    partition: int,
    on_corrupt: Callable[[StoreCorrupted], None],
    *,
    options: RocksDBOptions | None = None,
) -> RocksDBStorePartition:
    """Function form of :meth:`RocksDBStorePartition.open_or_rebuild`."""
    return RocksDBStorePartition.open_or_rebuild(
        path, table, partition, on_corrupt, options=options
    )


def _open_error(path: Path, exc: Exception) -> StoreError:
    """Classify a rocksdict open failure: a held LOCK is not corruption, anything else is."""
    message = str(exc)
    if "lock" in message.lower() and message.startswith("IO error"):
        return StoreLocked(path, message)
    return StoreCorrupted(path, f"RocksDB failed to open it: {message}")


def _read_error(path: Path, exc: Exception) -> Exception:
    """Classify a failed read or write of an open store: RocksDB's ``Corruption`` status (a
    block checksum mismatch, a truncated file) is :class:`StoreCorrupted`, which the
    runtime answers by rebuilding the partition; anything else stays a :class:`StoreError`."""
    message = str(exc)
    if message.startswith("Corruption"):
        return StoreCorrupted(path, f"a read found {message}")
    return StoreError(f"local store at {path}: {message}")


def _is_rocksdb_dir(path: Path) -> bool:
    return (path / "CURRENT").is_file()


class _Missing(enum.Enum):
    MISSING = 0


#: a read cache miss (None is a cached answer: the key is absent)
_MISS: Final = _Missing.MISSING


#: what a cache entry costs besides its key's and value's bytes: the two bytes objects'
#: headers (33 each), the dict slot and the deque slot (measured 130-190 bytes in all for a
#: 20-byte key and a 60-byte value)
_CACHE_ENTRY_OVERHEAD = 100


def _value_size(value: bytes | None) -> int:
    return 0 if value is None else len(value)


def _entry_size(key: bytes, value: bytes | None) -> int:
    return len(key) + _value_size(value) + _CACHE_ENTRY_OVERHEAD


class RocksDBStorePartition:
    """One table partition's state in its own RocksDB directory.

    Opening validates the store: it must be readable and its metadata must
    name this ``table`` and ``partition`` and a known format version, or
    :class:`StoreCorrupted` is raised (see :meth:`open_or_rebuild`). A held
    lock raises :class:`StoreLocked` instead, which callers must not wipe.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        table: str,
        partition: int,
        options: RocksDBOptions | None = None,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.table = table
        self.partition = partition
        self.options = options or RocksDBOptions()
        self._offset: int | None = None
        self._live_scans: weakref.WeakSet[_Scan] = weakref.WeakSet()
        #: key -> value (None: absent) of recent reads; see get(). A read-only handle
        #: caches nothing: another process writes its directory behind its back.
        self._cache: dict[bytes, bytes | None] = {}
        #: the cache's keys in insertion order, for FIFO eviction (0.17 us each). Evicting
        #: with ``del cache[next(iter(cache))]`` looks as cheap but is not: a deleted dict
        #: entry leaves a hole until the next resize, and iter() walks past every hole
        #: (8.4 us per eviction measured at 10,000 entries).
        self._cache_order: deque[bytes] = deque()
        self._cache_bound = 0 if read_only else self.options.read_cache_entries
        self._cache_bytes_bound = self.options.read_cache_bytes
        #: what the cached entries take, as _entry_size counts it
        self._cache_bytes = 0
        if not self._cache_bytes_bound:
            self._cache_bound = 0

        if self.path.exists() and not self.path.is_dir():
            raise StoreCorrupted(self.path, "the path exists but is not a directory")
        existed = _is_rocksdb_dir(self.path)
        if read_only and not existed:
            raise StoreError(f"no store at {self.path}")
        if not existed and self.path.is_dir() and any(self.path.iterdir()):
            raise StoreCorrupted(self.path, "the directory has files but no RocksDB CURRENT file")
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            # Read-only handles take no lock: inspection works while a worker runs.
            db = Rdict(
                str(self.path),
                self.options.db_options(),
                column_families={METADATA_COLUMN_FAMILY: Options(raw_mode=True)},
                access_type=AccessType.read_only() if read_only else AccessType.read_write(),
            )
        except Exception as exc:  # rocksdict raises plain Exception for every open failure
            raise _open_error(self.path, exc) from exc
        self._db: Rdict | None = db
        self._meta: Rdict | None = None
        self._meta_handle: ColumnFamily | None = None
        try:
            if not read_only:
                db.set_write_options(self.options.write_options())
            self._meta = db.get_column_family(METADATA_COLUMN_FAMILY)
            self._meta_handle = db.get_column_family_handle(METADATA_COLUMN_FAMILY)
            if existed:
                self._offset = self._validate_metadata()
            else:
                self._write_initial_metadata()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return (
            f"RocksDBStorePartition(table={self.table!r}, partition={self.partition}, "
            f"path={str(self.path)!r})"
        )

    # ---------------------------------------------------------------- open / validate

    def _write_initial_metadata(self) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(META_FORMAT_VERSION, str(FORMAT_VERSION).encode(), self._meta_handle)
        batch.put(META_TABLE, self.table.encode(), self._meta_handle)
        batch.put(META_PARTITION, str(self.partition).encode(), self._meta_handle)
        self._open_db().write(batch)

    def _read_meta(self, name: bytes) -> bytes | None:
        meta = self._meta
        if meta is None:
            raise StoreError(f"{self!r} is closed")
        try:
            value = meta.get(name)
        except Exception as exc:
            raise StoreCorrupted(self.path, f"metadata {name!r} is unreadable: {exc}") from exc
        if value is not None and not isinstance(value, bytes):
            raise StoreCorrupted(self.path, f"metadata {name!r} is not bytes")
        return value

    def _read_meta_int(self, name: bytes) -> int | None:
        raw = self._read_meta(name)
        if raw is None:
            return None
        try:
            return int(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise StoreCorrupted(
                self.path, f"metadata {name!r} is not an integer: {raw!r}"
            ) from exc

    def _validate_metadata(self) -> int | None:
        version = self._read_meta_int(META_FORMAT_VERSION)
        if version is None:
            raise StoreCorrupted(self.path, "it has no streamjoin metadata (format version)")
        if version != FORMAT_VERSION:
            raise StoreCorrupted(
                self.path,
                f"unknown format version {version} (this build reads {FORMAT_VERSION})",
            )
        table = self._read_meta(META_TABLE)
        if table != self.table.encode():
            found = "no table" if table is None else repr(table.decode(errors="replace"))
            raise StoreCorrupted(self.path, f"it belongs to {found}, not table {self.table!r}")
        partition = self._read_meta_int(META_PARTITION)
        if partition != self.partition:
            raise StoreCorrupted(
                self.path, f"it belongs to partition {partition}, not {self.partition}"
            )
        offset = self._read_meta_int(META_CHANGELOG_OFFSET)
        if offset is not None and offset < 0:
            raise StoreCorrupted(self.path, f"stored changelog offset {offset} is negative")
        return offset

    @classmethod
    def open_or_rebuild(
        cls,
        path: Path | str,
        table: str,
        partition: int,
        on_corrupt: Callable[[StoreCorrupted], None],
        *,
        options: RocksDBOptions | None = None,
    ) -> RocksDBStorePartition:
        """Open the store; if it is corrupted, report it, wipe it and start empty.

        The fresh store has no changelog offset, so recovery rebuilds it from
        the start of the changelog. :class:`StoreLocked` propagates: a store in
        use is never wiped.
        """
        try:
            return cls(path, table=table, partition=partition, options=options)
        except StoreCorrupted as exc:
            on_corrupt(exc)
            destroy(path)
            return cls(path, table=table, partition=partition, options=options)

    # ---------------------------------------------------------------- reads

    def _open_db(self) -> Rdict:
        db = self._db
        if db is None:
            raise StoreError(f"{self!r} is closed")
        return db

    def get(self, key: bytes) -> bytes | None:
        """Answer from the read cache, or read RocksDB and cache the answer (absent keys
        too, as None). A hit is one dict lookup: no recency bookkeeping, so eviction is
        FIFO. Values are immutable bytes: handing out the cached object is safe."""
        db = self._db
        if db is None:  # checked first: a closed store answers nothing, not even a hit
            raise StoreError(f"{self!r} is closed")
        value = self._cache.get(key, _MISS)
        if value is not _MISS:
            return value
        try:
            value = db.get(key)
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status
            raise _read_error(self.path, exc) from exc
        if value is not None and not isinstance(value, bytes):
            value = bytes(value)
        if self._cache_bound:
            size = _entry_size(key, value)
            if size <= self._cache_bytes_bound:  # (a value larger than the cache is not kept)
                self._cache_bytes += size
                self._evict(self._cache_bound - 1, self._cache_bytes_bound)
                self._cache[key] = value
                self._cache_order.append(key)
        return value

    def _evict(self, entries: int, size: int) -> None:
        """Drop the oldest entries until at most ``entries`` are left and they take at most
        ``size`` bytes (the bytes of an entry being added are counted already)."""
        cache, order = self._cache, self._cache_order
        while len(cache) > entries or self._cache_bytes > size:
            if not order:
                self._cache_bytes = 0
                return
            key = order.popleft()
            self._cache_bytes -= _entry_size(key, cache.pop(key))

    def contains(self, key: bytes) -> bool:
        return self.get(key) is not None

    def items(
        self, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        db = self._open_db()
        if end is None:
            it = db.iter()
        else:
            bounded = ReadOptions()
            bounded.set_iterate_upper_bound(end)
            it = db.iter(bounded)
        scan = _Scan(it, start, end, self.path)
        self._live_scans.add(scan)
        return scan

    def range_items(self, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """Like :meth:`items`, read at once: no scan object to track, and the native
        iterator is gone when this returns (a join reads one small range per event)."""
        bounded = ReadOptions()
        bounded.set_iterate_upper_bound(end)
        it = self._open_db().iter(bounded)
        it.seek(start)
        found: list[tuple[bytes, bytes]] = []
        while it.valid():
            key: bytes = it.key()
            if key >= end:  # (the bound is checked here too: see _Scan)
                return found
            found.append((key, it.value()))
            it.next()
        try:  # not valid: the range's end, or a read error (never let that pass for the end)
            it.status()
        except Exception as exc:
            raise _read_error(self.path, exc) from exc
        return found

    # ---------------------------------------------------------------- writes

    def write(self, writes: Mapping[bytes, bytes | None], changelog_offset: int | None) -> None:
        if self.read_only:
            raise StoreError(f"{self!r} was opened read-only")
        db = self._open_db()
        check_changelog_offset(self._offset, changelog_offset, where=repr(self))
        batch = WriteBatch(raw_mode=True)
        try:
            for key, value in unordered_items(writes):
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
        except (KeyError, ValueError) as exc:  # rocksdict's raw-mode type errors
            raise ArgumentTypeError(
                f"store keys and values are bytes (None deletes): {exc}"
            ) from exc
        if changelog_offset is not None:
            batch.put(META_CHANGELOG_OFFSET, str(changelog_offset).encode(), self._meta_handle)
        if batch.is_empty():
            return
        entries = len(batch)  # counted now: rocksdict consumes the batch, len() then raises
        try:
            db.write(batch)
        except Exception as exc:
            self._clear_cache()  # what RocksDB holds after a failed write is not ours to know
            if str(exc).startswith("Corruption"):
                raise _read_error(self.path, exc) from exc
            raise StoreError(f"{self!r}: write of {entries} entries failed: {exc}") from exc
        self._write_through(writes)
        if changelog_offset is not None:
            self._offset = changelog_offset

    def _write_through(self, writes: Mapping[bytes, bytes | None]) -> None:
        """Bring cached keys up to date with a write that RocksDB applied.

        Written keys that are not cached are not inserted. A table that reads a key
        before writing it (a count, an aggregate) has it cached already, so its next
        read after the flush hits anyway; the keys written unread are a join buffer's
        entries (scanned, never read by key), a restore's batches (up to 100,000 keys)
        and blind puts, which would fill the cache with entries nobody reads and cost an
        eviction each. An empty cache (nothing read yet, as during a restore) costs
        nothing here.
        """
        cache = self._cache
        if not cache:
            return
        grown = 0
        for key, value in unordered_items(writes):
            old = cache.get(key, _MISS)
            if old is not _MISS:
                cache[key] = value
                grown += _value_size(value) - _value_size(old)
        if grown:
            self._cache_bytes += grown
            self._evict(self._cache_bound, self._cache_bytes_bound)

    def _clear_cache(self) -> None:
        self._cache.clear()
        self._cache_order.clear()
        self._cache_bytes = 0

    # ---------------------------------------------------------------- metadata / stats

    def changelog_offset(self) -> int | None:
        self._open_db()
        return self._offset

    def count(self) -> int:
        """RocksDB's estimate (``rocksdb.estimate-num-keys``): it may count overwritten
        and deleted keys until compaction; exact counting would read the whole store."""
        estimate = self._open_db().property_int_value("rocksdb.estimate-num-keys")
        return estimate or 0

    def size_bytes(self) -> int:
        """Bytes of all files in the store directory (SSTs, WAL, manifest, logs)."""
        self._open_db()
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())

    def close(self) -> None:
        """Close unfinished scans and handles first: each one keeps RocksDB's LOCK held."""
        db, self._db = self._db, None
        for scan in list(self._live_scans):
            scan.abort()
        self._live_scans.clear()
        self._meta = None
        self._meta_handle = None
        self._clear_cache()
        if db is not None:
            db.close()


class _Scan(Iterator[tuple[bytes, bytes]]):
    """A bounded forward scan over the default column family.

    The start is applied by seeking; the end is checked here too, not only by
    the iterator's upper bound (rocksdict's bound setters have been wrong
    before: see the module notes). A read error ends the scan with
    :class:`StoreCorrupted` or :class:`StoreError`, never silently. The native
    iterator is dropped as soon as the scan ends or the store closes, since a
    live one keeps the database open; a scan cut short by ``close()`` raises
    a ``StoreError`` instead of ending as if the range were exhausted.
    """

    __slots__ = ("__weakref__", "_aborted", "_end", "_it", "_path")

    def __init__(self, it: RdictIter, start: bytes | None, end: bytes | None, path: Path) -> None:
        self._path = path
        if start is None:
            it.seek_to_first()
        else:
            it.seek(start)
        self._it: RdictIter | None = it
        self._end = end
        self._aborted = False

    def __next__(self) -> tuple[bytes, bytes]:
        it = self._it
        if it is None:
            if self._aborted:
                raise StoreError("the store was closed during a scan")
            raise StopIteration
        if not it.valid():
            # an iterator also stops being valid on a read error (a corrupt block): never
            # let that pass for the end of the range
            self._it = None
            try:
                it.status()
            except Exception as exc:
                raise _read_error(self._path, exc) from exc
            raise StopIteration
        key: bytes = it.key()
        if self._end is not None and key >= self._end:
            self._it = None
            raise StopIteration
        value: bytes = it.value()
        it.next()
        return key, value

    def abort(self) -> None:
        if self._it is not None:
            self._it = None
            self._aborted = True
