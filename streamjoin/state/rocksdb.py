"""RocksDB store backend (rocksdict): one database per table, a column family per partition (I/O).

Layout: ``<dir>`` is one table's database (a worker's is ``<state_dir>/stores/<table>``).
Partition ``p``'s keys live untouched in column family ``"p"``; every partition's
metadata (format version, table, partition, changelog offset) lives in the
:data:`~streamjoin.state.keys.METADATA_COLUMN_FAMILY` column family under keys starting
with ``b"p/"``, so it can never collide with a user key and never shows up in
:meth:`RocksDBStorePartition.items` or :meth:`~RocksDBStorePartition.count`. Every
:meth:`~RocksDBStorePartition.write` is one ``WriteBatch`` spanning both column
families: data and offset reach the WAL, and survive a crash, together.

One database per table, not per partition: a database holds about 6 file descriptors
and its own memtables and caches even when empty, so thousands of partitions per worker
would need thousands of files and gigabytes. Column families share the database's WAL,
table cache (bounded by ``max_open_files``) and the worker's
:class:`~streamjoin.state.rocksdb_options.RocksDBBudget`. A partition is still deleted
alone (its metadata, then its column family is dropped, so a crash in between leaves
data without metadata, which the next open discards) and a corrupt partition is rebuilt
alone; only a database that fails to open as a whole (a damaged MANIFEST or CURRENT
file) is rebuilt whole.

Column families are created when the database opens (all a table's partitions at once,
then the database is reopened): RocksDB rewrites its OPTIONS file, listing every column
family, on each later creation (a quarter of a second each with 1,000 of them) and
keeps a directory handle per column family created while it is open.

rocksdict notes (0.3.29): keys/values are raw bytes (``raw_mode``), so nothing
is pickled; a scan's start is applied by seeking and its end both by comparing
keys here and by ``ReadOptions.set_iterate_upper_bound``. RocksDB needs that
bound: without it a seek steps over every deletion tombstone after the range
looking for a live key (milliseconds per scan once a join buffer has expired a
few hundred thousand entries, against microseconds with it).
``set_iterate_lower_bound`` is never used: rocksdict's sets the upper bound. Any
live iterator or column-family handle keeps the database (and its LOCK file) open
after ``close()``, so these classes track and release them.

Point reads go through a bounded per-partition read cache (see
:meth:`RocksDBStorePartition.get`): a ``dict`` lookup costs about a tenth of
``Rdict.get``. It is correct because :meth:`RocksDBStorePartition.write` is the
only writer of its column family while a writable handle is open (RocksDB's LOCK
keeps other processes out) and every call runs on one thread (the event loop).
"""

from __future__ import annotations

import enum
import shutil
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

from rocksdict import (
    AccessType,
    ColumnFamily,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
)

from streamjoin.errors import (
    ArgumentTypeError,
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
    partition_column_family,
    partition_metadata_key,
)
from streamjoin.state.rocksdb_options import RocksDBBudget, RocksDBOptions

__all__ = [
    "RocksDBBudget",
    "RocksDBOptions",
    "RocksDBStorePartition",
    "TableDatabase",
    "destroy",
    "open_or_rebuild",
    "partition_path",
    "write_staged_partition",
]

_PARTITION_METADATA = (META_FORMAT_VERSION, META_TABLE, META_PARTITION, META_CHANGELOG_OFFSET)
#: where a bootstrap's tasks leave partitions for the database to ingest when it next opens
STAGING_DIR = "staged"


def destroy(path: Path | str) -> None:
    """Delete a database directory and everything in it. Close it first."""
    if Path(path).exists():
        shutil.rmtree(path)


def partition_path(database: Path, partition: int) -> Path:
    """The path naming one partition of a table database in errors (its column family:
    not a directory of its own); :class:`StoreCorrupted` raised for a partition carries it."""
    return database / partition_column_family(partition)


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


