"""Blocking Kafka helpers for the Spark driver and tasks (aiokafka on a private event loop).

Spark tasks are synchronous; they produce output with explicit partitions and
record timestamps (which Spark's Kafka sink cannot set per record), so they run
a small aiokafka producer on their own loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from streamjoin.runtime.transport.topic_admin import (
    TopicSpec,
    ensure_topics,
    fetch_partition_counts,
)

__all__ = [
    "TaskProducer",
    "commit_group_offsets",
    "ensure_topic",
    "offset_bounds",
    "partition_counts",
]

T = TypeVar("T")
Offsets = dict[str, dict[int, int]]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def partition_counts(
    bootstrap: str, topics: Iterable[str], client_options: Mapping[str, Any]
) -> dict[str, int]:
    """Partition counts of the existing ``topics`` (missing ones are absent)."""
    return _run(fetch_partition_counts(bootstrap, list(topics), **client_options))


def ensure_topic(
    bootstrap: str, name: str, partitions: int, client_options: Mapping[str, Any]
) -> None:
    """Create ``name`` with ``partitions`` partitions if missing (fails on a count mismatch)."""
    _run(ensure_topics(bootstrap, [TopicSpec(name, partitions)], **client_options))


def offset_bounds(
    bootstrap: str, topics: Iterable[str], client_options: Mapping[str, Any]
) -> tuple[Offsets, Offsets]:
    """``(beginning, end)`` offsets of every partition of ``topics``."""

    async def fetch() -> tuple[Offsets, Offsets]:
        counts = await fetch_partition_counts(bootstrap, list(topics), **client_options)
        tps = [TopicPartition(t, p) for t, n in sorted(counts.items()) for p in range(n)]
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **client_options
        )
        await consumer.start()
        try:
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        begin: Offsets = {}
        end: Offsets = {}
        for tp in tps:
            begin.setdefault(tp.topic, {})[tp.partition] = starts[tp]
            end.setdefault(tp.topic, {})[tp.partition] = ends[tp]
        return begin, end

    return _run(fetch())


def commit_group_offsets(
    bootstrap: str, group: str, offsets: Offsets, client_options: Mapping[str, Any]
) -> None:
    """Commit ``offsets`` (next offset to read) for an idle consumer group, so the app's agents
    start after the history a bootstrap already covered."""

    async def commit() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, **client_options
        )
        await consumer.start()
        try:
            tps = {TopicPartition(t, p): o for t, ps in offsets.items() for p, o in ps.items()}
            consumer.assign(list(tps))
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in tps.items()})
        finally:
            await consumer.stop()

    _run(commit())


class TaskProducer:
    """A blocking producer for one Spark task: ``send`` queues, ``flush`` waits for the acks and
    returns the highest offset acknowledged per partition."""

    def __init__(
        self, bootstrap: str, client_options: Mapping[str, Any], batch: int = 5_000
    ) -> None:
        self._loop = asyncio.new_event_loop()

        async def start() -> AIOKafkaProducer:
            # aiokafka binds to the running loop, so it is built inside it
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, acks="all", linger_ms=20, **client_options
            )
            await producer.start()
            return producer

        self._producer = self._loop.run_until_complete(start())
        self._pending: list[tuple[int, asyncio.Future[Any]]] = []
        self._batch = batch
        self.last_offsets: dict[int, int] = {}
        self.sent = 0

    def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        ts: int | None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        future = self._loop.run_until_complete(
            self._producer.send(
                topic,
                value,
                key=key,
                partition=partition,
                timestamp_ms=ts,
                headers=list(headers) or None,
            )
        )
        self._pending.append((partition, future))
        self.sent += 1
        if len(self._pending) >= self._batch:
            self.flush()

    def flush(self) -> dict[int, int]:
        if self._pending:
            metas = self._loop.run_until_complete(asyncio.gather(*(f for _, f in self._pending)))
            for (partition, _), meta in zip(self._pending, metas, strict=True):
                self.last_offsets[partition] = max(
                    self.last_offsets.get(partition, -1), int(meta.offset)
                )
            self._pending = []
        return dict(self.last_offsets)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._loop.run_until_complete(self._producer.stop())
            self._loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on this producer's loop (async join functions)."""
        return self._loop.run_until_complete(coro)
