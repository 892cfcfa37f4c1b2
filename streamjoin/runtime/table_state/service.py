"""Table state at run time: local stores, restoration and standby replicas.

* :class:`TableStores` opens one store per table partition (a column family of the
  table's RocksDB database ``<state_dir>/stores/<table>``, all sharing one memory budget;
  or in memory: tables declared with ``store="memory"``, every table of an app without a
  state dir, the test driver's); flushing their buffered writes is
  :mod:`streamjoin.runtime.table_state.flush`.
* :class:`StateService` (a mode service with its own
  :class:`~streamjoin.runtime.table_state.changelog_reader.ChangelogReader`, which fetches
  raw changelog records without a consumer group) restores active partitions
  from their changelog in the background after an assignment, keeps standby
  partitions following their changelog, and keeps a cache of every local
  store's lag for the assignor's subscription userdata.
  Only the partitions still restoring wait: the consumer pauses their source
  partitions and resumes each one when its tables are ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from mode import Service

from streamjoin.errors import (
    ChangelogOffsetOutOfRange,
    InternalError,
    LifecycleError,
    StoreCorrupted,
    StoreError,
)
from streamjoin.runtime.table_state.changelog_reader import ChangelogChunk, ChangelogReader
from streamjoin.runtime.table_state.changelog_records import READ_COMMITTED, READ_UNCOMMITTED
from streamjoin.state.base import StorePartition
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.restore import RestoreAction, lag_of, plan_restore
from streamjoin.state.rocksdb import (
    RocksDBBudget,
    RocksDBOptions,
    TableDatabase,
    destroy,
    partition_path,
)
from streamjoin.state.rocksdb_options import ensure_open_files_limit
from streamjoin.tables import Table

log = logging.getLogger("streamjoin.state")

TaskKey = tuple[str, int]  # (table name, partition)


#: where the RocksDB databases of a state dir live: one directory per table
STORES_DIR = "stores"
#: where a state dir kept a RocksDB database per table partition before (discarded)
OLD_LAYOUT_DIR = "tables"


class TableStores:
    """The open stores of every table partition this worker holds, and flushing into them.

    On disk, each table is one RocksDB database (opened when first needed, with a column
    family for each of the table's partitions) and every database shares one
    :class:`~streamjoin.state.rocksdb_options.RocksDBBudget`: one block cache and one
    write-buffer budget for the whole worker. Creating it checks that the process may open
    the files those databases need (``ulimit -n``).
    """

    def __init__(
        self,
        tables: Mapping[str, Table],
        state_dir: Path | None,
        rocksdb: RocksDBOptions | None = None,
    ) -> None:
        self.tables = dict(tables)
        self.state_dir = state_dir
        #: the app's RocksDB tuning (None: the defaults)
        self.rocksdb = rocksdb
        self._by_changelog = {t.changelog.name: t for t in self.tables.values()}
        self._open: dict[TaskKey, StorePartition] = {}
        self._databases: dict[str, TableDatabase] = {}
        self._budget: RocksDBBudget | None = None
        on_disk = [t for t in self.tables.values() if self.on_disk_store(t)]
        if on_disk:
            ensure_open_files_limit(len(on_disk), rocksdb or RocksDBOptions())

    def on_disk_store(self, table: Table) -> bool:
        """Whether ``table``'s partitions live in RocksDB (else in memory: empty at every
        start, restored in full from the changelog)."""
        return self.state_dir is not None and table.store == "rocksdb"

    def table_for_changelog(self, topic: str) -> Table:
        return self._by_changelog[topic]

    def database_path(self, table: str) -> Path:
        if self.state_dir is None:
            raise InternalError("in-memory stores have no path")
        return self.state_dir / STORES_DIR / table

    def path(self, table: str, partition: int) -> Path:
        """How errors name a partition's store (its column family in the table's database)."""
        return partition_path(self.database_path(table), partition)

    def budget(self) -> RocksDBBudget:
        """The block cache and write-buffer budget every database of this worker shares."""
        if self._budget is None:
            self._budget = RocksDBBudget(self.rocksdb or RocksDBOptions())
        return self._budget

    def database(self, table: Table) -> TableDatabase:
        """The table's RocksDB database, opened on first use (a database that cannot be
        opened at all is reported, wiped and rebuilt from the changelogs)."""
        database = self._databases.get(table.name)
        if database is not None:
            return database
        path = self.database_path(table.name)
        self._discard_old_layout(table.name)
        try:
            partitions: Iterable[int] = range(table.partitions)
        except Exception:  # (a count nobody settled: the test driver's tables)
            partitions = ()
        try:
            database = self._open_database(path, table.name, partitions)
        except StoreCorrupted as exc:
            log.warning("the store of table %s is unusable and is rebuilt: %s", table.name, exc)
            destroy(path)
            database = self._open_database(path, table.name, partitions)
        self._databases[table.name] = database
        return database

    def _open_database(self, path: Path, table: str, partitions: Iterable[int]) -> TableDatabase:
        return TableDatabase(
            path, table, partitions=partitions, options=self.rocksdb, budget=self.budget()
        )

    def _discard_old_layout(self, table: str) -> None:
        """Delete the table's stores in the layout before column families (a database per
        partition): the changelog restores them (a migration would cost as much I/O)."""
        assert self.state_dir is not None
        old = self.state_dir / OLD_LAYOUT_DIR / table
        if old.is_dir():
            log.warning(
                "table %s has stores in the old layout (a RocksDB database per partition, "
                "%s); discarding them: their partitions are restored from the changelog "
                "into %s",
                table,
                old,
                self.database_path(table),
            )
            shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):
                old.parent.rmdir()  # (only once every table's old stores are gone)

    def get(self, table: str, partition: int) -> StorePartition | None:
        """The partition's store if it is open."""
        return self._open.get((table, partition))

    def open_keys(self) -> list[TaskKey]:
        return sorted(self._open)

    def open(self, table: Table, partition: int) -> StorePartition:
        store = self._open.get((table.name, partition))
        if store is not None:
            return store
        if not self.on_disk_store(table):
            store = MemoryStorePartition(table=table.name, partition=partition)
        else:

            def corrupt(exc: StoreCorrupted) -> None:
                log.warning(
                    "store %s[%d] is unusable and is rebuilt: %s", table.name, partition, exc
                )

            store = self.database(table).open_or_rebuild(partition, corrupt)
        self._open[(table.name, partition)] = store
        return store

    def close(self, table: Table, partition: int) -> None:
        store = self._open.pop((table.name, partition), None)
        if store is not None:
            store.close()

    def wipe(self, table: Table, partition: int) -> StorePartition:
        """Delete a store's data (it will be rebuilt from the changelog) and reopen it empty."""
        self.destroy(table, partition)
        return self.open(table, partition)

    def destroy(self, table: Table, partition: int) -> None:
        """Close a store and delete its data (rebuilt from the changelog when next opened):
        its metadata, then its column family."""
        self.close(table, partition)
        if self.on_disk_store(table):
            self.database(table).drop(partition)

    def key_of(self, path: Path) -> TaskKey | None:
        """The table partition whose store ``path`` names (None: not one of ours)."""
        if self.state_dir is None:
            return None
        for name, table in self.tables.items():
            if (
                self.on_disk_store(table)
                and path.parent == self.database_path(name)
                and path.name.isdigit()
            ):
                return name, int(path.name)
        return None

    def close_all(self) -> None:
        for name, partition in list(self._open):
            self.close(self.tables[name], partition)
        for database in self._databases.values():
            database.close()
        self._databases.clear()

    def on_disk(self) -> list[TaskKey]:
        """Table partitions with a store under the state dir (any owner, any age), and the
        open in-memory stores (their lag counts while they are open, as standbys)."""
        found = [key for key in self._open if not self.on_disk_store(self.tables[key[0]])]
        if self.state_dir is None:
            return sorted(found)
        for name, table in sorted(self.tables.items()):
            if not self.on_disk_store(table):
                continue
            if name not in self._databases and not self.database_path(name).is_dir():
                continue
            for partition in self.database(table).stored_partitions():
                if partition < table.partitions:
                    found.append((name, partition))
        return sorted(found)

    def stored_offset(self, table: Table, partition: int) -> int | None:
        """The changelog offset stored with a partition's store (None: none yet).

        Read-only: a corrupt store raises :class:`StoreError` and is left alone (the
        restore path, not lag reporting, decides to rebuild it).
        """
        store = self._open.get((table.name, partition))
        if store is not None:
            return store.changelog_offset()
        if not self.on_disk_store(table):
            return None
        return self.database(table).stored_offset(partition)


