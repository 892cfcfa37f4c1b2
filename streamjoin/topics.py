"""Topic declarations and sending (the user-facing half; transports live in ``runtime``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamjoin.codecs import Codec
from streamjoin.context import Headers, RuntimeLink, Sender, current_event
from streamjoin.errors import TransportNotReady
from streamjoin.partitioner import partition_for_key

__all__ = ["Headers", "Sender", "Topic", "TransportNotReady"]


@dataclass(eq=False)
class Topic:
    """A Kafka topic the app reads or writes, with its codecs and declared partition count."""

    name: str
    key_codec: Codec
    value_codec: Codec
    partitions: int | None = None
    replication_factor: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    #: how the running worker's sender is reached (set by the App)
    link: RuntimeLink = field(default_factory=RuntimeLink, repr=False)

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
        sender = self.link.require_sender(self.name)
        key_bytes = self.key_codec.dumps(key)
        value_bytes = self.value_codec.dumps(value)
        if partition is None and key_bytes is not None:
            count = self.partitions or await sender.partition_count(self.name)
            partition = partition_for_key(key_bytes, count)
        future = await sender.send(
            self.name,
            key_bytes,
            value_bytes,
            partition=partition,
            headers=tuple(headers),
            timestamp_ms=timestamp_ms,
        )
        event = current_event.get()
        if event is not None:
            event.track_send(future)
        return future
