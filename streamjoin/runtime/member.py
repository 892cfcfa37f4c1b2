"""This worker as a member of its group: fetched records to tasks, commits, partition changes.

The Worker builds every part and hands them in; this service only runs the loops that
join them, like Kafka Streams' stream thread:

* the fetch loop takes what the :class:`~streamjoin.runtime.transport.consumer.Fetcher`
  fetched and delivers each partition's records to its running task through
  :class:`~streamjoin.runtime.tasks.processing.TaskProcessing` (a restoring task's records
  are sought back and its partition paused; a partition the aligner holds enough of is
  paused too), then lets the aligner release what it may;
* the commit loop commits every ``commit_interval`` seconds (processing flushes, then
  commits through the group's offsets);
* as the membership's rebalance listener it applies partition changes: revoked
  partitions' tasks are committed and closed, lost ones dropped, assigned ones created
  and fetched from the group's committed offsets (kept partitions resume where they were
  handed out to; under the cooperative protocol they never stop).

Per-partition offsets live in the tasks (:class:`~streamjoin.runtime.tasks.task.Task`):
where each source partition was committed when assigned, where the reset policy started
it, and how far it was handed out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError
from mode import Service

from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.tasks.processing import TaskProcessing
from streamjoin.runtime.tasks.task import Task, TaskManager, TaskState
from streamjoin.runtime.transport.consumer import Fetcher
from streamjoin.runtime.transport.fetched_records import as_raw_records

log = logging.getLogger("streamjoin.consumer")

TP = tuple[str, int]

#: pause an aligned partition when the aligner holds this many of its records; resume below LOW
ALIGN_HIGH = 5_000
ALIGN_LOW = 1_000


class CommittedOffsets(Protocol):
    """The group's committed offsets, as the member reads them at an assignment."""

    async def committed(self, tps: Iterable[TP]) -> dict[TP, int]: ...


