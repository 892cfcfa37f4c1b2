"""What an agent sees: one decoded record with its position (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RawRecord:
    """A record as it came off a partition, before decoding."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Event:
    """A decoded record: ``key``/``value`` plus where it came from.

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
        return f"{self.topic}[{self.partition}]@{self.offset}"
