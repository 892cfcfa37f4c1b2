"""The Kafka producer as a mode service implementing :class:`streamjoin.topics.Sender`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from mode import Service

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
    ) -> None:
        super().__init__()
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "client_id": client_id,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 5,
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
            raise RuntimeError("the producer is not started")
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
        return future

    async def partition_count(self, topic: str) -> int:
        partitions = await self._require().partitions_for(topic)
        return len(partitions)

    async def flush(self) -> None:
        if self._producer is not None:
            await self._producer.flush()
