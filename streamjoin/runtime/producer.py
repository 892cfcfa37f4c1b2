"""The Kafka producer as a mode service implementing :class:`streamjoin.topics.Sender`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from mode import Service

from streamjoin.errors import InternalError, LifecycleError, RecordTooLargeError
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.topics import Headers


class KafkaSender(Service):
    """Idempotent, ``acks=all`` producer: a send's future resolves once the record is durable."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_options: Mapping[str, Any],
        producer_options: Mapping[str, Any],
        client_id: str,
        counters: WorkerCounters | None = None,
    ) -> None:
        super().__init__()
        #: records out per topic, changelog flush sizes
        self.counters = counters if counters is not None else WorkerCounters()
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "client_id": client_id,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 5,
            # bigger record batches: fewer produce round trips for changelog flushes
            "max_batch_size": 256 * 1024,
            **client_options,
            **producer_options,
        }
        self._producer: AIOKafkaProducer | None = None

    async def on_start(self) -> None:
        self._producer = AIOKafkaProducer(**self._options)
        await self._producer.start()

    async def on_stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()  # flushes what is buffered
            self._producer = None

    def _require(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise LifecycleError("the producer is not started")
        return self._producer

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None,
        headers: Headers,
        timestamp_ms: int | None,
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = await self._require().send(
            topic,
            value,
            key=key,
            partition=partition,
            headers=list(headers) or None,
            timestamp_ms=timestamp_ms,
        )
        out = self.counters.records_out
        out[topic] = out.get(topic, 0) + 1
        return future

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        """Records appended straight into record batches (no future or metadata lookup per
        record, unlike :meth:`send`): the changelog flush path."""
        producer = self._require()
        batches: list[tuple[asyncio.Future[Any], int]] = []
        batch, count = producer.create_batch(), 0
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:
                # full: send it and start the next one (an empty batch takes any record)
                if count:
                    sent = await producer.send_batch(batch, topic, partition=partition)
                    batches.append((sent, count))
                    batch, count = producer.create_batch(), 0
                if batch.append(key=key, value=value, timestamp=None) is None:
                    raise RecordTooLargeError(
                        f"a record for {topic}[{partition}] does not fit in a record batch "
                        f"(key {len(key)} bytes, value {len(value or b'')} bytes); raise the "
                        "producer's max_batch_size"
                    )
            count += 1
        if count:
            batches.append((await producer.send_batch(batch, topic, partition=partition), count))
        self.counters.sent(topic, len(records))
        self.counters.changelog_flush_records.observe(len(records))
        return asyncio.ensure_future(_last_offset(batches))

    async def partition_count(self, topic: str) -> int:
        partitions = await self._require().partitions_for(topic)
        return len(partitions)

    async def flush(self) -> None:
        if self._producer is not None:
            await self._producer.flush()


async def _last_offset(batches: Sequence[tuple[asyncio.Future[Any], int]]) -> int:
    """Offset of the last record of the last batch, once every batch is acknowledged."""
    if not batches:
        raise InternalError("nothing was sent")
    metas = await asyncio.gather(*(future for future, _ in batches))
    return int(metas[-1].offset) + batches[-1][1] - 1