class GroupMember(Service):
    """Runs the fetch and commit loops, and applies the group's partition changes."""

    def __init__(
        self,
        fetcher: Fetcher,
        processing: TaskProcessing,
        tasks: TaskManager,
        offsets: CommittedOffsets,
        *,
        commit_interval: float,
        counters: WorkerCounters,
        on_fatal: Callable[[BaseException], None],
        on_assignment: Callable[[set[TP]], None],
        on_revoke: Callable[[list[Task]], None],
    ) -> None:
        super().__init__()
        self.fetcher = fetcher
        self.processing = processing
        self._task_manager = tasks
        self._offsets = offsets
        self._commit_interval = commit_interval
        self.counters = counters
        self._on_fatal = on_fatal
        self._on_assignment = on_assignment
        self._on_revoke = on_revoke
        #: the partitions this member owns (as of the last assignment or revocation)
        self._owned: frozenset[TP] = frozenset()
        #: end offsets of the owned partitions, as last listed (:meth:`refresh_end_offsets`)
        self.end_offsets: dict[TP, int] = {}

    @property
    def assigned(self) -> set[TP]:
        return set(self._owned)

    async def crash(self, reason: BaseException) -> None:
        """A loop failed: the worker stops with the error (a supervisor restarts it) rather
        than stay in the group, heartbeating, with partitions nothing processes."""
        await super().crash(reason)
        self._on_fatal(reason)

    # ------------------------------------------------------------------ fetching

    @Service.task
    async def _fetch_loop(self) -> None:
        fetcher, tasks, processing = self.fetcher, self._task_manager, self.processing
        records_in = self.counters.records_in
        while not self.should_stop:
            batches = await fetcher.getmany(timeout_ms=100)
            # The task of each partition, taken now: if a rebalance starts while this batch
            # is handed out, those tasks stop running and the rest of the batch is dropped
            # (read again from the committed offsets by whoever owns the partition next);
            # a task created meanwhile for the same partition never gets these records.
            owners = {tp: tasks.task_for(tp.topic, tp.partition) for tp in batches}
            epoch = fetcher.epoch
            for tp, records in batches.items():
                if epoch != fetcher.epoch:
                    # The fetcher was pointed elsewhere while this batch was handed out: the
                    # rest of it is fetched again from where each partition was handed to.
                    break
                task = owners[tp]
                if not records or task is None:
                    continue
                key = (tp.topic, tp.partition)
                if not task.running:
                    if task.state is TaskState.RESTORING:
                        # Its tables are still restoring: read these records again later.
                        fetcher.seek(tp, records[0].offset)
                        task.handed_out_to[key] = records[0].offset
                        fetcher.pause(tp, "restore")
                    continue
                task.handed_out_to[key] = records[-1].offset + 1
                records_in[tp] = records_in.get(tp, 0) + len(records)
                raws = as_raw_records(tp.topic, tp.partition, records)
                if await processing.deliver(task, raws) >= ALIGN_HIGH:
                    fetcher.pause(tp, "align")
            await self._release_aligned()

    async def _release_aligned(self) -> None:
        aligner = self.processing.aligner
        waiting = aligner.waiting_on()
        fetched_all_at: dict[TP, float | None] = {}
        if waiting:
            fetched_all_at = await self.fetcher.fetched_all_at(waiting, self._handed_out(waiting))

        def caught_up(topic: str, partition: int, since_ms: float) -> bool:
            # A side that ran dry during this release was not looked at: assume it has more
            # (the next round checks it properly).
            at = fetched_all_at.get((topic, partition))
            return at is not None and at >= since_ms

        await self.processing.release(caught_up, time.time() * 1000)
        for tp in self.fetcher.paused_for("align"):
            if aligner.buffered((tp.topic, tp.partition)) < ALIGN_LOW:
                self.fetcher.resume(tp, "align")

    def _handed_out(self, tps: Iterable[TP]) -> dict[TP, int]:
        return {tp: at for tp in tps if (at := self._handed_out_to(tp)) is not None}

    def resume(self, topic: str, partition: int) -> None:
        """Fetch a partition again: its tables finished restoring."""
        self.fetcher.resume(TopicPartition(topic, partition), "restore")

    # ------------------------------------------------------------------ commits

    @Service.task
    async def _commit_loop(self) -> None:
        while not self.should_stop:
            await self.sleep(self._commit_interval)
            # A stop cancels this loop: the commit under way finishes anyway (cut short, an
            # exactly-once commit would keep the sends it held for the next transaction out
            # of the stop's final commit, which still takes their events' offsets).
            await asyncio.shield(self.commit())

    async def commit(self, tasks: list[Task] | None = None) -> None:
        """Flush the tables of ``tasks`` (default: every live task), then commit the offsets
        of exactly the events whose writes were flushed."""
        if self.fetcher.started:
            started = time.perf_counter()
            if await self.processing.commit(tasks):
                self.counters.commit_latency.observe(time.perf_counter() - started)
                self.counters.commits += 1

    # ------------------------------------------------------------------ offsets, for lag

    async def refresh_end_offsets(self) -> None:
        """List the end offsets of the owned partitions (one request; for lag metrics), and
        where the reset policy starts owned partitions the group never committed."""
        owned = sorted(self._owned)
        if not owned:
            self.end_offsets = {}
            return
        uncommitted = [
            tp
            for tp in owned
            if (task := self._task_manager.task_for(*tp)) is not None
            and tp not in task.committed_at_assignment
            and tp not in task.reset_offsets
        ]
        try:
            ends = await self.fetcher.end_offsets(owned)
            if uncommitted and self.fetcher.resets_to_earliest:
                starts = await self.fetcher.beginning_offsets(uncommitted)
            else:
                starts = {tp: ends[tp] for tp in uncommitted if tp in ends}
        except (KafkaError, IllegalStateError) as exc:
            log.debug("could not list end offsets: %r", exc)
            return
        self.end_offsets = ends
        for tp, start in starts.items():
            task = self._task_manager.task_for(*tp)
            if task is not None:
                task.reset_offsets[tp] = start

    def partition_offsets(self) -> dict[TP, tuple[int | None, int | None, int | None]]:
        """``(end, committed, processed)`` of every owned partition (None: not known yet)."""
        out: dict[TP, tuple[int | None, int | None, int | None]] = {}
        for tp in sorted(self._owned):
            task = self._task_manager.task_for(*tp)
            processed: int | None = None
            committed: int | None = None
            if task is not None:
                processed, committed = task.tracker.positions(tp)
                if committed is None:
                    committed = task.committed_at_assignment.get(tp, task.reset_offsets.get(tp))
            if processed is None:
                processed = committed
            out[tp] = (self.end_offsets.get(tp), committed, processed)
        return out

    # ------------------------------------------------------------------ rebalance listener

    async def on_partitions_revoked(self, revoked: frozenset[TP]) -> None:
        log.info(
            "revoking %d partitions: %s (owning %d)",
            len(revoked),
            ", ".join(f"{t}[{p}]" for t, p in sorted(revoked)),
            len(self._owned),
        )
        tasks = await self.processing.revoke(set(revoked), fenced=False)
        self._drop(revoked, tasks)

    async def on_partitions_lost(self, lost: frozenset[TP]) -> None:
        tasks = await self.processing.revoke(set(lost), fenced=True)
        self._drop(lost, tasks)

    async def on_partitions_assigned(self, added: frozenset[TP], owned: frozenset[TP]) -> None:
        if not self.fetcher.started:
            return
        committed = await self._offsets.committed(
            [tp for tp in owned if self._handed_out_to(tp) is None]
        )
        # No await from here on: the fetch loop must not see the new partitions before
        # their tasks exist and their start offsets are set.
        self._owned = owned
        if added:
            log.info(
                "assigned %d partitions: %s (owning %d)",
                len(added),
                ", ".join(f"{t}[{p}]" for t, p in sorted(added)),
                len(owned),
            )
        self._on_assignment(set(owned))
        for tp, offset in committed.items():
            task = self._task_manager.task_for(*tp)
            if task is not None:
                task.committed_at_assignment[tp] = offset
        # Kept partitions resume where they were handed out to, read now: the fetch loop
        # went on handing records out while the committed offsets were asked for.
        starts = dict(committed)
        for tp in owned:
            handed = self._handed_out_to(tp)
            if handed is not None:
                starts[tp] = handed
        self.fetcher.point_at(owned, starts)
        for topic, partition in added:
            task = self._task_manager.task_for(topic, partition)
            if task is not None and task.state is TaskState.RESTORING:
                self.fetcher.pause(TopicPartition(topic, partition), "restore")

    def _handed_out_to(self, tp: TP) -> int | None:
        task = self._task_manager.task_for(*tp)
        return None if task is None else task.handed_out_to.get(tp)

    def _drop(self, tps: frozenset[TP], tasks: list[Task]) -> None:
        self._owned = self._owned - tps
        self.fetcher.drop(TopicPartition(*tp) for tp in tps)
        self._on_revoke(tasks)
