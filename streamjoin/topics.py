"""Topic declarations and sending (the user-facing half; transports live in ``runtime``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamjoin.codecs import Codec
from streamjoin.context import Delivery, Headers, RuntimeLink, Sender, current_event
from streamjoin.errors import ArgumentTypeError, ConfigurationError
from streamjoin.partitioner import partition_for_key
from streamjoin.quick_sends import try_send_record

__all__ = ["Delivery", "Headers", "Sender", "Topic", "check_timestamp_ms"]


def check_timestamp_ms(timestamp_ms: object, timestamp: object, where: str) -> int | None:
    """The record time given to ``where``, checked: ``timestamp_ms`` (milliseconds since the
    epoch, what :attr:`Event.timestamp <streamjoin.events.Event.timestamp>` holds) or None.

    ``timestamp=`` is the name of the event's field, so it is the natural slip; it is
    refused by name rather than with Python's bare "unexpected keyword argument"."""
    if timestamp is None and (
        timestamp_ms is None or (type(timestamp_ms) is int and timestamp_ms >= 0)
    ):
        return timestamp_ms  # the usual case, first: sends call this once per record
    if timestamp is not None:
        raise ArgumentTypeError(
            f"{where} takes the record time as timestamp_ms= (milliseconds since the epoch, "
            f"what Event.timestamp holds), not timestamp=; got timestamp={timestamp!r}"
        )
    if timestamp_ms is None:
        return None
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
        raise ArgumentTypeError(
            f"{where}: timestamp_ms must be an int (milliseconds since the epoch), "
            f"got {type(timestamp_ms).__qualname__} {timestamp_ms!r}"
        )
    if timestamp_ms < 0:
        raise ConfigurationError(f"{where}: timestamp_ms must be >= 0, got {timestamp_ms}")
    return timestamp_ms


@dataclass(eq=False)
class Topic:
    """A Kafka topic the app reads or writes, with its codecs and declared partition count."""

    name: str
    key_codec: Codec
    value_codec: Codec
    partitions: int | None = None
    #: None: decided when created, from the cluster (App(topic_replication_factor="auto"))
    replication_factor: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)
    #: how the running worker's sender is reached (set by the App)
    link: RuntimeLink = field(default_factory=RuntimeLink, repr=False)
    #: how send()'s argument errors name it (built once, at declaration)
    _send_where: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._send_where = f"{self.name!r}: send()"

    async def send(
        self,
        *,
        key: Any = None,
        value: Any = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
        timestamp: None = None,
    ) -> Delivery:
        """Send one record; returns its delivery, a light future-like handle (await it for
        the record metadata; ``done()``, ``result()``, ``exception()`` and
        ``add_done_callback()`` work as on an asyncio future).

        Keyed records go to ``murmur2(key) % partitions`` exactly like Kafka's Java
        client. ``timestamp_ms`` is the record time in milliseconds since the epoch
        (default: now); ``timestamp=`` is refused with that advice. Inside an agent,
        the event being processed is not committed until this record is acknowledged
        (at-least-once).
        """
        timestamp_ms = check_timestamp_ms(timestamp_ms, timestamp, self._send_where)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        sender = self.link.require_sender(self.name)
        key_bytes = self.key_codec.dumps(key)
        value_bytes = self.value_codec.dumps(value)
        if partition is None and key_bytes is not None:
            count = (
                self.partitions
                or self.link.partitions.get(self.name)
                or await sender.partition_count(self.name)
            )
            partition = partition_for_key(key_bytes, count)
        sent = await sender.send(
            (
                self.name,
                key_bytes,
                value_bytes,
                partition,
                list(headers) if headers else (),
                timestamp_ms,
            )
        )
        event = current_event.get()
        if event is not None:
            event.track_send(sent)
        return sent

    def try_send(
        self,
        *,
        key: Any = None,
        value: Any = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Delivery | None:
        """:meth:`send` without awaiting, when the record can join its partition's open
        batch or open the next one at once (the usual case while records flow); None when
        it cannot (a partition not written to yet, too many full batches waiting, a record
        with neither key nor partition starting a batch, a topic whose partition count is
        not known yet, a transaction ending): then ``await send(...)`` the same record. No
        coroutine per record: the framework's joins send their outputs this way. Errors
        are those of :meth:`send`."""
        # (the checks of send(), with their common outcomes first: once per record)
        if timestamp_ms is None:
            # (now, here: the record goes out as built, not rebuilt with its time)
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or timestamp_ms < 0:
            timestamp_ms = check_timestamp_ms(timestamp_ms, None, self._send_where)
        return try_send_record(self, key, value, headers, partition, timestamp_ms)
