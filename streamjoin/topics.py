"""Topic declarations and sending (the user-facing half; transports live in ``runtime``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from streamjoin.codecs import Codec
from streamjoin.errors import TransportNotReady as TransportNotReady
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.admin import TopicSpec

if TYPE_CHECKING:
    from streamjoin.runtime.streams import Stream

Headers = Sequence[tuple[str, bytes]]


class Sender(Protocol):
    """Where encoded records go: the Kafka producer, or the in-memory test driver."""

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
        """Enqueue a record; the returned future resolves once the broker acknowledged it."""

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        """Enqueue keyed records for one partition, in order, without headers or timestamps
        (changelog writes); the awaitable gives the last record's offset once every one of
        them is acknowledged. Much cheaper per record than :meth:`send`."""

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (for the key partitioner)."""


#: The stream whose current event is being processed in this task, so sends made
#: while processing it delay that event's acknowledgement until they are acked.
current_stream: ContextVar[Stream | None] = ContextVar("streamjoin_current_stream", default=None)


@dataclass(eq=False)
class Topic:
    """A Kafka topic the app reads or writes, with its codecs and declared partition count."""

    name: str
    key_codec: Codec
    value_codec: Codec
    partitions: int | None = None
    replication_factor: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    #: set by the App at start; None when not running
    sender: Sender | None = field(default=None, repr=False)

    def spec(self, default_partitions: int) -> TopicSpec:
        """What to create when the topic is missing."""
        return TopicSpec(
            self.name,
            self.partitions or default_partitions,
            self.replication_factor,
            dict(self.config),
        )

    async def send(
        self,
        *,
        key: Any = None,
        value: Any = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[Any]:
        """Send one record; returns the delivery future (await it for the record metadata).

        Keyed records go to ``murmur2(key) % partitions`` exactly like Kafka's Java
        client. Inside an agent, the event being processed is not committed until
        this record is acknowledged (at-least-once).
        """
        if self.sender is None:
            raise TransportNotReady(
                f"cannot send to {self.name!r}: the app is not running "
                "(use `async with app:` or `await app.start()`)"
            )
        key_bytes = self.key_codec.dumps(key)
        value_bytes = self.value_codec.dumps(value)
        if partition is None and key_bytes is not None:
            count = self.partitions or await self.sender.partition_count(self.name)
            partition = partition_for_key(key_bytes, count)
        future = await self.sender.send(
            self.name,
            key_bytes,
            value_bytes,
            partition=partition,
            headers=tuple(headers),
            timestamp_ms=timestamp_ms,
        )
        stream = current_stream.get()
        if stream is not None:
            stream.track_send(future)
        return future
