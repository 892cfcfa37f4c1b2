"""The Kafka consumer as a mode service: fetch, hand records to tasks' agents, commit.

At-least-once: offsets are committed from each task's offset ledger, i.e. only
up to events that were processed and whose sends were acknowledged, right after
the tables those events wrote were flushed; commits happen every
``commit_interval`` seconds, when partitions are revoked and when the worker
stops. Revocation suspends the revoked tasks first (nothing more is dispatched
or started), waits a bounded time for their in-flight events and sends, then
flushes and commits exactly what they processed, and only then forgets them. A
member that was fenced out of the group (its session expired) loses its tasks
instead: nothing of theirs is flushed or committed, their next owner replays.
State restoration runs in a background service after assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from mode import Service

from streamjoin.events import RawRecord
from streamjoin.runtime.alignment import TimestampAligner
from streamjoin.runtime.producer import KafkaSender
from streamjoin.runtime.streams import AgentRuntime
from streamjoin.runtime.tasks import Task, TaskManager, TaskState

log = logging.getLogger("streamjoin.consumer")

#: aiokafka's generation after it reset a fenced member (OffsetCommitRequest.DEFAULT_GENERATION_ID)
_NO_GENERATION = -1
#: pause an aligned partition when the aligner holds this many of its records; resume below LOW
_ALIGN_HIGH = 5_000
_ALIGN_LOW = 1_000


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: KafkaConsumerService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._service.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._service.on_assigned(assigned)


class KafkaConsumerService(Service):
    """One consumer in the app's group, using the streamjoin assignor."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        group_id: str,
        client_id: str,
        runtime: AgentRuntime,
        tasks: TaskManager,
        sender: KafkaSender,
        assignor: AbstractPartitionAssignor,
        commit_interval: float,
        group_instance_id: str | None,
        client_options: Mapping[str, Any],
        consumer_options: Mapping[str, Any],
        revoke_timeout: float = 10.0,
        on_assignment: Callable[[set[tuple[str, int]]], None] | None = None,
        on_revoke: Callable[[], None] | None = None,
        flush_tables: Callable[[list[Task]], Awaitable[object]] | None = None,
        aligned_groups: Iterable[Iterable[str]] = (),
        align_max_idle_ms: int = 5_000,
        align_idle_ms: int = 0,
    ) -> None:
        super().__init__()
        self._runtime = runtime
        self._task_manager = tasks
        self._sender = sender
        self._commit_interval = commit_interval
        self._revoke_timeout = revoke_timeout
        self._on_assignment = on_assignment
        self._on_revoke = on_revoke
        self._flush_tables = flush_tables
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "group_id": group_id,
            "client_id": client_id,
            "group_instance_id": group_instance_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "partition_assignment_strategy": (assignor,),
            "max_poll_records": 10_000,
            **client_options,
            **consumer_options,
        }
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: set[TopicPartition] = set()
        self._aligner = TimestampAligner(
            aligned_groups, max_idle_ms=align_max_idle_ms, idle_ms=align_idle_ms
        )
        #: why each partition is paused ("restore": its tables are restoring, "align": the
        #: aligner holds enough of it); it is resumed when no reason is left
        self._pauses: dict[TopicPartition, set[str]] = {}
        #: offset after the last record getmany handed us, per partition. aiokafka's own
        #: position() can run ahead of that (it counts records fetched into its buffer but
        #: not handed out yet), which would make a partition look caught up too early.
        self._delivered_to: dict[TopicPartition, int] = {}
        self._commit_lock = asyncio.Lock()

    @property
    def assigned(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self._assigned}

    async def on_start(self) -> None:
        self._consumer = AIOKafkaConsumer(**self._options)
        await self._consumer.start()
        self._consumer.subscribe(topics=sorted(self._runtime.topics), listener=_Listener(self))

    async def shutdown(self) -> None:
        """Ordered stop: no more fetching, finish in-flight events, flush sends, commit, leave."""
        await self._stop_futures()  # cancels the fetch and commit loops
        tasks = self._task_manager.live()
        self._task_manager.suspend(tasks)
        if not await self._runtime.wait_idle(tasks, self._revoke_timeout):
            log.warning("agents still busy %.0fs after stop was requested", self._revoke_timeout)
        await self._runtime.stop()
        await self._sender.flush()
        await self.commit(tasks)
        self._task_manager.close(tasks)
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def on_stop(self) -> None:
        if self._consumer is not None:
            await self.shutdown()

    @Service.task
    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
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
            for tp, records in batches.items():
                task = owners[tp]
                if not records or task is None:
                    continue
                if not task.running:
                    if task.state is TaskState.RESTORING:
                        # Its tables are still restoring: read these records again later.
                        consumer.seek(tp, records[0].offset)
                        self._delivered_to.pop(tp, None)
                        self._pause(tp, "restore")
                    continue
                self._delivered_to[tp] = records[-1].offset + 1
                raws = [
                    RawRecord(
                        r.topic,
                        r.partition,
                        r.offset,
                        r.timestamp,
                        r.key,
                        r.value,
                        tuple(r.headers or ()),
                    )
                    for r in records
                ]
                if self._aligner.aligned(tp.topic):
                    self._aligner.add(raws)
                    if self._aligner.buffered((tp.topic, tp.partition)) >= _ALIGN_HIGH:
                        self._pause(tp, "align")
                    continue
                await self._runtime.dispatch_many(raws, task)
            await self._release_aligned(consumer)

    async def _dispatch_released(self, released: list[RawRecord]) -> None:
        """Hand records the aligner released to their tasks (it only holds records of
        running tasks: a suspended task's buffers are dropped at once)."""
        by_task: dict[int, tuple[Task, list[RawRecord]]] = {}
        for raw in released:
            task = self._task_manager.task_for(raw.topic, raw.partition)
            if task is None:
                continue
            entry = by_task.get(id(task))
            if entry is None:
                entry = by_task[id(task)] = (task, [])
            entry[1].append(raw)
        for task, raws in by_task.values():
            await self._runtime.dispatch_many(raws, task)

    async def _release_aligned(self, consumer: AIOKafkaConsumer) -> None:
        # For each empty partition holding a group back: when aiokafka last heard from the
        # broker about it, and whether it had fetched everything up to the high watermark.
        fetched_all_at: dict[tuple[str, int], float | None] = {}
        stale: list[TopicPartition] = []
        for topic, partition in self._aligner.waiting_on():
            tp = TopicPartition(topic, partition)
            try:
                highwater = consumer.highwater(tp)
                polled = consumer.last_poll_timestamp(tp)
                delivered = self._delivered_to.get(tp)
                if delivered is None:  # nothing handed out yet: aiokafka buffers nothing past it
                    delivered = await consumer.position(tp)
            except (IllegalStateError, KafkaError, AssertionError):
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

        released = self._aligner.release(caught_up, time.time() * 1000)
        for topic, partition in dict.fromkeys(self._aligner.forced):
            log.warning(
                "no data from %s[%d] for %.1fs: processing its co-partitioned topics without "
                "waiting for it (events it delivers later may be late for joins)",
                topic,
                partition,
                self._aligner.max_idle_ms / 1000,
            )
        self._aligner.forced.clear()
        await self._dispatch_released(released)
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
            if self._consumer is not None and tp in self._assigned:
                self._consumer.resume(tp)

    @Service.task
    async def _commit_loop(self) -> None:
        while not self.should_stop:
            await self.sleep(self._commit_interval)
            await self.commit()

    async def commit(self, tasks: list[Task] | None = None) -> None:
        """Flush the tables of ``tasks`` (default: every live task), then commit the offsets
        of exactly the events whose writes were flushed."""
        consumer = self._consumer
        if consumer is None:
            return
        async with self._commit_lock:
            chosen = self._task_manager.live() if tasks is None else tasks
            if not self._member_in_good_standing():
                log.warning(
                    "not committing: this worker is rejoining the group (its partitions may "
                    "have moved); their next owner resumes from the last commit"
                )
                return
            # Positions first, then the writes, with no await in between: every write taken
            # belongs to an event at or before a committed position, or to an event still in
            # flight (only a crash before the next commit replays those on top).
            positions = self._task_manager.committable(chosen)
            if self._flush_tables is not None:
                # State and changelog first, then the source offsets (at-least-once).
                await self._flush_tables(chosen)
            owned = self.assigned
            positions = {tp: pos for tp, pos in positions.items() if tp in owned}
            if not positions:
                return
            try:
                await consumer.commit(
                    {TopicPartition(t, p): pos for (t, p), pos in positions.items()}
                )
            except (CommitFailedError, IllegalStateError) as exc:
                # The group rebalanced under us; the new owner restarts from the last commit.
                log.warning("commit of %d partitions skipped: %s", len(positions), exc)
                return
            except KafkaError as exc:
                log.error("commit failed: %r", exc)
                return
            self._task_manager.mark_committed(positions)

    def _member_in_good_standing(self) -> bool:
        """False once aiokafka knows this member was fenced out (its generation was reset):
        flushing state then would write changelog records for partitions it no longer owns."""
        consumer = self._consumer
        coordinator = None if consumer is None else getattr(consumer, "_coordinator", None)
        generation = getattr(coordinator, "generation", None)
        return generation is None or generation != _NO_GENERATION

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        tps = {(tp.topic, tp.partition) for tp in revoked}
        tasks = self._task_manager.tasks_of(tps)
        # Before any await: nothing more of these tasks is dispatched or started.
        self._task_manager.suspend(tasks)
        self._aligner.drop(tps)
        fenced = not self._member_in_good_standing()
        idle = fenced or await self._runtime.wait_idle(tasks, self._revoke_timeout)
        if fenced or not idle:
            if not fenced:
                busy = self._runtime.busy_with(tasks)
                log.warning(
                    "agents still busy %.0fs after partitions were revoked (%s); their tasks "
                    "are given up without a commit and their next owner replays them",
                    self._revoke_timeout,
                    ", ".join(busy) or "sends not acknowledged",
                )
            dropped = self._task_manager.lose(tasks)
            log.warning(
                "%s %d tasks without committing (%d unflushed table writes dropped); their "
                "next owner replays from the last commit",
                "fenced out of the group: lost" if fenced else "lost",
                len(tasks),
                dropped,
            )
        else:
            await self._sender.flush()
            await self.commit(tasks)
            self._task_manager.close(tasks)
        self._pauses.clear()  # a new assignment starts unpaused
        self._delivered_to.clear()
        self._assigned = set()
        if self._on_revoke is not None:
            self._on_revoke()

    def on_assigned(self, assigned: set[TopicPartition]) -> None:
        self._assigned = set(assigned)
        log.info(
            "assigned %d partitions: %s",
            len(assigned),
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)),
        )
        if self._on_assignment is not None:
            self._on_assignment(self.assigned)
        for tp in assigned:
            task = self._task_manager.task_for(tp.topic, tp.partition)
            if task is not None and task.state is TaskState.RESTORING:
                self._pause(tp, "restore")

    def resume(self, topic: str, partition: int) -> None:
        """Start fetching a partition again (its tables finished restoring)."""
        self._resume(TopicPartition(topic, partition), "restore")
