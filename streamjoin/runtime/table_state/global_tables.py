"""Global tables at run time: a local copy of every partition of each global table's topic.

:class:`GlobalTableService` (built by the worker before its agents start) opens one
store per global table (RocksDB under ``<state_dir>/global/<table>``, or memory), reads
every partition of the table's topic with its own
:class:`~streamjoin.runtime.table_state.changelog_reader.ChangelogReader` (no consumer
group: every worker reads everything) from the positions stored with the rows, restores
up to the end offsets found at start (logging progress and an ETA), attaches the copy to
the declaration, and then follows the topic in the background.

Recovery: the rows of a fetched chunk and the partition's new position are written in
one atomic store batch, so after a crash (kill -9) the stored position never claims rows
that are missing, and a restart resumes there instead of re-reading the topic. Under
exactly-once the topic is read ``read_committed``: aborted writes never reach the copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiokafka import TopicPartition

from streamjoin.errors import ChangelogOffsetOutOfRange, LifecycleError, StoreCorrupted
from streamjoin.global_tables import GlobalTable
from streamjoin.runtime.table_state.changelog_reader import ChangelogChunk, ChangelogReader
from streamjoin.runtime.table_state.changelog_records import READ_COMMITTED, READ_UNCOMMITTED
from streamjoin.state.global_rows import (
    GLOBAL_DIR,
    GlobalRowsStore,
    MemoryRows,
    RowStore,
    batch_writes,
    start_positions,
    stored_positions,
)
from streamjoin.state.rocksdb import RocksDBOptions, TableDatabase, destroy

__all__ = ["GlobalTableProgress", "GlobalTableService"]

log = logging.getLogger("streamjoin.state.global")

#: records applied per store batch
_CHUNK_RECORDS = 50_000


@dataclass
class GlobalTableProgress:
    """One global table's restore and follow progress on this worker (metrics, status)."""

    restored: bool = False
    #: records applied since the start (restore and follow)
    applied: int = 0
    #: records the restore had to read (from the stored positions to the ends at start)
    restore_total: int = 0
    restore_seconds: float | None = None
    #: records behind the topic's end, as of the last check
    lag: int | None = None
    #: the positions the restore started from (the stored ones, unless wiped)
    started_from: dict[int, int] | None = None


@dataclass
class _Copy:
    table: GlobalTable
    store: RowStore
    database: TableDatabase | None
    progress: GlobalTableProgress


