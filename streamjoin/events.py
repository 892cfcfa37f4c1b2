"""What an agent sees: one decoded record with its position (pure).

Both classes are created once per record on the hot path, so they are plain
``__slots__`` dataclasses: a frozen dataclass costs about five times as much to
build (every field goes through ``object.__setattr__``). Treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
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


@dataclass(slots=True)
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