@dataclass(frozen=True)
class RestoreProgress:
    """How far one restore (or standby) got: records applied, left (upper bound), rate."""

    standby: bool
    applied: int
    records_left: int
    rate: float

    @property
    def eta_seconds(self) -> float | None:
        return self.records_left / self.rate if self.rate > 0 else None


@dataclass
class _Restore:
    """Progress of one partition being restored (active) or followed (standby)."""

    table: Table
    partition: int
    standby: bool
    end: int
    started: float
    #: records expected (upper bound: compaction may have removed some)
    total: int = 0
    applied: int = 0
    #: an active restore collects writes across fetches (repeated keys collapse, and big
    #: batches are much cheaper per key in RocksDB); the changelog offset they reach (the
    #: last one read or skipped: compaction gaps and transaction markers count as read)
    writes: dict[bytes, bytes | None] = field(default_factory=dict)
    last_offset: int | None = None

    def flush(self, stores: TableStores) -> None:
        """Write what was collected into the partition's store (if it is still open)."""
        store = stores.get(self.table.name, self.partition)
        if store is None:
            return
        if self.last_offset is not None:
            store.write(self.writes, self.last_offset)
        self.writes = {}
        self.last_offset = None


class StateService(Service):
    """Restores active table partitions and follows standby ones, in the background."""

    #: what a restore's log line adds for an in-memory store
    _IN_MEMORY = " (an in-memory store: it starts empty and is restored in full)"

    def __init__(
        self,
        stores: TableStores,
        *,
        bootstrap_servers: str,
        client_options: Mapping[str, Any],
        on_ready: Callable[[str, int, StorePartition], None],
        read_committed: bool = False,
        on_crash: Callable[[BaseException], None] | None = None,
        progress_interval: float = 2.0,
        lag_refresh_interval: float = 5.0,
        batch_records: int = 10_000,
        restore_write_batch: int = 100_000,
    ) -> None:
        super().__init__()
        self.stores = stores
        self._bootstrap = bootstrap_servers
        self._client_options = dict(client_options)
        self._on_ready = on_ready
        self._on_crash = on_crash
        self._progress_interval = progress_interval
        self._lag_refresh_interval = lag_refresh_interval
        self._batch_records = batch_records
        self._restore_write_batch = restore_write_batch
        #: exactly-once: changelogs are read committed, and an active restore ends only
        #: past every transaction in its changelog (a previous owner's may still be open)
        self._read_committed = read_committed
        self._reader: ChangelogReader | None = None
        self._wanted_active: dict[str, set[int]] = {}
        self._wanted_standby: dict[str, set[int]] = {}
        self._changed = asyncio.Event()
        self._restores: dict[TaskKey, _Restore] = {}
        self._lags: dict[str, dict[int, int]] = {}
        #: active partitions restored here (caught up by definition)
        self._ready: set[TaskKey] = set()
        #: stores a read found corrupted: wiped once no task uses them, then rebuilt
        self._corrupted: set[TaskKey] = set()
        self.restored_records = 0

    # ------------------------------------------------------------------ public

    def kafka_client(self) -> Any:
        """The changelog reader's aiokafka client (None when not started): the membership
        closes its connections to a broker gone silent, as the fetcher's."""
        reader = getattr(self, "_reader", None)
        return getattr(reader, "_client", None)

    def lags(self) -> dict[str, dict[int, int]]:
        """Per changelog topic and partition, how far each local store is behind.

        Stores on disk come from the periodic refresh; partitions active and restored
        here are caught up by definition, even before the next refresh sees them.
        """
        out = {t: dict(ps) for t, ps in self._lags.items()}
        for name, partition in self._ready:
            out.setdefault(self.stores.tables[name].changelog.name, {})[partition] = 0
        return out

    def set_assignment(
        self, active: Mapping[str, set[int]], standby: Mapping[str, set[int]]
    ) -> None:
        """Called on assignment (must be quick: the rebalance callback is waiting).

        Active partitions that are ready and stay active are left alone: their tasks
        keep running through a cooperative rebalance.
        """
        self._wanted_active = {t: set(ps) for t, ps in active.items()}
        self._wanted_standby = {t: set(ps) for t, ps in standby.items()}
        # (a corrupted store is never kept as ready: its task was given up before this
        # assignment, and the store is wiped and restored before the new task runs)
        self._ready = {
            (t, p)
            for t, p in self._ready
            if p in self._wanted_active.get(t, ()) and (t, p) not in self._corrupted
        }
        self._changed.set()

    def revoke(self, keys: Iterable[TaskKey]) -> None:
        """These active partitions were revoked: their stores may serve as standbys next."""
        gone = set(keys)
        self._ready -= gone
        for table, partition in gone:
            self._wanted_active.get(table, set()).discard(partition)

    def mark_corrupted(self, table: str, partition: int) -> None:
        """A read found this store corrupted (a block checksum mismatch). Its task must be
        given up (the worker does that); once it is, the next reconciliation wipes the
        store and restores it from its changelog like any other store without an offset."""
        self._corrupted.add((table, partition))
        self._changed.set()

    def is_corrupted(self, table: str, partition: int) -> bool:
        """Marked corrupted and not wiped yet."""
        return (table, partition) in self._corrupted

    def is_ready(self, table: str, partition: int) -> bool:
        return (table, partition) in self._ready

    @property
    def restoring(self) -> list[TaskKey]:
        return sorted(k for k, r in self._restores.items() if not r.standby)

    def progress(self, now: float) -> dict[TaskKey, RestoreProgress]:
        """Every partition being restored (active) or followed (standby) right now."""
        out: dict[TaskKey, RestoreProgress] = {}
        for key, r in self._restores.items():
            elapsed = max(now - r.started, 1e-6)
            out[key] = RestoreProgress(
                standby=r.standby,
                applied=r.applied,
                records_left=max(0, r.total - r.applied),
                rate=r.applied / elapsed,
            )
        return out

    # ------------------------------------------------------------------ lifecycle

    async def on_start(self) -> None:
        self._reader = ChangelogReader(
            self._bootstrap,
            self._client_options,
            isolation_level=READ_COMMITTED if self._read_committed else READ_UNCOMMITTED,
        )
        await self._reader.start()
        await self._refresh_lags()

    async def on_stop(self) -> None:
        # the background work first: it may be waiting on the reader closed below
        await self._stop_futures()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.close()
        self.stores.close_all()

    # ------------------------------------------------------------------ background work

    @Service.task
    async def _run(self) -> None:
        try:
            await self._work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.should_stop:
                log.debug("state service stopped during work: %r", exc)
                return
            # A changelog that cannot be read (or a store that cannot be written) must stop
            # the worker with that error, not leave its partitions waiting forever.
            log.error("state service failed: %s", exc, exc_info=exc)
            if self._on_crash is None:
                raise
            self._on_crash(exc)

    async def _work(self) -> None:
        last_lag_refresh = time.monotonic()
        last_progress = time.monotonic()
        while not self.should_stop:
            if self._changed.is_set():
                self._changed.clear()
                await self._reconcile()
            if self._restores:
                try:
                    await self._apply_batch()
                except StoreCorrupted as exc:
                    # a restoring or standby store: no task reads it, so wipe and plan again
                    key = self.stores.key_of(exc.path)
                    if key is None:
                        raise
                    log.warning("store %s[%d]: %s", key[0], key[1], exc)
                    self._corrupted.add(key)
                    self._changed.set()
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=1.0)
            now = time.monotonic()
            if now - last_progress >= self._progress_interval and self.restoring:
                self._log_progress()
                last_progress = now
            if now - last_lag_refresh >= self._lag_refresh_interval:
                await self._refresh_lags()
                last_lag_refresh = now

    def _changelog_tps(self, keys: Iterable[TaskKey]) -> list[TopicPartition]:
        return [TopicPartition(self.stores.tables[t].changelog.name, p) for t, p in keys]

    async def _reconcile(self) -> None:
        """Open/close stores for the new assignment and plan what to read from the changelogs."""
        reader = self._require()
        active = {(t, p) for t, ps in self._wanted_active.items() for p in ps}
        standby = {(t, p) for t, ps in self._wanted_standby.items() for p in ps} - active
        self._flush_pending()  # progress of interrupted restores is kept, not read again
        for name, partition in self.stores.open_keys():
            if (name, partition) not in active | standby:
                self.stores.close(self.stores.tables[name], partition)
        for key in sorted(self._corrupted - self._ready):  # no running task reads these
            self._corrupted.discard(key)
            log.warning(
                "store %s[%d] is corrupted; wiping it to rebuild it from its changelog", *key
            )
            self.stores.destroy(self.stores.tables[key[0]], key[1])
        wanted = sorted(active | standby)
        self._restores = {}
        if not wanted:
            reader.assign({})
            return
        tps = self._changelog_tps(wanted)
        # Read committed, the restore's end is still the high watermark: records of a
        # transaction still open (a previous owner's, killed or stalled) are waited for
        # until it commits or aborts, never left out of a store that then runs.
        ends = await reader.end_offsets(tps, high_watermark=True)
        starts = await reader.beginning_offsets(tps)
        # start offset, and the end captured now for restores (standbys follow: None)
        ranges: dict[TopicPartition, tuple[int, int | None]] = {}
        for (name, partition), tp in zip(wanted, tps, strict=True):
            table = self.stores.tables[name]
            if (name, partition) in self._ready:
                continue  # active, restored and running here: nothing to read
            if (name, partition) in self._corrupted:
                continue  # still read by its task until it is given up; wiped after that
            store = self.stores.open(table, partition)
            plan = plan_restore(store.changelog_offset(), starts[tp], ends[tp])
            if plan.action is RestoreAction.REBUILD:
                log.warning(
                    "store %s[%d]: %s; wiping and rebuilding it", name, partition, plan.reason
                )
                store = self.stores.wipe(table, partition)
            is_standby = (name, partition) in standby
            if plan.needs_restore or is_standby:
                start = plan.start if plan.start is not None else ends[tp]
                ranges[tp] = (start, None if is_standby else ends[tp])
                self._restores[(name, partition)] = _Restore(
                    table, partition, is_standby, ends[tp], time.monotonic(), plan.records
                )
                if not is_standby:
                    log.info(
                        "restoring %s[%d]: %d changelog records to replay%s",
                        name,
                        partition,
                        plan.records,
                        "" if self.stores.on_disk_store(table) else self._IN_MEMORY,
                    )
            if not plan.needs_restore and not is_standby:
                self._mark_ready(table, partition)
        reader.assign(ranges)
        for key in list(self._restores):
            restore = self._restores[key]
            tp = TopicPartition(restore.table.changelog.name, restore.partition)
            if not restore.standby and restore.end == ranges[tp][0]:
                self._finish(key)

    async def _apply_batch(self) -> None:
        reader = self._require()
        try:
            chunks = await reader.read(self._batch_records, timeout=0.2)
        except ChangelogOffsetOutOfRange as exc:
            # e.g. records deleted under a replay: plan again (plan_restore rebuilds the store)
            log.warning("%s; planning the restore again", exc)
            self._changed.set()
            return
        for tp, chunk in chunks.items():
            table = self.stores.table_for_changelog(tp.topic)
            key = (table.name, tp.partition)
            restore = self._restores.get(key)
            if restore is None or self.stores.get(table.name, tp.partition) is None:
                continue
            self._collect(restore, tp, chunk)
            # standbys apply every fetch (they must stay fresh); restores batch up
            if restore.standby or len(restore.writes) >= self._restore_write_batch:
                restore.flush(self.stores)
            if not restore.standby and chunk.next_offset >= restore.end:
                self._finish(key)

    def _collect(self, restore: _Restore, tp: TopicPartition, chunk: ChangelogChunk) -> None:
        writes = restore.writes
        for offset, key, value in chunk.records:
            if key is None:
                log.warning(
                    "changelog %s[%d]@%d has no key; skipped", tp.topic, tp.partition, offset
                )
                continue
            writes[key] = value
        restore.last_offset = chunk.next_offset - 1
        restore.applied += len(chunk.records)
        self.restored_records += len(chunk.records)

    def _flush_pending(self) -> None:
        """Write what the current restores collected into their stores (still open ones)."""
        for key, restore in self._restores.items():
            if key not in self._corrupted:  # (a corrupted store is wiped next)
                restore.flush(self.stores)

    def _finish(self, key: TaskKey) -> None:
        restore = self._restores.pop(key)
        restore.flush(self.stores)
        self._require().unassign(TopicPartition(restore.table.changelog.name, restore.partition))
        elapsed = max(time.monotonic() - restore.started, 1e-6)
        if restore.applied:
            log.info(
                "restored %s[%d]: %d records in %.2fs (%.0f records/s)",
                restore.table.name,
                restore.partition,
                restore.applied,
                elapsed,
                restore.applied / elapsed,
            )
        self._mark_ready(restore.table, restore.partition)

    def _mark_ready(self, table: Table, partition: int) -> None:
        store = self.stores.get(table.name, partition)
        if store is None:  # closed meanwhile (a newer assignment)
            return
        if partition not in self._wanted_active.get(table.name, ()):
            # revoked (or lost) while it restored: no task to announce it to. Kept as a
            # caught-up store; if the partition comes back, the next reconciliation finds
            # nothing to read and announces it then (marking it ready now would make that
            # reconciliation skip it, and the new task would wait for its table forever)
            return
        self._ready.add((table.name, partition))
        self._on_ready(table.name, partition, store)

    def _log_progress(self) -> None:
        for name, partition in self.restoring:
            r = self._restores[(name, partition)]
            elapsed = max(time.monotonic() - r.started, 1e-6)
            rate = r.applied / elapsed
            remaining = max(0, r.total - r.applied)
            eta = f"{remaining / rate:.0f}s" if rate > 0 else "?"
            log.info(
                "restoring %s[%d]: %d records so far, %.0f records/s, ETA %s",
                name,
                partition,
                r.applied,
                rate,
                eta,
            )

    async def _refresh_lags(self) -> None:
        """Recompute every local store's lag against its changelog's end offset."""
        reader = self._require()
        on_disk = self.stores.on_disk()
        if not on_disk:
            self._lags = {}
            return
        tps = self._changelog_tps(on_disk)
        try:
            ends = await reader.end_offsets(tps)
        except Exception as exc:  # missing topic, broker hiccup: keep the old cache
            log.debug("could not refresh store lags: %r", exc)
            return
        lags: dict[str, dict[int, int]] = {}
        for (name, partition), tp in zip(on_disk, tps, strict=True):
            table = self.stores.tables[name]
            try:
                offset = self.stores.stored_offset(table, partition)
            except StoreError as exc:
                log.debug("no lag reported for %s[%d]: %s", name, partition, exc)
                continue
            lags.setdefault(tp.topic, {})[partition] = lag_of(offset, ends[tp])
        self._lags = lags

    def _require(self) -> ChangelogReader:
        if self._reader is None:
            raise LifecycleError("the state service is not started")
        return self._reader
