"""The Kafka consumer as a mode service: fetch, hand records to tasks' agents, commit.

Group membership is ours (:class:`~streamjoin.runtime.group.membership.GroupMembership`):
the aiokafka consumer only fetches, by manual assignment, what the membership
service says this worker owns, and starts each newly assigned partition at the
group's committed offset. Under the cooperative protocol a rebalance changes
only the partitions that move; the others keep their fetch position and their
tasks never stop.

At-least-once: offsets are committed from each task's offset ledger, i.e. only
up to events that were processed and whose sends were acknowledged, right after
the tables those events wrote were flushed; commits happen every
``commit_interval`` seconds, when partitions are revoked and when the worker
stops. Revocation suspends the revoked tasks first (nothing more is dispatched
or started), waits a bounded time for their in-flight events and sends, then
flushes and commits exactly what they processed, and only then forgets them. A
member that was removed from the group (its session expired) *loses* its tasks
instead: nothing of theirs is flushed or committed, their next owner replays.
State restoration runs in a background service after assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError
from mode import Service

from streamjoin.errors import TransactionFailed
from streamjoin.runtime.group.membership import (
    GroupAssignor,
    GroupMembership,
    MembershipSettings,
)
from streamjoin.runtime.group.rebalance_metrics import RebalanceMetrics
from streamjoin.runtime.group.transaction import (
    TransactionalSender,
    TransactionIds,
    WorkerTransaction,
)
from streamjoin.runtime.ops.metrics import WorkerCounters
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.alignment import TimestampAligner
from streamjoin.runtime.tasks.processing import TaskProcessing
from streamjoin.runtime.tasks.task import Task, TaskManager, TaskState
from streamjoin.runtime.transport.fetched_records import RAW_RECORDS, as_raw_records
from streamjoin.runtime.transport.fetched_records import install as install_raw_records
from streamjoin.runtime.transport.producer import KafkaSender
from streamjoin.tables import Table

log = logging.getLogger("streamjoin.consumer")

TP = tuple[str, int]

#: the longest the broker holds a fetch that finds no data (aiokafka's default is 500 ms).
#: aiokafka keeps one fetch in flight per broker, and a partition paused for alignment is
#: left out of it: while the paused inputs are processed, the fetch asks only for inputs
#: that have nothing new, and the broker holds it this long. Once the paused inputs resume
#: they wait for that fetch to come back, so on a backlog a join stalled about this long
#: after every pause (measured: about 1.2 s of an 8 s enrichment run at 500 ms).
FETCH_MAX_WAIT_MS = 100
#: pause an aligned partition when the aligner holds this many of its records; resume below LOW
_ALIGN_HIGH = 5_000
_ALIGN_LOW = 1_000
#: consumer options that configure group membership (ours), not aiokafka's fetching
_GROUP_OPTIONS = frozenset(
    {
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "rebalance_timeout_ms",
        "max_poll_interval_ms",
        "group_id",
        "group_instance_id",
        "partition_assignment_strategy",
        "enable_auto_commit",
        "auto_commit_interval_ms",
    }
)


def split_consumer_options(
    options: Mapping[str, Any], settings: MembershipSettings
) -> tuple[MembershipSettings, dict[str, Any]]:
    """Group options (the Java/aiokafka names) into ``settings``; the rest for fetching."""
    rebalance = options.get("rebalance_timeout_ms", options.get("max_poll_interval_ms"))
    changes: dict[str, Any] = {}
    for name in ("session_timeout_ms", "heartbeat_interval_ms"):
        if name in options:
            changes[name] = int(options[name])
    if rebalance is not None:
        changes["rebalance_timeout_ms"] = int(rebalance)
    if "retry_backoff_ms" in options:
        changes["retry_backoff_ms"] = int(options["retry_backoff_ms"])
    fetching = {k: v for k, v in options.items() if k not in _GROUP_OPTIONS}
    return MembershipSettings(**{**settings.__dict__, **changes}), fetching


class KafkaConsumerService(Service):
    """One member of the app's group: our membership service plus an aiokafka fetcher."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str,
        runtime: AgentRuntime,
        tasks: TaskManager,
        sender: KafkaSender,
        assignor: GroupAssignor,
        membership: MembershipSettings,
        commit_interval: float,
        client_options: Mapping[str, Any],
        consumer_options: Mapping[str, Any],
        on_fatal: Callable[[BaseException], None],
        revoke_timeout: float = 10.0,
        on_assignment: Callable[[set[tuple[str, int]]], None] | None = None,
        on_revoke: Callable[[list[Task]], None] | None = None,
        flush_tables: Callable[[list[Task]], Any] | None = None,
        tables: Mapping[str, Table] | None = None,
        aligned_groups: Iterable[Iterable[str]] = (),
        align_max_idle_ms: int = 5_000,
        align_idle_ms: int = 0,
        align_first: Iterable[str] = (),
        counters: WorkerCounters | None = None,
    ) -> None:
        super().__init__()
        self.counters = counters if counters is not None else WorkerCounters()
        #: end offsets of the owned partitions, as last listed (:meth:`refresh_end_offsets`)
        self.end_offsets: dict[TP, int] = {}
        #: the group's committed offset of each owned partition when it was assigned here
        self._committed_at_assignment: dict[TP, int] = {}
        #: where owned partitions without a committed offset started (the reset policy's)
        self._reset_offsets: dict[TP, int] = {}
        self._runtime = runtime
        self._task_manager = tasks
        self._commit_interval = commit_interval
        self._on_assignment = on_assignment
        self._on_revoke = on_revoke
        self._on_fatal = on_fatal
        self._assignor = assignor
        self._bootstrap = bootstrap_servers
        self._client_id = client_id
        self._client_options = dict(client_options)
        self.settings, fetching = split_consumer_options(consumer_options, membership)
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "group_id": None,
            "client_id": client_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "max_poll_records": 10_000,
            "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
            **client_options,
            **fetching,
            "key_deserializer": RAW_RECORDS,  # hands out RawRecord (fetched_records)
        }
        self._consumer: AIOKafkaConsumer | None = None
        self._client: AIOKafkaClient | None = None
        self.membership: GroupMembership | None = None
        #: kept across the membership's lifetime (read after the worker stopped, too)
        self.rebalance_metrics = RebalanceMetrics()
        self._assigned: frozenset[TP] = frozenset()
        self._aligner = TimestampAligner(
            aligned_groups,
            max_idle_ms=align_max_idle_ms,
            idle_ms=align_idle_ms,
            first=align_first,
        )
        transaction = None
        if isinstance(sender, TransactionalSender):
            # Exactly-once: read only committed input; commits are transactions, which the
            # group fences by generation (no heartbeat round trip needed first).
            self._options["isolation_level"] = "read_committed"
            transaction = WorkerTransaction(sender, tables or {}, self._commit_in_transaction)
        self.processing = TaskProcessing(
            tasks,
            runtime,
            self._aligner,
            flush_tables=flush_tables,
            flush_sends=sender.flush,
            commit_offsets=self._commit_offsets,
            member_ok=self._in_good_standing if transaction else self._confirm_membership,
            revoke_timeout=revoke_timeout,
            transaction=transaction,
            on_transaction_aborted=self._transaction_aborted,
        )
        #: why each partition is paused ("restore": its tables are restoring, "align": the
        #: aligner holds enough of it); it is resumed when no reason is left
        self._pauses: dict[TopicPartition, set[str]] = {}
        #: the next offset to hand out, per partition: after the last record getmany handed
        #: us, or where a restoring partition was sought back to. aiokafka's own position()
        #: can run ahead of that (it counts records fetched into its buffer but not handed
        #: out yet), which would make a partition look caught up too early; and a kept
        #: partition resumes here when the fetcher's assignment changes.
        self._delivered_to: dict[TopicPartition, int] = {}
        #: bumped whenever the fetcher's assignment changes (a batch fetched before is stale)
        self._fetch_epoch = 0
        #: revoked or lost partitions still in the fetcher's assignment, paused until the
        #: next assignment replaces it (they may come back, and must then start afresh)
        self._dropped: set[TopicPartition] = set()

    @property
    def assigned(self) -> set[tuple[str, int]]:
        return set(self._assigned)

    async def on_start(self) -> None:
        install_raw_records()
        self._consumer = AIOKafkaConsumer(**self._options)
        await self._consumer.start()
        settings = self.settings
        # JoinGroup is held by the broker until the rebalance completes (at most the
        # rebalance timeout): the client's request timeout must outlast it.
        request_timeout = max(
            int(self._client_options.get("request_timeout_ms", 40_000)),
            settings.rebalance_timeout_ms + 5_000,
        )
        self._client = AIOKafkaClient(
            bootstrap_servers=self._bootstrap,
            client_id=self._client_id,
            **{**self._client_options, "request_timeout_ms": request_timeout},
        )
        await self._client.bootstrap()
        self.membership = GroupMembership(
            self._client,
            settings,
            topics=self._runtime.topics,
            assignor=self._assignor,
            listener=self,
            on_fatal=self._on_fatal,
            metrics=self.rebalance_metrics,
        )
        self.membership.start()

    def stop_joining(self) -> None:
        """The worker is stopping: join no more rebalances (called before anything else of
        the stop, which may take a while before :meth:`shutdown` runs)."""
        if self.membership is not None:
            self.membership.stop_joining()

    async def shutdown(self) -> None:
        """Ordered stop: no more fetching or rebalancing, finish in-flight events, flush
        sends, commit, leave the group (static members stay), close the clients."""
        self.stop_joining()
        await self._stop_futures()  # cancels the fetch and commit loops
        if self.membership is not None:
            await self.membership.settle(min(10.0, self.settings.rebalance_timeout_ms / 1000))
            await self.membership.stop()
        await self.processing.stop()
        if self.membership is not None:
            await self.membership.leave()
            self.membership = None
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await _stop_consumer(consumer)
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def crash(self, reason: BaseException) -> None:
        """A loop of this service failed: the worker stops with the error (a supervisor
        restarts it) rather than stay in the group, heartbeating, with partitions that
        nothing processes or commits any more."""
        await super().crash(reason)
        self._on_fatal(reason)

    async def on_stop(self) -> None:
        if self._consumer is not None or self.membership is not None:
            await self.shutdown()

    @Service.task
    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        records_in = self.counters.records_in
        while not self.should_stop:
            try:
                batches = await consumer.getmany(timeout_ms=100)
            except IllegalStateError:
                await self.sleep(0.1)  # not subscribed/assigned yet
                continue
            # The task of each partition, taken now: if a rebalance starts while this batch
            # is handed out, those tasks stop running and the rest of the batch is dropped
            # (read again from the committed offsets by whoever owns the partition next);
            # a task created meanwhile for the same partition never gets these records.
            owners = {tp: self._task_manager.task_for(tp.topic, tp.partition) for tp in batches}
            fetch_epoch = self._fetch_epoch
            for tp, records in batches.items():
                if fetch_epoch != self._fetch_epoch:
                    # The fetcher was pointed elsewhere while this batch was handed out: the
                    # rest of it is fetched again from where each partition was handed to.
                    break
                task = owners[tp]
                if not records or task is None:
                    continue
                if not task.running:
                    if task.state is TaskState.RESTORING:
                        # Its tables are still restoring: read these records again later.
                        consumer.seek(tp, records[0].offset)
                        self._delivered_to[tp] = records[0].offset
                        self._pause(tp, "restore")
                    continue
                self._delivered_to[tp] = records[-1].offset + 1
                records_in[tp] = records_in.get(tp, 0) + len(records)
                raws = as_raw_records(tp.topic, tp.partition, records)
                if await self.processing.deliver(task, raws) >= _ALIGN_HIGH:
                    self._pause(tp, "align")
            await self._release_aligned(consumer)

    async def _release_aligned(self, consumer: AIOKafkaConsumer) -> None:
        # For each empty partition holding a group back: when aiokafka last heard from the
        # broker about it, and whether it had fetched everything up to the high watermark.
        fetched_all_at: dict[tuple[str, int], float | None] = {}
        stale: list[TopicPartition] = []
        for topic, partition in self._aligner.waiting_on():
            tp = TopicPartition(topic, partition)
            # highwater() and last_poll_timestamp() assert that the partition is assigned
            if tp not in consumer.assignment():
                fetched_all_at[(topic, partition)] = float("inf")  # not ours: never wait
                continue
            try:
                highwater = consumer.highwater(tp)
                polled = consumer.last_poll_timestamp(tp)
                delivered = self._delivered_to.get(tp)
                if delivered is None:  # nothing handed out yet: aiokafka buffers nothing past it
                    delivered = await consumer.position(tp)
            except (IllegalStateError, KafkaError):
                fetched_all_at[(topic, partition)] = float("inf")  # not ours: never wait
                continue
            at_end = highwater is not None and delivered >= highwater
            fetched_all_at[(topic, partition)] = float(polled) if at_end and polled else None
            if at_end:
                stale.append(tp)  # aiokafka may not refresh an idle partition's high watermark
        if stale:
            # Ask the broker directly: a fresh end offset settles whether there is more to read.
            with contextlib.suppress(KafkaError, IllegalStateError):
                ends = await consumer.end_offsets(stale)
                for tp in stale:
                    delivered = self._delivered_to.get(tp)
                    if delivered is None:
                        delivered = await consumer.position(tp)
                    # fresh by construction: caught up now, whenever the wait began
                    at_end_now = delivered >= ends[tp]
                    fetched_all_at[(tp.topic, tp.partition)] = float("inf") if at_end_now else None

        def caught_up(topic: str, partition: int, since_ms: float) -> bool:
            # A side that ran dry during this release was not looked at: assume it has more
            # (the next round checks it properly).
            at = fetched_all_at.get((topic, partition))
            return at is not None and at >= since_ms

        await self.processing.release(caught_up, time.time() * 1000)
        for tp, reasons in list(self._pauses.items()):
            if "align" in reasons and self._aligner.buffered((tp.topic, tp.partition)) < _ALIGN_LOW:
                self._resume(tp, "align")

    def _pause(self, tp: TopicPartition, reason: str) -> None:
        reasons = self._pauses.setdefault(tp, set())
        if not reasons and self._consumer is not None:
            self._consumer.pause(tp)
        reasons.add(reason)

    def _resume(self, tp: TopicPartition, reason: str) -> None:
        reasons = self._pauses.get(tp)
        if reasons is None:
            return
        reasons.discard(reason)
        if not reasons:
            del self._pauses[tp]
            if self._consumer is not None and (tp.topic, tp.partition) in self._assigned:
                self._consumer.resume(tp)

    @Service.task
    async def _commit_loop(self) -> None:
        while not self.should_stop:
            await self.sleep(self._commit_interval)
            await self.commit()

    async def commit(self, tasks: list[Task] | None = None) -> None:
        """Flush the tables of ``tasks`` (default: every live task), then commit the offsets
        of exactly the events whose writes were flushed."""
        if self._consumer is not None:
            started = time.perf_counter()
            if await self.processing.commit(tasks):
                self.counters.commit_latency.observe(time.perf_counter() - started)
                self.counters.commits += 1

    async def refresh_end_offsets(self) -> None:
        """List the end offsets of the owned partitions (one request; for lag metrics)."""
        consumer, owned = self._consumer, sorted(self._assigned)
        if consumer is None or not owned:
            self.end_offsets = {}
            return
        # Where a partition the group never committed starts: the reset policy's offset.
        uncommitted = [
            TopicPartition(*tp)
            for tp in owned
            if tp not in self._committed_at_assignment and tp not in self._reset_offsets
        ]
        try:
            ends = await consumer.end_offsets([TopicPartition(*tp) for tp in owned])
            if uncommitted and self._options.get("auto_offset_reset") == "earliest":
                starts = await consumer.beginning_offsets(uncommitted)
            else:
                starts = {tp: ends[tp] for tp in uncommitted}
        except (KafkaError, IllegalStateError) as exc:
            log.debug("could not list end offsets: %r", exc)
            return
        self.end_offsets = {(tp.topic, tp.partition): int(end) for tp, end in ends.items()}
        for tp, start in starts.items():
            self._reset_offsets[(tp.topic, tp.partition)] = int(start)

    def partition_offsets(self) -> dict[TP, tuple[int | None, int | None, int | None]]:
        """``(end, committed, processed)`` of every owned partition (None: not known yet)."""
        out: dict[TP, tuple[int | None, int | None, int | None]] = {}
        for tp in sorted(self._assigned):
            task = self._task_manager.task_for(*tp)
            processed, committed = (None, None) if task is None else task.tracker.positions(tp)
            if committed is None:
                committed = self._committed_at_assignment.get(tp, self._reset_offsets.get(tp))
            if processed is None:
                processed = committed
            out[tp] = (self.end_offsets.get(tp), committed, processed)
        return out

    async def _commit_offsets(self, positions: Mapping[tuple[str, int], int]) -> bool:
        membership = self.membership
        if membership is None:
            return False
        owned = self._assigned
        offsets = {tp: pos for tp, pos in positions.items() if tp in owned}
        return await membership.commit(offsets)

    async def _commit_in_transaction(
        self, ids: TransactionIds, offsets: Mapping[tuple[str, int], int]
    ) -> None:
        membership = self.membership
        if membership is None:
            raise TransactionFailed("this worker is not in the group", fenced=True)
        await membership.commit_in_transaction(ids, offsets)

    async def _in_good_standing(self) -> bool:
        membership = self.membership
        return membership is not None and membership.in_good_standing

    def _transaction_aborted(self, exc: TransactionFailed) -> None:
        """Every task was lost with the transaction: give their partitions up and rejoin
        (they come back, most likely to this worker, from the committed offsets)."""
        if self.membership is not None:
            self.membership.abandon(f"transaction aborted: {exc}")

    async def _confirm_membership(self) -> bool:
        """Ask the group coordinator, right before state is flushed, whether this member is
        still in the group (a heartbeat). A member stalled past its session timeout (a long
        GC pause, SIGSTOP, CPU starvation) has been replaced, but only learns it at its next
        heartbeat: flushing before that would write changelog records for partitions it no
        longer owns. After a successful heartbeat the coordinator keeps the member for a
        whole session timeout, far longer than a flush takes."""
        membership = self.membership
        return membership is not None and await membership.heartbeat()

    # -- the membership service's callbacks (heartbeats go on meanwhile)

    async def on_partitions_revoked(self, revoked: frozenset[TP]) -> None:
        tasks = await self.processing.revoke(set(revoked), fenced=False)
        self._drop(revoked, tasks)

    async def on_partitions_lost(self, lost: frozenset[TP]) -> None:
        tasks = await self.processing.revoke(set(lost), fenced=True)
        self._drop(lost, tasks)

    async def on_partitions_assigned(self, added: frozenset[TP], owned: frozenset[TP]) -> None:
        consumer, membership = self._consumer, self.membership
        if consumer is None or membership is None:
            return
        unknown = [tp for tp in owned if TopicPartition(*tp) not in self._delivered_to]
        committed = await membership.committed(unknown)
        self._committed_at_assignment.update(committed)
        # No await from here on: the fetch loop must not see the new partitions before
        # their tasks exist and their start offsets are set.
        self._assigned = owned
        if added:
            log.info(
                "assigned %d partitions: %s (owning %d)",
                len(added),
                ", ".join(f"{t}[{p}]" for t, p in sorted(added)),
                len(owned),
            )
        if self._on_assignment is not None:
            self._on_assignment(set(owned))
        self._fetch(owned, committed)
        for topic, partition in added:
            task = self._task_manager.task_for(topic, partition)
            if task is not None and task.state is TaskState.RESTORING:
                self._pause(TopicPartition(topic, partition), "restore")

    def _drop(self, tps: frozenset[TP], tasks: list[Task]) -> None:
        gone = {TopicPartition(*tp) for tp in tps}
        for tp in gone:
            self._pauses.pop(tp, None)
            self._delivered_to.pop(tp, None)
            self._committed_at_assignment.pop((tp.topic, tp.partition), None)
            self._reset_offsets.pop((tp.topic, tp.partition), None)
        self._assigned = self._assigned - tps
        # Only paused here: the next assignment points the fetcher at what is owned. Taking
        # them out of the fetcher's assignment now would reset the kept partitions that had
        # handed nothing out yet to the reset policy (earliest: a replay onto their state).
        consumer = self._consumer
        if consumer is not None:
            assigned = consumer.assignment()
            dropped = [tp for tp in gone if tp in assigned]
            consumer.pause(*dropped)
            self._dropped.update(dropped)
        if self._on_revoke is not None:
            self._on_revoke(tasks)

    def _fetch(self, owned: Iterable[TP], committed: Mapping[TP, int]) -> None:
        """Point the fetcher at ``owned``: kept partitions resume where they were handed out
        up to, others start at the committed offset (or the reset policy's, if none)."""
        consumer = self._consumer
        if consumer is None:
            return
        tps = {TopicPartition(*tp) for tp in owned}
        if tps == consumer.assignment() and not self._dropped:
            return  # unchanged (a probing rebalance): keep the fetcher's buffers and positions
        self._fetch_epoch += 1
        self._dropped.clear()
        consumer.assign(sorted(tps))
        for tp in tps:
            start = self._delivered_to.get(tp, committed.get((tp.topic, tp.partition)))
            if start is not None:
                consumer.seek(tp, start)
            if self._pauses.get(tp):
                consumer.pause(tp)

    def resume(self, topic: str, partition: int) -> None:
        """Start fetching a partition again (its tables finished restoring)."""
        self._resume(TopicPartition(topic, partition), "restore")


async def _stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """Stop a group-less aiokafka consumer; its stop() can re-raise the cancellation of
    its own fetch task, which is not ours to propagate."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    except KafkaError as exc:
        log.debug("consumer stop: %r", exc)
