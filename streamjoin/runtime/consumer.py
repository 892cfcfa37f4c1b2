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
from streamjoin.runtime.processing import TaskProcessing
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
        self._commit_interval = commit_interval
        self._on_assignment = on_assignment
        self._on_revoke = on_revoke
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
        self.processing = TaskProcessing(
            tasks,
            runtime,
            self._aligner,
            flush_tables=flush_tables,
            flush_sends=sender.flush,
            commit_offsets=self._commit_offsets,
            member_ok=self._confirm_membership,
            revoke_timeout=revoke_timeout,
        )
        #: why each partition is paused ("restore": its tables are restoring, "align": the
        #: aligner holds enough of it); it is resumed when no reason is left
        self._pauses: dict[TopicPartition, set[str]] = {}
        #: offset after the last record getmany handed us, per partition. aiokafka's own
        #: position() can run ahead of that (it counts records fetched into its buffer but
        #: not handed out yet), which would make a partition look caught up too early.
        self._delivered_to: dict[TopicPartition, int] = {}

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
        await self.processing.stop()
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
        if self._consumer is not None:
            await self.processing.commit(tasks)

    async def _commit_offsets(self, positions: Mapping[tuple[str, int], int]) -> bool:
        consumer = self._consumer
        owned = self.assigned
        offsets = {
            TopicPartition(t, p): pos for (t, p), pos in positions.items() if (t, p) in owned
        }
        if consumer is None or not offsets:
            return consumer is not None
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # The group rebalanced under us; the new owner restarts from the last commit.
            log.warning("commit of %d partitions skipped: %s", len(offsets), exc)
            return False
        except KafkaError as exc:
            log.error("commit failed: %r", exc)
            return False
        return True

    async def _confirm_membership(self) -> bool:
        """Ask the group coordinator, right before state is flushed, whether this member is
        still in the group (a heartbeat). A member stalled past its session timeout (a long
        GC pause, SIGSTOP, CPU starvation) has been replaced, but aiokafka only learns it
        at its next heartbeat: flushing before that would write changelog records for
        partitions it no longer owns. After a successful heartbeat the coordinator keeps
        the member for a whole session timeout, far longer than a flush takes."""
        if not self._member_in_good_standing():
            return False
        coordinator = self._coordinator()
        heartbeat = getattr(coordinator, "_do_heartbeat", None)
        if coordinator is None or heartbeat is None:
            return True  # not in a group (manual assignment): nothing to confirm
        if getattr(coordinator, "coordinator_id", None) is None:
            return False  # the coordinator is being looked up again: commit next time
        try:
            confirmed = bool(await heartbeat())
        except KafkaError as exc:
            log.warning("could not confirm group membership before committing: %r", exc)
            return False
        return confirmed and self._member_in_good_standing()

    def _member_in_good_standing(self) -> bool:
        """False once aiokafka knows this member was fenced out (its generation was reset):
        flushing state then would write changelog records for partitions it no longer owns."""
        generation = getattr(self._coordinator(), "generation", None)
        return generation is None or generation != _NO_GENERATION

    def _coordinator(self) -> Any:
        """aiokafka's group coordinator (a private attribute: None outside a group)."""
        return None if self._consumer is None else getattr(self._consumer, "_coordinator", None)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        fenced = not self._member_in_good_standing()
        await self.processing.revoke({(tp.topic, tp.partition) for tp in revoked}, fenced=fenced)
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