class GlobalTableService:
    """Restores every global table before the agents start, then keeps them current."""

    def __init__(
        self,
        tables: Mapping[str, GlobalTable],
        *,
        partitions: Mapping[str, int],
        state_dir: Path | None,
        rocksdb: RocksDBOptions | None,
        bootstrap_servers: str,
        client_options: Mapping[str, object] | None = None,
        read_committed: bool = False,
        on_crash: Callable[[BaseException], None] | None = None,
        progress_interval: float = 5.0,
        lag_interval: float = 5.0,
    ) -> None:
        self.tables = dict(tables)
        self.partitions = dict(partitions)
        self.state_dir = state_dir
        self.rocksdb = rocksdb
        self._reader = ChangelogReader(
            bootstrap_servers,
            dict(client_options or {}),
            isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
        )
        self._on_crash = on_crash
        self.progress_interval = progress_interval
        self.lag_interval = lag_interval
        self._copies: dict[str, _Copy] = {}
        self._by_topic: dict[str, _Copy] = {}
        self._follower: asyncio.Task[None] | None = None

    @property
    def progress(self) -> dict[str, GlobalTableProgress]:
        return {name: copy.progress for name, copy in self._copies.items()}

    def _tps(self, copy: _Copy) -> list[TopicPartition]:
        topic = copy.table.source.name
        count = self.partitions.get(topic) or copy.table.source.partitions
        if count is None:
            raise LifecycleError(
                f"global table {copy.table.name!r}: topic {topic!r} has no partition count"
            )
        return [TopicPartition(topic, p) for p in range(count)]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the stores, restore every table to its topic's current end, attach them."""
        for table in self.tables.values():
            copy = self._open(table)
            self._copies[table.name] = copy
            self._by_topic[table.source.name] = copy
        await self._reader.start()
        await self._restore()
        for copy in self._copies.values():
            copy.table.attach(GlobalRowsStore(copy.store))
        self._follower = asyncio.create_task(self._follow(), name="global-tables")

    async def stop(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        await self._reader.close()
        for copy in self._copies.values():
            copy.table.attach(None)
            copy.store.close()
            if copy.database is not None:
                copy.database.close()
        self._copies.clear()
        self._by_topic.clear()

    def _open(self, table: GlobalTable) -> _Copy:
        if self.state_dir is None or table.store == "memory":
            return _Copy(table, MemoryRows(), None, GlobalTableProgress())
        path = self.state_dir / GLOBAL_DIR / table.name
        try:
            database = TableDatabase(path, table.name, partitions=[0], options=self.rocksdb)
            store: RowStore = database.partition(0)
        except StoreCorrupted as exc:
            log.warning(
                "the store of global table %s is unusable and is rebuilt: %s", table.name, exc
            )
            destroy(path)
            database = TableDatabase(path, table.name, partitions=[0], options=self.rocksdb)
            store = database.partition(0)
        return _Copy(table, store, database, GlobalTableProgress())

    def _wipe(self, copy: _Copy) -> None:
        copy.store.close()
        if copy.database is None:
            copy.store = MemoryRows()
            if copy.progress.restored:
                copy.table.attach(GlobalRowsStore(copy.store))
            return
        path = copy.database.path
        copy.database.close()
        destroy(path)
        copy.database = TableDatabase(path, copy.table.name, partitions=[0], options=self.rocksdb)
        copy.store = copy.database.partition(0)
        if copy.progress.restored:  # wiped while following: agents read the new copy
            copy.table.attach(GlobalRowsStore(copy.store))

    # ------------------------------------------------------------------ reading

    async def _plan(self) -> dict[TopicPartition, int]:
        """Assign every partition from its start position; returns the end offsets."""
        reader = self._reader
        ranges: dict[TopicPartition, tuple[int, int | None]] = {}
        all_ends: dict[TopicPartition, int] = {}
        for copy in self._copies.values():
            tps = self._tps(copy)
            beginnings = await reader.beginning_offsets(tps)
            ends = await reader.end_offsets(tps)
            starts, wipe = start_positions(
                stored_positions(copy.store),
                {tp.partition: beginnings[tp] for tp in tps},
                {tp.partition: ends[tp] for tp in tps},
            )
            if wipe:
                log.warning(
                    "global table %s: its stored positions are past the end of topic %s "
                    "(recreated?): the local copy is read again from the beginning",
                    copy.table.name,
                    copy.table.source.name,
                )
                self._wipe(copy)
            copy.progress.started_from = dict(starts)
            copy.progress.restore_total = sum(max(0, ends[tp] - starts[tp.partition]) for tp in tps)
            for tp in tps:
                ranges[tp] = (starts[tp.partition], None)
                all_ends[tp] = ends[tp]
        reader.assign(ranges)
        return all_ends

    def _apply(self, chunks: Mapping[TopicPartition, ChangelogChunk]) -> int:
        applied = 0
        for tp, chunk in chunks.items():
            copy = self._by_topic[tp.topic]
            records = chunk.records
            copy.store.write(batch_writes(records, tp.partition, chunk.next_offset), None)
            copy.progress.applied += len(records)
            applied += len(records)
        return applied

    async def _restore(self) -> None:
        reader = self._reader
        started = time.monotonic()
        ends = await self._plan()
        total = sum(c.progress.restore_total for c in self._copies.values())
        names = ", ".join(sorted(self._copies))
        log.info("restoring global tables %s: %d records to read", names, total)
        done = 0
        next_log = started + self.progress_interval
        while True:
            remaining = [tp for tp, end in ends.items() if (reader.position(tp) or 0) < end]
            if not remaining:
                break
            try:
                chunks = await reader.read(_CHUNK_RECORDS, timeout=0.5)
            except ChangelogOffsetOutOfRange:
                ends = await self._plan()  # retention deleted what was next: replan
                continue
            done += self._apply(chunks)
            now = time.monotonic()
            if now >= next_log:
                next_log = now + self.progress_interval
                rate = done / max(now - started, 1e-6)
                left = max(0, total - done)
                eta = f"{left / rate:.0f}s" if rate > 0 else "?"
                log.info(
                    "restoring global tables %s: %d of %d records, %.0f records/s, ETA %s",
                    names,
                    done,
                    total,
                    rate,
                    eta,
                )
        elapsed = time.monotonic() - started
        for copy in self._copies.values():
            copy.progress.restored = True
            copy.progress.restore_seconds = elapsed
            copy.progress.lag = 0
        log.info("restored global tables %s: %d records in %.2fs", names, done, elapsed)

    async def _follow(self) -> None:
        reader = self._reader
        next_lag = time.monotonic() + self.lag_interval
        try:
            while True:
                try:
                    self._apply(await reader.read(_CHUNK_RECORDS, timeout=1.0))
                except ChangelogOffsetOutOfRange:
                    await self._plan()
                if time.monotonic() >= next_lag:
                    next_lag = time.monotonic() + self.lag_interval
                    await self.refresh_lag()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the worker stops (the reader already retried)
            log.error("global tables: reading failed: %r", exc)
            if self._on_crash is not None:
                self._on_crash(exc)

    async def refresh_lag(self) -> None:
        """Recompute each table's lag: records between the copy and its topic's end."""
        for copy in self._copies.values():
            tps = self._tps(copy)
            try:
                ends = await self._reader.end_offsets(tps)
            except Exception as exc:  # a broker hiccup: keep the last value
                log.debug("global table %s: lag not refreshed: %r", copy.table.name, exc)
                continue
            copy.progress.lag = sum(
                max(0, ends[tp] - (self._reader.position(tp) or 0)) for tp in tps
            )
