"""The Kafka consumer as a mode service: fetch, hand records to agents, commit.

At-least-once: offsets are committed from the :class:`OffsetTracker`, i.e.
only up to events that were processed and whose sends were acknowledged;
commits happen every ``commit_interval`` seconds, when partitions are revoked
and when the worker stops. Nothing slow happens inside the rebalance callbacks
(aiokafka stops heartbeating until they return): revocation waits a bounded
time for in-flight events, and state restoration (later) runs in a background
service after assignment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from mode import Service

from streamjoin.events import RawRecord
from streamjoin.runtime.producer import KafkaSender
from streamjoin.runtime.streams import AgentRuntime

log = logging.getLogger("streamjoin.consumer")


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
        sender: KafkaSender,
        assignor: AbstractPartitionAssignor,
        commit_interval: float,
        group_instance_id: str | None,
        client_options: Mapping[str, Any],
        consumer_options: Mapping[str, Any],
        revoke_timeout: float = 10.0,
        on_assignment: Callable[[set[tuple[str, int]]], None] | None = None,
        on_revoke: Callable[[], None] | None = None,
        before_commit: Callable[[], Awaitable[object]] | None = None,
        blocked: Callable[[str, int], bool] | None = None,
    ) -> None:
        super().__init__()
        self._runtime = runtime
        self._sender = sender
        self._commit_interval = commit_interval
        self._revoke_timeout = revoke_timeout
        self._on_assignment = on_assignment
        self._on_revoke = on_revoke
        self._before_commit = before_commit
        self._blocked = blocked
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "group_id": group_id,
            "client_id": client_id,
            "group_instance_id": group_instance_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "partition_assignment_strategy": (assignor,),
            "max_poll_records": 500,
            **client_options,
            **consumer_options,
        }
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: set[TopicPartition] = set()
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
        await self._runtime.stop()
        await self._sender.flush()
        await self.commit()
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
                batches = await consumer.getmany(timeout_ms=200)
            except IllegalStateError:
                await self.sleep(0.1)  # not subscribed/assigned yet
                continue
            # getmany only returns records of the current assignment; if a rebalance
            # starts while this batch is handed out, the rest of it is dropped and
            # refetched from the committed offsets by whoever owns the partition next.
            epoch = self._runtime.epoch
            for tp, records in batches.items():
                if records and self._blocked is not None and self._blocked(tp.topic, tp.partition):
                    # Its tables are still restoring: read these records again later.
                    consumer.seek(tp, records[0].offset)
                    consumer.pause(tp)
                    continue
                for r in records:
                    raw = RawRecord(
                        r.topic,
                        r.partition,
                        r.offset,
                        r.timestamp,
                        r.key,
                        r.value,
                        tuple(r.headers or ()),
                    )
                    await self._runtime.dispatch(raw, epoch)
                    if self._runtime.epoch != epoch:
                        break  # revoked meanwhile: the rest is refetched by its owner

    @Service.task
    async def _commit_loop(self) -> None:
        while not self.should_stop:
            await self.sleep(self._commit_interval)
            await self.commit()

    async def commit(self) -> None:
        """Commit what the tracker says is safe, for partitions we still own."""
        consumer = self._consumer
        if consumer is None:
            return
        async with self._commit_lock:
            positions = self._runtime.tracker.committable()
            owned = self.assigned
            positions = {tp: pos for tp, pos in positions.items() if tp in owned}
            if self._before_commit is not None:
                # State and changelog first, then the source offsets (at-least-once).
                await self._before_commit()
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
            self._runtime.tracker.mark_committed(positions)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._runtime.begin_revoke()
        if not await self._runtime.wait_idle(self._revoke_timeout):
            log.warning(
                "agents still busy %.0fs after partitions were revoked; their current events "
                "will be reprocessed by the next owner",
                self._revoke_timeout,
            )
        await self._sender.flush()
        await self.commit()
        self._runtime.forget((tp.topic, tp.partition) for tp in revoked)
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
        if self._blocked is not None and self._consumer is not None:
            waiting = [tp for tp in assigned if self._blocked(tp.topic, tp.partition)]
            if waiting:
                self._consumer.pause(*waiting)

    def resume(self, topic: str, partition: int) -> None:
        """Start fetching a partition again (its tables finished restoring)."""
        tp = TopicPartition(topic, partition)
        if self._consumer is not None and tp in self._assigned:
            self._consumer.resume(tp)
