"""What happens to fetched records, commits and revocations, whatever the transport.

The worker's group member (:mod:`streamjoin.runtime.member`) and the in-memory test
driver both hand records to :class:`TaskProcessing` and let it order commits and
revocations, so the
alignment of co-partitioned inputs and the exactness of revocation are the same
code in tests without a broker and in workers:

* :meth:`deliver` queues a task's records for its agents, through the
  timestamp aligner when its topic is read together with others;
* :meth:`release` hands over what the aligner may release now;
* :meth:`commit` takes committable positions and the tables' writes with no await
  in between, flushes them through the :class:`TableFlusher` (sends, changelog, then
  store), then commits the positions to the group's offsets: downhill, no callbacks;
* :meth:`revoke` suspends tasks before any await, lets their in-flight events
  finish, then commits exactly what they processed and closes them, or loses
  them (no flush, no commit) when the member was fenced or an agent is stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from itertools import groupby
from typing import Protocol

from streamjoin.errors import TransactionFailed
from streamjoin.events import RawRecord
from streamjoin.runtime.table_state.flush import (
    Sending,
    TableFlusher,
    TakenWrites,
    apply_writes,
    send_emitted,
)
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.alignment import TimestampAligner, topic_partition_of
from streamjoin.runtime.tasks.offset_ledger import TopicPartition
from streamjoin.runtime.tasks.task import Task, TaskManager, TaskState

log = logging.getLogger("streamjoin.processing")


class OffsetCommitter(Protocol):
    """Where source offsets are committed: the consumer group (or the test driver)."""

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """Commit ``offsets``; False when the group refused (the member was fenced)."""


class Transaction(Protocol):
    """Exactly-once: the worker's open transaction (:mod:`streamjoin.runtime.group.transaction`)."""

    def close_sends(self) -> None:
        """Sends made from now on go into the next transaction."""

    async def send_writes(self, taken: list[TakenWrites]) -> list[Sending]:
        """Send the changelog records of ``taken`` in the open transaction."""

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Add ``offsets`` and commit; raises :class:`TransactionFailed`."""

    @property
    def has_data(self) -> bool:
        """Something was sent in the open transaction."""

    async def reopen(self) -> None:
        """Let sends into the open transaction again (a snapshot found nothing to commit)."""

    async def begin(self) -> None:
        """Begin the next transaction and let sends in."""

    def waiting_on(self) -> str:
        """What a commit under way waits for (for the warning of a stalled commit)."""

    async def abort(self) -> None:
        """Abort the open transaction and begin the next one."""


#: consecutive aborted transactions after which the worker stops (a failure that retrying
#: does not fix, such as a topic it may not write to, must not become a rejoin loop)
MAX_ABORTS_IN_A_ROW = 5


class TaskProcessing:
    """Records in, commits and revocations out, for the tasks of one worker."""

    def __init__(
        self,
        tasks: TaskManager,
        runtime: AgentRuntime,
        aligner: TimestampAligner,
        *,
        flusher: TableFlusher,
        offsets: OffsetCommitter,
        member_ok: Callable[[], Awaitable[bool]] | None = None,
        revoke_timeout: float = 10.0,
        transaction: Transaction | None = None,
        on_transaction_aborted: Callable[[str], None] | None = None,
        on_commit_stalled: Callable[[float, str], None] | None = None,
        commit_stall_after: float = 10.0,
        commit_give_up_after: float | None = None,
    ) -> None:
        self.tasks = tasks
        self.runtime = runtime
        self.aligner = aligner
        #: flushes sends and table partitions (changelog, then store) before offsets move
        self.flusher = flusher
        self.offsets = offsets
        self._member_ok = member_ok
        self.revoke_timeout = revoke_timeout
        self._commit_lock = asyncio.Lock()
        #: the task inside a commit (a loss it runs into itself must not wait for it)
        self._committer: asyncio.Task[object] | None = None
        self.transaction = transaction
        self._on_transaction_aborted = on_transaction_aborted
        #: called with the seconds waited and what the commit waits for, every
        #: ``commit_stall_after`` seconds a transaction's commit still waits (see
        #: :meth:`_watch_commit`)
        self._on_commit_stalled = on_commit_stalled
        self.commit_stall_after = commit_stall_after
        #: a transaction's commit still waiting after this many seconds is given up: it
        #: is aborted, as a failed one is (see :meth:`_watch_commit`); None: never
        self.commit_give_up_after = commit_give_up_after
        self._aborts_in_a_row = 0
        #: commits are being skipped because the member is rejoining (logged once)
        self._skipping_commits = False
        #: tasks an abort lost, until the revocation of their partitions reports them
        self._lost_by_abort: list[Task] = []

    # ------------------------------------------------------------------ records in

    async def deliver(self, task: Task, raws: list[RawRecord]) -> int:
        """Queue ``raws`` (one partition's records, in offset order) for ``task``'s agents;
        returns how many records of that partition the aligner now holds (0 when the topic
        is not aligned: they went straight to the agents)."""
        if not raws or not task.running:
            return 0
        first = raws[0]
        if self.aligner.aligned(first.topic):
            tp = (first.topic, first.partition)
            self.aligner.add_partition(tp, raws)
            return self.aligner.buffered(tp)
        await self.runtime.dispatch_many(raws, task)
        return 0

    async def release(self, caught_up: Callable[[str, int, float], bool], now_ms: float) -> None:
        """Hand the agents what the aligner may release now (see :class:`TimestampAligner`)."""
        released = self.aligner.release_runs(caught_up, now_ms)
        for topic, partition in dict.fromkeys(self.aligner.forced):
            log.warning(
                "no data from %s[%d] for %.1fs: processing its co-partitioned topics without "
                "waiting for it (events it delivers later may be late for joins)",
                topic,
                partition,
                self.aligner.max_idle_ms / 1000,
            )
        self.aligner.forced.clear()
        # The aligner holds only records of running tasks (a suspended task's buffers are
        # dropped at once), so the current owner of each partition is the one they were
        # fetched for.
        by_task: dict[int, tuple[Task, list[RawRecord]]] = {}
        task_for = self.tasks.task_for
        for partition, topics, records in released:
            owners = {task_for(topic, partition) for topic in topics}
            if len(owners) == 1:
                # the usual case: one task owns that partition of the group's topics
                (task,) = owners
                if task is not None:
                    _tasks_records(by_task, task).extend(records)
                continue
            for (topic, _), run in groupby(records, topic_partition_of):
                task = task_for(topic, partition)
                if task is not None:
                    _tasks_records(by_task, task).extend(run)
        for task, raws in by_task.values():
            await self.runtime.dispatch_many(raws, task)

    # ------------------------------------------------------------------ commits

    @contextlib.asynccontextmanager
    async def _committing(self) -> AsyncIterator[None]:
        """One commit at a time (revocations and losses wait for the one under way)."""
        current = asyncio.current_task()
        if current is not None and current is self._committer:
            # Already inside the commit: its membership check found the member removed
            # and lost the tasks right there (the commit then stops before flushing).
            yield
            return
        async with self._commit_lock:
            self._committer = current
            try:
                yield
            finally:
                self._committer = None

    async def commit(self, tasks: list[Task] | None = None) -> dict[TopicPartition, int]:
        """Flush the tables of ``tasks`` (default: every live task), then commit the offsets
        of exactly the events whose writes were flushed; returns what was committed.

        Exactly-once commits every live task whatever ``tasks`` says: they share one
        transaction."""
        if self.transaction is not None:
            return await self._commit_transaction(self.transaction)
        async with self._committing():
            chosen = self.tasks.live() if tasks is None else tasks
            if self._member_ok is not None and not await self._member_ok():
                if not self._skipping_commits:  # once per episode, not every interval
                    log.warning(
                        "not committing: this worker is rejoining the group (its partitions "
                        "may have moved); their next owner resumes from the last commit"
                    )
                self._skipping_commits = True
                return {}
            if self._skipping_commits:
                self._skipping_commits = False
                log.info("committing again: this worker is back in the group")
            # Positions first, then the writes, with no await in between: every write taken
            # belongs to an event at or before a committed position, or to an event still in
            # flight (only a crash before the next commit replays those on top).
            self.runtime.ack_finished()
            positions = self.tasks.committable(chosen)
            if self.flusher.tables:
                # State and changelog first, then the source offsets (at-least-once).
                await self.flusher.flush(state for task in chosen for state in task.tables.values())
                self._report_corruption(chosen)
                # A task lost meanwhile (the member was fenced) had its flush skipped:
                # nothing of it is committed either.
                lost = {
                    tp for t in chosen if t.state is TaskState.LOST for tp in t.source_partitions
                }
                positions = {tp: p for tp, p in positions.items() if tp not in lost}
            if not positions:
                return {}
            if not await self.offsets.commit(positions):
                return {}
            self.tasks.mark_committed(positions)
            return positions

    async def _commit_transaction(self, transaction: Transaction) -> dict[TopicPartition, int]:
        """One transaction: a snapshot between two events of every actor (positions, table
        writes and the records the partitions emitted for this flush, sent before the
        actors go on), then changelog records, offsets and the commit, while the actors go
        on (what they send meanwhile goes into the next transaction); stores are written
        only once it committed. An abort loses every task (see :meth:`_aborted`)."""
        async with self._committing():
            if self._member_ok is not None and not await self._member_ok():
                # Rejoining: the commit would carry a generation the group may have left
                # behind (refused: every task lost). The transaction stays open until the
                # first commit after the rebalance.
                if not self._skipping_commits:
                    self._skipping_commits = True
                    log.info("not committing: this worker is rejoining the group")
                return {}
            if self._skipping_commits:
                self._skipping_commits = False
                log.info("committing again: this worker is back in the group")
            try:
                await self._settle_shared()
                tasks = self.tasks.live()
                if not await self.runtime.barrier.quiesce(self.revoke_timeout):
                    log.warning(
                        "commit waits for agents still inside an event after %.0fs: %s",
                        self.revoke_timeout,
                        ", ".join(self.runtime.barrier.inside_events()),
                    )
                    while not await self.runtime.barrier.quiesce(self.revoke_timeout):
                        pass
                try:
                    # (every actor is between two events, so it acknowledged what it finished)
                    positions = self.tasks.committable(tasks)
                    taken = self.flusher.take(
                        state for task in tasks for state in task.tables.values()
                    )
                    # Records the partitions emitted for this flush (final results of
                    # windows) join this transaction, with the writes that record them.
                    await send_emitted(taken, self.flusher.sender)
                    transaction.close_sends()
                finally:
                    self.runtime.barrier.resume()
            finally:
                self.runtime.barrier.open_dispatch()
            if not positions and not taken and not transaction.has_data:
                await transaction.reopen()  # nothing happened: the transaction goes on
                return {}
            step = ["sending the changelog records of its table writes"]
            ending = asyncio.ensure_future(self._end(transaction, taken, positions, step))
            watchdog = asyncio.ensure_future(self._watch_commit(transaction, step))
            try:
                await asyncio.wait((ending, watchdog), return_when=asyncio.FIRST_COMPLETED)
                if not ending.done():
                    # (the watch gave up: see _watch_commit)
                    waiting_for = f"{step[0]}: {transaction.waiting_on()}"
                    ending.cancel()
                    await asyncio.wait((ending,))
                    if ending.cancelled():
                        raise TransactionFailed(
                            f"its commit did not finish in {self.commit_give_up_after:.0f}s "
                            f"(waiting for {waiting_for}); given up"
                        )
                sending = ending.result()
                offsets = await asyncio.gather(*(f for _, f in sending if f is not None))
            except TransactionFailed as exc:
                await self._aborted(transaction, exc)
                return {}
            finally:
                watchdog.cancel()
                ending.cancel()  # (a no-op once it ended; else the caller was cancelled)
            self._aborts_in_a_row = 0
            await transaction.begin()
            apply_writes(sending, offsets)
            self.tasks.mark_committed(positions)
            self._report_corruption(tasks)
            return positions

    async def _end(
        self,
        transaction: Transaction,
        taken: list[TakenWrites],
        positions: Mapping[TopicPartition, int],
        step: list[str],
    ) -> list[Sending]:
        """Send the changelog records of ``taken`` and commit with ``positions``."""
        sending = await transaction.send_writes(taken)
        step[0] = "committing"
        await transaction.commit(positions)
        return sending

    async def _watch_commit(self, transaction: Transaction, step: list[str]) -> None:
        """While a transaction commits: every ``commit_stall_after`` seconds it still waits,
        tell ``on_commit_stalled``. A commit outliving the transaction timeout waits on a
        broker that is away or on a connection gone silent (half-open), which only its
        request timeout would end; the worker closes its connections then, so what waits
        on a silent one is retried at once (an outage just keeps waiting, as before).

        Returns once the commit has waited ``commit_give_up_after`` seconds: the commit is
        then given up and aborted. By then the broker has aborted the transaction itself
        (past its timeout), or the producer is wedged and only a new one (its
        InitProducerId fences the old one and ends what it left open) can go on; waiting
        longer would leave the worker's partitions unprocessed indefinitely."""
        waited = 0.0
        while True:
            await asyncio.sleep(self.commit_stall_after)
            waited += self.commit_stall_after
            if self.commit_give_up_after is not None and waited >= self.commit_give_up_after:
                return
            if self._on_commit_stalled is not None:
                self._on_commit_stalled(waited, f"{step[0]}: {transaction.waiting_on()}")

    async def _settle_shared(self) -> None:
        """Agents reading one topic caught up with each other (see
        :meth:`~streamjoin.runtime.tasks.barrier.TransactionBarrier.settle_shared`), however
        long it takes."""
        while not await self.runtime.barrier.settle_shared(self.revoke_timeout):
            log.warning(
                "commit waits for agents sharing a topic to process what they were given "
                "after %.0fs: %s",
                self.revoke_timeout,
                ", ".join(self.runtime.barrier.sharing_behind()),
            )

    def _report_corruption(self, tasks: Iterable[Task]) -> None:
        """Stores a flush found corrupted go to the rebuild path (once each)."""
        for task in tasks:
            for state in task.tables.values():
                if state.corrupted is not None:
                    exc, state.corrupted = state.corrupted, None
                    self.runtime.store_corrupted(task, exc)

    async def _aborted(self, transaction: Transaction, exc: TransactionFailed) -> None:
        """Abort, and lose every task: their sends and changelog records since the last
        commit are gone, so their events must be processed again from the committed
        offsets, on top of the stores (which hold only committed writes)."""
        if not exc.fenced:
            # (a fenced worker rejoins and is given partitions afresh; other failures that
            # keep coming back stop the worker below)
            self._aborts_in_a_row += 1
        tasks = self.tasks.live()
        self.tasks.suspend(tasks)
        self.aligner.drop(tp for task in tasks for tp in task.source_partitions)
        dropped = self.tasks.lose(tasks)
        self._lost_by_abort.extend(tasks)
        log.warning(
            "transaction aborted (%s): %d tasks lost (%d uncommitted table writes dropped); "
            "they start again from the last commit",
            exc,
            len(tasks),
            dropped,
        )
        # Events of the lost tasks still in progress finish first: what they send is held
        # for the next transaction, and the abort drops it (nothing of theirs may be
        # committed with the next transaction, which has no offsets for them).
        transaction.close_sends()
        if not await self.runtime.barrier.quiesce(self.revoke_timeout):
            log.warning(
                "agents still inside an event %.0fs after the abort began: %s",
                self.revoke_timeout,
                ", ".join(self.runtime.barrier.inside_events()),
            )
        try:
            await transaction.abort()
        finally:
            self.runtime.barrier.resume()
        if self._aborts_in_a_row >= MAX_ABORTS_IN_A_ROW:
            raise TransactionFailed(
                f"{self._aborts_in_a_row} transactions in a row were aborted; the last: {exc}",
                fenced=exc.fenced,
            ) from exc
        if self._on_transaction_aborted is not None:
            self._on_transaction_aborted(f"transaction aborted: {exc}")

    # ------------------------------------------------------------------ revocation

    async def revoke(self, tps: Iterable[TopicPartition], *, fenced: bool) -> list[Task]:
        """Revoke the tasks owning ``tps``: suspend, finish, flush and commit, close; or, when
        ``fenced`` or an agent does not finish in time, lose them. Returns the tasks."""
        tps = set(tps)
        earlier = [t for t in self._lost_by_abort if tps.intersection(t.source_partitions)]
        if earlier:
            self._lost_by_abort = [t for t in self._lost_by_abort if t not in earlier]
        return earlier + await self._revoke(tps, fenced=fenced)

    async def _revoke(self, tps: set[TopicPartition], *, fenced: bool) -> list[Task]:
        tasks = self.tasks.tasks_of(tps)
        # Before any await: nothing more of these tasks is dispatched or started.
        self.tasks.suspend(tasks)
        self.aligner.drop(tps)
        if not tasks:
            return tasks
        if fenced and self.transaction is not None:
            # Their sends since the last commit are in the open transaction, with every
            # other task's: it is aborted, and all tasks start again from the last commit.
            async with self._committing():
                if self.tasks.live():  # (a failed commit may have lost them all already)
                    await self._aborted(
                        self.transaction,
                        TransactionFailed("this worker lost its partitions", fenced=True),
                    )
                    # (the others are reported when their partitions are given up)
                    self._lost_by_abort = [t for t in self._lost_by_abort if t not in tasks]
            return tasks
        idle = fenced or await self.runtime.barrier.wait_idle(tasks, self.revoke_timeout)
        if fenced or not idle:
            if not fenced:
                log.warning(
                    "agents still busy %.0fs after partitions were revoked (%s); their tasks "
                    "are given up without a commit",
                    self.revoke_timeout,
                    ", ".join(self.runtime.barrier.busy_with(tasks)) or "sends not acknowledged",
                )
            dropped = self.tasks.lose(tasks)
            # A commit under way may be flushing these tasks: it skips them from now on,
            # but their stores must stay open until it is done with them.
            async with self._committing():
                pass
            log.warning(
                "%s %d tasks without committing (%d unflushed table writes dropped); their "
                "next owner replays from the last commit",
                "fenced out of the group: lost" if fenced else "lost",
                len(tasks),
                dropped,
            )
            return tasks
        await self.flusher.flush_sends()
        await self.commit(tasks)
        self.tasks.close(tasks)
        return tasks

    async def stop(self, *, commit: bool = True) -> None:
        """Ordered stop: suspend every task, let in-flight events finish, stop the agents,
        flush sends, commit (unless ``commit`` is False), close."""
        tasks = self.tasks.live()
        self.tasks.suspend(tasks)
        if not await self.runtime.barrier.wait_idle(tasks, self.revoke_timeout):
            log.warning("agents still busy %.0fs after stop was requested", self.revoke_timeout)
        await self.runtime.stop()
        await self.flusher.flush_sends()
        if commit:
            await self.commit(tasks)
        self.tasks.close(tasks)


def _tasks_records(by_task: dict[int, tuple[Task, list[RawRecord]]], task: Task) -> list[RawRecord]:
    """The list of records released for ``task`` this round (made at its first)."""
    entry = by_task.get(id(task))
    if entry is None:
        entry = by_task[id(task)] = (task, [])
    return entry[1]
