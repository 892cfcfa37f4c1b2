"""What an agent sees: one decoded record with its position (pure).

Both classes are created once per record on the hot path, so they are msgspec
``Struct`` types: built in C, about three times faster than a ``__slots__``
dataclass (whose ``__init__`` is Python), with the same fields, keyword and
positional construction, equality and repr. A raw record holds only bytes, str,
ints and tuples, so it is not tracked by the cyclic garbage collector (fewer
collections per record); an event holds the decoded value, which may be anything,
so it is. Treat them as read-only.
"""

from __future__ import annotations

from typing import Any

import msgspec


class RawRecord(msgspec.Struct, gc=False):
    """A record as it came off a partition, before decoding."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def position(self) -> str:
        """``topic[partition]@offset``, for logs and error messages."""
        return _position(self.topic, self.partition, self.offset)


class Event(msgspec.Struct):
    """A decoded record: ``key``/``value`` plus where it came from (read-only).

    ``timestamp`` is the record's Kafka timestamp in milliseconds since the epoch.
    """

    key: Any
    value: Any
    topic: str
    partition: int
    offset: int
    timestamp: int
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def position(self) -> str:
        """``topic[partition]@offset``, for logs and error messages."""
        return _position(self.topic, self.partition, self.offset)


def _position(topic: str, partition: int, offset: int) -> str:
    return f"{topic}[{partition}]@{offset}"