def _parse_int(path: Path, name: bytes, raw: bytes | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreCorrupted(path, f"metadata {name!r} is not an integer: {raw!r}") from exc


class TableDatabase:
    """One table's RocksDB database: a column family per partition, one for metadata.

    A worker opens one per table (:class:`~streamjoin.runtime.table_state.service.TableStores`)
    with the partitions the table has, and hands out :class:`RocksDBStorePartition` views
    of it. ``read_only`` opens take no lock (inspection while a worker runs) and see the
    database as of their open. Raises :class:`StoreLocked` when another handle holds the
    database and :class:`StoreCorrupted` (naming the directory) when it cannot be opened.
    """

    def __init__(
        self,
        path: Path | str,
        table: str,
        *,
        partitions: Iterable[int] = (),
        options: RocksDBOptions | None = None,
        budget: RocksDBBudget | None = None,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        self.table = table
        self.read_only = read_only
        self.options = options or RocksDBOptions()
        self.budget = budget or RocksDBBudget(self.options)
        self._partitions: dict[int, RocksDBStorePartition] = {}
        self._db: Rdict | None = None
        self._meta: Rdict | None = None
        self._meta_handle: ColumnFamily | None = None
        if self.path.exists() and not self.path.is_dir():
            raise StoreCorrupted(self.path, "the path exists but is not a directory")
        existed = _is_rocksdb_dir(self.path)
        if read_only and not existed:
            raise StoreError(f"no store at {self.path}")
        if (
            not existed
            and self.path.is_dir()
            and any(child.name != STAGING_DIR for child in self.path.iterdir())
        ):
            raise StoreCorrupted(self.path, "the directory has files but no RocksDB CURRENT file")
        self.path.mkdir(parents=True, exist_ok=True)
        families = self._list_families() if existed else {"default"}
        wanted = families | {METADATA_COLUMN_FAMILY}
        if not read_only:
            wanted |= {partition_column_family(p) for p in partitions}
        if wanted - families and not read_only:
            # created at open (fast), then reopened: RocksDB keeps a directory handle per
            # column family created in this session until the database closes
            self._open(wanted)
            self._close_db()
        self._open(wanted)
        if not read_only:
            self._ingest_staged()

    def __repr__(self) -> str:
        return f"TableDatabase(table={self.table!r}, path={str(self.path)!r})"

    # ---------------------------------------------------------------- open / close

    def _list_families(self) -> set[str]:
        try:
            return set(Rdict.list_cf(str(self.path), Options(raw_mode=True)))
        except Exception as exc:  # rocksdict raises plain Exception for every open failure
            raise _open_error(self.path, exc) from exc

    def _open(self, families: set[str]) -> None:
        opts = self.options.db_options(self.budget)
        try:
            # Read-only handles take no lock: inspection works while a worker runs.
            db = Rdict(
                str(self.path),
                opts,
                column_families={name: opts for name in families if name != "default"},
                access_type=(
                    AccessType.read_only(False) if self.read_only else AccessType.read_write()
                ),
            )
        except Exception as exc:
            raise _open_error(self.path, exc) from exc
        self._db = db
        try:
            if not self.read_only:
                db.set_write_options(self.options.write_options())
            self._meta = db.get_column_family(METADATA_COLUMN_FAMILY)
            self._meta_handle = db.get_column_family_handle(METADATA_COLUMN_FAMILY)
        except Exception as exc:
            self._close_db()
            raise _open_error(self.path, exc) from exc

    def _close_db(self) -> None:
        db, self._db = self._db, None
        self._meta = None
        self._meta_handle = None
        if db is not None:
            db.close()

    def close(self) -> None:
        """Close every partition view, then the database; idempotent."""
        for store in list(self._partitions.values()):
            store.close()
        self._partitions.clear()
        self._close_db()

    def _require(self) -> Rdict:
        db = self._db
        if db is None:
            raise StoreError(f"{self!r} is closed")
        return db

    # ---------------------------------------------------------------- partitions

    def partition(self, partition: int) -> RocksDBStorePartition:
        """The open view of ``partition``: validated, or created empty (new metadata).

        Raises :class:`StoreCorrupted` (naming :func:`partition_path`) when the partition's
        metadata names another table, partition or format, or it holds data without
        metadata (left by an interrupted wipe); :meth:`open_or_rebuild` drops it then.
        """
        store = self._partitions.get(partition)
        if store is not None:
            return store
        store = RocksDBStorePartition(
            self.path, table=self.table, partition=partition, database=self
        )
        self._partitions[partition] = store
        return store

    def open_or_rebuild(
        self, partition: int, on_corrupt: Callable[[StoreCorrupted], None]
    ) -> RocksDBStorePartition:
        """:meth:`partition`; a corrupted partition is reported, dropped and opened empty."""
        try:
            return self.partition(partition)
        except StoreCorrupted as exc:
            on_corrupt(exc)
            self.drop(partition)
            return self.partition(partition)

    def _forget(self, store: RocksDBStorePartition) -> None:
        if self._partitions.get(store.partition) is store:
            del self._partitions[store.partition]

    def stored_partitions(self) -> list[int]:
        """Partitions with metadata in this database (each one's store exists)."""
        self._require()
        meta = self._meta
        assert meta is not None
        suffix = b"/" + META_FORMAT_VERSION
        found: list[int] = []
        it = meta.iter()
        it.seek_to_first()
        while it.valid():
            key = it.key()
            if isinstance(key, bytes) and key.endswith(suffix):
                head = key[: -len(suffix)]
                if head.isdigit():
                    found.append(int(head))
            it.next()
        return sorted(found)

    def read_metadata(self, partition: int, name: bytes) -> bytes | None:
        meta = self._meta
        if meta is None:
            raise StoreError(f"{self!r} is closed")
        where = partition_path(self.path, partition)
        try:
            value = meta.get(partition_metadata_key(partition, name))
        except Exception as exc:
            raise StoreCorrupted(where, f"metadata {name!r} is unreadable: {exc}") from exc
        if value is not None and not isinstance(value, bytes):
            raise StoreCorrupted(where, f"metadata {name!r} is not bytes")
        return value

    def stored_offset(self, partition: int) -> int | None:
        """The changelog offset stored with ``partition`` (None: none, or no store); a
        garbled one raises :class:`StoreCorrupted`."""
        open_store = self._partitions.get(partition)
        if open_store is not None:
            return open_store.changelog_offset()
        raw = self.read_metadata(partition, META_CHANGELOG_OFFSET)
        return _parse_int(partition_path(self.path, partition), META_CHANGELOG_OFFSET, raw)

    def drop(self, partition: int) -> None:
        """Delete one partition's state: its metadata first (one batch), then its column
        family (its files go with it, corrupt ones included), which is created again
        empty. A crash in between leaves data without metadata: discarded at next open."""
        if self.read_only:
            raise StoreError(f"{self!r} was opened read-only")
        store = self._partitions.get(partition)
        if store is not None:
            store.close()
        db = self._require()
        batch = WriteBatch(raw_mode=True)
        for name in _PARTITION_METADATA:
            batch.delete(partition_metadata_key(partition, name), self._meta_handle)
        db.write(batch)
        family = partition_column_family(partition)
        try:
            db.drop_column_family(family)
        except Exception as exc:
            if "not exist" not in str(exc) and "not found" not in str(exc).lower():
                raise StoreError(f"{self!r}: dropping partition {partition} failed: {exc}") from exc
        db.create_column_family(family, self.options.db_options(self.budget))

    def column_family(self, partition: int) -> tuple[Rdict, ColumnFamily | None]:
        """``partition``'s column family (and its handle, for batches), created if missing."""
        db = self._require()
        family = partition_column_family(partition)
        try:
            cf = db.get_column_family(family)
        except Exception as exc:
            if self.read_only:
                raise StoreError(f"no store for partition {partition} in {self.path}") from exc
            cf = db.create_column_family(family, self.options.db_options(self.budget))
        handle = None if self.read_only else db.get_column_family_handle(family)
        return cf, handle

    @property
    def metadata(self) -> tuple[Rdict, ColumnFamily | None]:
        self._require()
        assert self._meta is not None
        return self._meta, self._meta_handle

    # ---------------------------------------------------------------- bootstrap staging

    def _ingest_staged(self) -> None:
        """Ingest the partitions a bootstrap staged (:func:`write_staged_partition`): each
        one's SST file into its column family, then its metadata. A partition that already
        has metadata here is not overwritten (its staged files are removed)."""
        staging = self.path / STAGING_DIR
        if not staging.is_dir():
            return
        for marker in sorted(staging.glob("*.offset")):
            partition = int(marker.stem)
            sst = staging / f"{partition}.sst"
            offset = int(marker.read_text().strip())
            if self.read_metadata(partition, META_FORMAT_VERSION) is None:
                cf, _ = self.column_family(partition)
                if _has_data(cf):  # a leftover without metadata
                    del cf
                    self.drop(partition)
                    cf, _ = self.column_family(partition)
                if sst.is_file():
                    cf.ingest_external_file([str(sst)])
                del cf
                batch = WriteBatch(raw_mode=True)
                _put_initial_metadata(batch, self.table, partition, self._meta_handle)
                batch.put(
                    partition_metadata_key(partition, META_CHANGELOG_OFFSET),
                    str(offset).encode(),
                    self._meta_handle,
                )
                self._require().write(batch)
            sst.unlink(missing_ok=True)
            marker.unlink()
        shutil.rmtree(staging, ignore_errors=True)


def _put_initial_metadata(
    batch: WriteBatch, table: str, partition: int, handle: ColumnFamily | None
) -> None:
    batch.put(
        partition_metadata_key(partition, META_FORMAT_VERSION),
        str(FORMAT_VERSION).encode(),
        handle,
    )
    batch.put(partition_metadata_key(partition, META_TABLE), table.encode(), handle)
    batch.put(partition_metadata_key(partition, META_PARTITION), str(partition).encode(), handle)


def write_staged_partition(
    database: Path | str, partition: int, items: Iterable[tuple[bytes, bytes]], offset: int
) -> None:
    """Stage one partition's state for ``database`` without opening it (a bootstrap's Spark
    tasks run in parallel, and a database has one writer): ``items``, sorted by key, go
    into an SST file, then a marker with the changelog ``offset`` they reach. The next
    writable open of the database ingests them (:class:`TableDatabase`)."""
    staging = Path(database) / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    sst = staging / f"{partition}.sst"
    writer = SstFileWriter(Options(raw_mode=True))
    writer.open(str(sst))
    written = 0
    for key, value in items:
        writer[key] = value
        written += 1
    if written:
        writer.finish()
    else:
        del writer
        sst.unlink(missing_ok=True)
    marker = staging / f"{partition}.offset"
    partial = staging / f"{partition}.offset.partial"
    partial.write_text(f"{offset}\n")
    partial.rename(marker)  # (the marker appears whole, after the SST file)


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


def _has_data(cf: Rdict) -> bool:
    it = cf.iter()
    it.seek_to_first()
    return it.valid()


class RocksDBStorePartition:
    """One table partition's state: a column family of its table's database.

    ``database`` is the shared :class:`TableDatabase` (a worker's); without one the
    partition opens its own at ``path`` (a table database directory) and closes it with
    itself. Opening validates the partition: its metadata must name this ``table`` and
    ``partition`` and a known format version, or :class:`StoreCorrupted` is raised (see
    :meth:`open_or_rebuild`). A held lock raises :class:`StoreLocked` instead, which
    callers must not wipe.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        table: str,
        partition: int,
        options: RocksDBOptions | None = None,
        read_only: bool = False,
        database: TableDatabase | None = None,
    ) -> None:
        owned: TableDatabase | None = None
        if database is None:
            owned = database = TableDatabase(
                path, table, partitions=[partition], options=options, read_only=read_only
            )
        self._database: TableDatabase | None = database
        self._owned = owned
        #: the table database's directory
        self.path = database.path
        #: how errors name this partition (:func:`partition_path`)
        self.where = partition_path(database.path, partition)
        self.read_only = database.read_only
        self.table = table
        self.partition = partition
        self.options = database.options
        self._offset: int | None = None
        self._offset_key = partition_metadata_key(partition, META_CHANGELOG_OFFSET)
        self._write_options = self.options.write_options()
        self._live_scans: weakref.WeakSet[_Scan] = weakref.WeakSet()
        #: key -> value (None: absent) of recent reads; see get(). A read-only handle
        #: caches nothing: another process writes its directory behind its back.
        self._cache: dict[bytes, bytes | None] = {}
        #: the same dict, for a caller that answers a hit itself (``TablePartition``'s
        #: compiled lookup: a hit then costs no Python frame). Never replaced, only
        #: changed in place, and emptied on close, so a hit there is what get() answers.
        self.read_cache = self._cache
        #: the cache's keys in insertion order, for FIFO eviction (0.17 us each). Evicting
        #: with ``del cache[next(iter(cache))]`` looks as cheap but is not: a deleted dict
        #: entry leaves a hole until the next resize, and iter() walks past every hole
        #: before it (quadratic: 12 us per eviction at 20,000 entries, measured).
        self._cache_order: deque[bytes] = deque()
        self._cache_bound = 0 if self.read_only else self.options.read_cache_entries
        self._cache_bytes_bound = self.options.read_cache_bytes
        #: what the cached entries take, as _entry_size counts it
        self._cache_bytes = 0
        if not self._cache_bytes_bound:
            self._cache_bound = 0
        self._db: Rdict | None = None
        self._handle: ColumnFamily | None = None
        self._meta_handle: ColumnFamily | None = None
        try:
            self._db, self._handle = database.column_family(partition)
            self._meta_handle = database.metadata[1]
            self._offset = self._validate_metadata()
        except BaseException:
            self.close()
            raise
        if owned is not None:
            owned._partitions[partition] = self

    def __repr__(self) -> str:
        return (
            f"RocksDBStorePartition(table={self.table!r}, partition={self.partition}, "
            f"path={str(self.path)!r})"
        )

    # ---------------------------------------------------------------- open / validate

    def _read_meta_int(self, name: bytes) -> int | None:
        return _parse_int(
            self.where, name, self._require_database().read_metadata(self.partition, name)
        )

    def _require_database(self) -> TableDatabase:
        database = self._database
        if database is None:
            raise StoreError(f"{self!r} is closed")
        return database

    def _validate_metadata(self) -> int | None:
        """The stored offset of a valid partition; a new partition gets its metadata."""
        database = self._require_database()
        version = self._read_meta_int(META_FORMAT_VERSION)
        if version is None:
            if self.read_only:
                raise StoreError(f"no store for partition {self.partition} in {self.path}")
            leftover = [
                name
                for name in _PARTITION_METADATA
                if database.read_metadata(self.partition, name) is not None
            ]
            if leftover or _has_data(self._open_db()):
                raise StoreCorrupted(
                    self.where, "it holds data but no streamjoin metadata (format version)"
                )
            batch = WriteBatch(raw_mode=True)
            _put_initial_metadata(batch, self.table, self.partition, self._meta_handle)
            self._open_db().write(batch, self._write_options)
            return None
        if version != FORMAT_VERSION:
            raise StoreCorrupted(
                self.where,
                f"unknown format version {version} (this build reads {FORMAT_VERSION})",
            )
        table = database.read_metadata(self.partition, META_TABLE)
        if table != self.table.encode():
            found = "no table" if table is None else repr(table.decode(errors="replace"))
            raise StoreCorrupted(self.where, f"it belongs to {found}, not table {self.table!r}")
        partition = self._read_meta_int(META_PARTITION)
        if partition != self.partition:
            raise StoreCorrupted(
                self.where, f"it belongs to partition {partition}, not {self.partition}"
            )
        offset = self._read_meta_int(META_CHANGELOG_OFFSET)
        if offset is not None and offset < 0:
            raise StoreCorrupted(self.where, f"stored changelog offset {offset} is negative")
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
        """Open the partition (in its own database handle); if it is corrupted, report it,
        wipe it and start empty: the partition alone, or the whole database when that
        cannot be opened.

        The fresh partition has no changelog offset, so recovery rebuilds it from the
        start of the changelog. :class:`StoreLocked` propagates: a store in use is never
        wiped.
        """
        try:
            return cls(path, table=table, partition=partition, options=options)
        except StoreCorrupted as exc:
            on_corrupt(exc)
            if exc.path == Path(path):
                destroy(path)
            else:
                database = TableDatabase(path, table, options=options)
                try:
                    database.drop(partition)
                finally:
                    database.close()
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
            raise _read_error(self.where, exc) from exc
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
        scan = _Scan(it, start, end, self.where)
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
            raise _read_error(self.where, exc) from exc
        return found

    # ---------------------------------------------------------------- writes

    def write(self, writes: Mapping[bytes, bytes | None], changelog_offset: int | None) -> None:
        if self.read_only:
            raise StoreError(f"{self!r} was opened read-only")
        db = self._open_db()
        check_changelog_offset(self._offset, changelog_offset, where=repr(self))
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(self._handle)
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
            batch.put(self._offset_key, str(changelog_offset).encode(), self._meta_handle)
        if batch.is_empty():
            return
        entries = len(batch)  # counted now: rocksdict consumes the batch, len() then raises
        try:
            db.write(batch, self._write_options)
        except Exception as exc:
            self._clear_cache()  # what RocksDB holds after a failed write is not ours to know
            if str(exc).startswith("Corruption"):
                raise _read_error(self.where, exc) from exc
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
        """Bytes of the partition's SST files plus its memtables (RocksDB's properties)."""
        db = self._open_db()
        files = db.property_int_value("rocksdb.total-sst-files-size") or 0
        memtables = db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        return files + memtables

    def close(self) -> None:
        """Close unfinished scans and handles first: each one keeps RocksDB's LOCK held.
        The shared database stays open (unless this partition opened its own)."""
        db, self._db = self._db, None
        for scan in list(self._live_scans):
            scan.abort()
        self._live_scans.clear()
        self._handle = None
        self._meta_handle = None
        self._clear_cache()
        database, self._database = self._database, None
        if database is not None:
            database._forget(self)
        owned, self._owned = self._owned, None
        if owned is not None:
            if db is not None:
                db.close()  # (an alias of this view elsewhere would keep the LOCK otherwise)
            owned.close()


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
