"""RocksDB tuning, the memory every store of a worker shares, and the open-files check (I/O).

A worker holds one RocksDB database per table and a column family per table partition
(see :mod:`streamjoin.state.rocksdb`). What would otherwise grow with the number of
partitions is shared or bounded here: one block cache (data, index and filter blocks of
every store), one write-buffer manager bounding all memtables together, ``max_open_files``
SST files per database, and one small info LOG per database.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    WriteBufferManager,
    WriteOptions,
)

from streamjoin.errors import ConfigurationError

__all__ = ["RocksDBBudget", "RocksDBOptions", "ensure_open_files_limit", "open_files_needed"]

_MiB = 1024 * 1024
_ARENA_BLOCK_BYTES = 16 * 1024
Compression = Literal["none", "lz4", "snappy", "zstd"]

#: files a table database holds open besides its SST files: LOCK, LOG, the WAL (two while
#: it rolls), MANIFEST, the directory (twice), the OPTIONS file while it is rewritten
FILES_PER_DATABASE = 10
#: what a worker needs besides its stores: broker sockets, the web server, Python's own
FILES_BESIDES_STORES = 256


@dataclass(frozen=True)
class RocksDBOptions:
    """Tuning for a write-heavy streaming store; the defaults suit most tables.

    Memory is bounded per worker, not per store: ``block_cache_bytes`` is one LRU cache
    for every store's data, index and filter blocks, and ``write_buffer_budget_bytes``
    bounds every memtable together (the largest is flushed when they exceed it), so a
    worker's RocksDB memory does not grow with the number of partitions it holds.
    ``write_buffer_size`` is one partition's memtable size before it is flushed (the
    budget flushes the largest earlier when a worker holds many; smaller ones cost CPU
    in flushes and compactions: a simulated join store took 35% more CPU with 4 MiB).
    ``write_buffers_in_block_cache`` charges memtables to the block cache too (one bound
    for both; reads then get less cache while writes are heavy). ``max_open_files``
    bounds the SST files each table database keeps open.

    The WAL stays on (``use_wal``): without it a process crash loses the memtables,
    which the changelog could replay, but only by making recovery longer. With the WAL
    a partition's data and offset, written in one batch, survive a crash together; with
    it off, ``atomic_flush`` keeps the stored offsets from getting ahead of the data (at
    the cost of flushing every partition's memtable at once). Writes are not fsynced
    (``sync_writes``): a lost OS-level tail is replayed from the changelog.

    ``read_cache_entries`` and ``read_cache_bytes`` bound each store partition's Python
    read cache (either at 0 turns it off). 10,000 entries hold a typical partition's hot
    rows; the 1 MiB bound keeps large rows from multiplying that: an entry counts its
    key's and value's bytes plus 100. Only keys read by key (``get``, ``contains``) are
    cached, so stores that are scanned or only written (join buffers) stay small.
    """

    #: one partition's memtable before it is flushed
    write_buffer_size: int = 16 * _MiB
    max_write_buffer_number: int = 2
    target_file_size_base: int = 64 * _MiB
    max_background_jobs: int = 4
    parallelism: int = 2
    compression: Compression = "lz4"
    use_wal: bool = True
    sync_writes: bool = False
    #: info LOG files kept per table database; each rolls at ``max_log_file_bytes``
    keep_log_files: int = 3
    max_log_file_bytes: int = 1 * _MiB
    #: the one block cache of every store of the worker
    block_cache_bytes: int = 64 * _MiB
    #: all memtables of the worker together
    write_buffer_budget_bytes: int = 64 * _MiB
    #: count memtables against the block cache as well (one bound for both)
    write_buffers_in_block_cache: bool = False
    #: SST files each table database keeps open (RocksDB's table cache)
    max_open_files: int = 256
    #: entries in each store partition's read cache; 0 disables it
    read_cache_entries: int = 10_000
    #: bytes of keys and values (plus about 100 per entry for the objects) in each store
    #: partition's read cache: large rows fill fewer entries
    read_cache_bytes: int = 1 * _MiB
    #: bits per key of the bloom filters over whole keys in each SST file (0: none): a read
    #: of a key the store does not hold then skips nearly every file; Kafka Streams sets
    #: them too. (No memtable filters: each would cost memory in every partition.)
    bloom_filter_bits: int = 10

    def __post_init__(self) -> None:
        for name in (
            "write_buffer_size",
            "max_write_buffer_number",
            "target_file_size_base",
            "max_background_jobs",
            "parallelism",
            "keep_log_files",
            "max_log_file_bytes",
            "block_cache_bytes",
            "write_buffer_budget_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(
                    f"RocksDBOptions.{name} must be a positive int, got {value!r}"
                )
        if (
            isinstance(self.max_open_files, bool)
            or not isinstance(self.max_open_files, int)
            or self.max_open_files < 16
        ):
            raise ConfigurationError(
                "RocksDBOptions.max_open_files must be an int >= 16 (RocksDB keeps about 10 "
                f"of them for itself), got {self.max_open_files!r}"
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

    def db_options(self, budget: RocksDBBudget) -> Options:
        """The database's options (also every column family's: RocksDB copies them)."""
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.increase_parallelism(self.parallelism)
        opts.set_max_background_jobs(self.max_background_jobs)
        opts.set_write_buffer_size(self.write_buffer_size)
        opts.set_max_write_buffer_number(self.max_write_buffer_number)
        # RocksDB reserves a memtable's memory in blocks of write_buffer_size / 8, and the
        # write-buffer manager counts reserved blocks: with thousands of partitions their
        # first blocks alone would exceed the budget and flush without end
        opts.set_arena_block_size(_ARENA_BLOCK_BYTES)
        opts.set_write_buffer_manager(budget.write_buffers)
        # the WAL is kept until every partition holding data in it has flushed: bound it,
        # or one rarely written partition keeps every log file alive
        opts.set_max_total_wal_size(2 * self.write_buffer_budget_bytes)
        opts.set_target_file_size_base(self.target_file_size_base)
        opts.set_level_compaction_dynamic_level_bytes(True)
        opts.set_compression_type(_COMPRESSION[self.compression]())
        opts.set_atomic_flush(not self.use_wal)
        opts.set_max_open_files(self.max_open_files)
        opts.set_keep_log_file_num(self.keep_log_files)
        opts.set_max_log_file_size(self.max_log_file_bytes)
        table = BlockBasedOptions()
        table.set_block_cache(budget.block_cache)
        # index and filter blocks live in the bounded cache too, not beside it per file
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        if self.bloom_filter_bits:
            table.set_bloom_filter(self.bloom_filter_bits, False)  # (full filters, not per block)
        opts.set_block_based_table_factory(table)
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


class RocksDBBudget:
    """The memory one worker's stores share: one block cache and one write-buffer manager.

    Create one per worker (per :class:`~streamjoin.runtime.table_state.service.TableStores`)
    and hand it to every table database it opens.
    """

    def __init__(self, options: RocksDBOptions) -> None:
        self.options = options
        self.block_cache = Cache(options.block_cache_bytes)
        if options.write_buffers_in_block_cache:
            self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
                options.write_buffer_budget_bytes, False, self.block_cache
            )
        else:
            self.write_buffers = WriteBufferManager(options.write_buffer_budget_bytes, False)

    def usage(self) -> dict[str, int]:
        """Bytes in the block cache and in memtables right now (for status and benchmarks)."""
        return {
            "block_cache_bytes": self.block_cache.get_usage(),
            "write_buffer_bytes": self.write_buffers.get_usage(),
        }


def open_files_needed(databases: int, options: RocksDBOptions) -> int:
    """File descriptors a worker with ``databases`` table databases may hold at once."""
    return databases * (options.max_open_files + FILES_PER_DATABASE) + FILES_BESIDES_STORES


def ensure_open_files_limit(databases: int, options: RocksDBOptions) -> int:
    """Make sure the process may open the files its stores need: raise the soft
    ``RLIMIT_NOFILE`` towards the hard limit if it is lower (silently, as Kafka's own
    scripts do), or raise :class:`ConfigurationError` naming ``ulimit -n`` and the numbers.
    Returns the limit in force."""
    needed = open_files_needed(databases, options)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed if soft == resource.RLIM_INFINITY else soft
    raised = needed if hard == resource.RLIM_INFINITY else min(hard, max(needed, soft))
    if raised > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (OSError, ValueError):
            pass
    if soft < needed:
        raise ConfigurationError(
            f"this worker may need {needed} open files ({databases} table database(s) x "
            f"({options.max_open_files} SST files (RocksDBOptions.max_open_files) + "
            f"{FILES_PER_DATABASE} others) + {FILES_BESIDES_STORES} for sockets and the rest), "
            f"but the open-files limit is {soft} (hard limit {_limit(hard)}): raise it "
            f"(`ulimit -n {needed}` in the shell that starts the worker, LimitNOFILE= in a "
            "systemd unit, --ulimit nofile= for docker) or lower "
            "RocksDBOptions.max_open_files"
        )
    return soft


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)
