"""What an agent sees: one decoded record with its position (pure).

Both classes are created once per record on the hot path and read many times there, so
they are compiled with mypyc (:mod:`streamjoin.compiled`) as native dataclasses: compiled
code builds one in about half the time of a msgspec ``Struct`` and reads a field as a C
struct member (about 2 ns, against about 17 ns through CPython's generic attribute
lookup for a ``Struct``). Keyword and positional construction, equality and repr are a
dataclass's. Treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RawRecord:
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


@dataclass
class Event:
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
