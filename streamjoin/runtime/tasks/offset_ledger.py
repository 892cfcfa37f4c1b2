"""At-least-once offset bookkeeping (pure: no asyncio, no Kafka).

Each record fetched from a partition is registered with the number of agents
that will see it; every agent acknowledges it once the event was processed and
the records it sent were acknowledged by the broker. The committable position
of a partition is the offset of its oldest record not yet fully acknowledged
(or one past the newest when all are), so a commit never moves past an event
whose processing or sends are unfinished, even when acknowledgements arrive
out of order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from streamjoin.errors import InternalError

TopicPartition = tuple[str, int]


class Position(Protocol):
    """Where a record was read (a :class:`~streamjoin.events.RawRecord`, say)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


@dataclass
class _PartitionLedger:
    #: [offset, remaining acks] in fetch order
    pending: deque[list[int]] = field(default_factory=deque)
    index: dict[int, list[int]] = field(default_factory=dict)
    #: next offset to commit once everything before it is acknowledged
    position: int | None = None
    committed: int | None = None


class _At(NamedTuple):
    topic: str
    partition: int
    offset: int


class OffsetTracker:
    """Committable positions per partition from out-of-order acknowledgements."""

    def __init__(self) -> None:
        self._ledgers: dict[TopicPartition, _PartitionLedger] = {}

    def register(self, tp: TopicPartition, offset: int, consumers: int) -> None:
        """Record that ``offset`` of ``tp`` was handed to ``consumers`` agents."""
        ledger = self._ledgers.get(tp)
        if ledger is None:
            ledger = self._ledgers[tp] = _PartitionLedger()
        last = ledger.pending[-1][0] if ledger.pending else ledger.position
        if last is not None and offset < last:
            raise InternalError(
                f"{tp[0]}[{tp[1]}]: offset {offset} registered after {last}; "
                "offsets of a partition must be registered in order"
            )
        if consumers <= 0:
            # Nobody processes it: it is done as soon as everything before it is.
            entry = [offset, 0]
        else:
            entry = [offset, consumers]
            ledger.index[offset] = entry
        ledger.pending.append(entry)
        self._advance(ledger)

    def register_many(self, tp: TopicPartition, offsets: Sequence[int], consumers: int) -> None:
        """:meth:`register` of each of ``offsets`` (increasing, as fetched) with the same
        number of consumers, in one call: the fetch loop registers a batch at a time."""
        if not offsets:
            return
        ledger = self._ledgers.get(tp)
        if ledger is None:
            ledger = self._ledgers[tp] = _PartitionLedger()
        last = ledger.pending[-1][0] if ledger.pending else ledger.position
        if last is not None and offsets[0] < last:
            raise InternalError(
                f"{tp[0]}[{tp[1]}]: offset {offsets[0]} registered after {last}; "
                "offsets of a partition must be registered in order"
            )
        if consumers <= 0:
            if not ledger.pending:
                ledger.position = offsets[-1] + 1  # nobody processes them: done at once
                return
            ledger.pending.extend([offset, 0] for offset in offsets)
            return
        entries = [[offset, consumers] for offset in offsets]
        ledger.pending.extend(entries)
        ledger.index.update(zip(offsets, entries, strict=True))

    def ack(self, tp: TopicPartition, offset: int) -> None:
        """One agent finished ``offset`` of ``tp`` (processing and its sends)."""
        self.ack_records((_At(tp[0], tp[1], offset),))

    def ack_records(self, records: Iterable[Position]) -> None:
        """:meth:`ack` of each record's offset, in one call (an actor acknowledges the events
        it finished together; consecutive records of one partition share its ledger)."""
        topic = ""
        partition = -1
        ledger: _PartitionLedger | None = None
        for record in records:
            if record.partition != partition or record.topic != topic:
                topic, partition = record.topic, record.partition
                ledger = self._ledgers.get((topic, partition))
            offset = record.offset
            entry = None if ledger is None else ledger.index.get(offset)
            if ledger is None or entry is None:
                raise InternalError(f"{topic}[{partition}]@{offset} acknowledged but not pending")
            entry[1] -= 1
            if entry[1] == 0:
                del ledger.index[offset]
                pending = ledger.pending
                if pending[0] is entry:  # in order (the usual case): it and what follows is done
                    pending.popleft()
                    ledger.position = offset + 1
                    while pending and pending[0][1] == 0:
                        ledger.position = pending.popleft()[0] + 1

    @staticmethod
    def _advance(ledger: _PartitionLedger) -> None:
        while ledger.pending and ledger.pending[0][1] == 0:
            ledger.position = ledger.pending.popleft()[0] + 1

    def committable(self) -> dict[TopicPartition, int]:
        """Positions that advanced since the last :meth:`mark_committed`."""
        return {
            tp: ledger.position
            for tp, ledger in self._ledgers.items()
            if ledger.position is not None and ledger.position != ledger.committed
        }

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        for tp, position in positions.items():
            ledger = self._ledgers.get(tp)
            if ledger is not None:
                ledger.committed = position

    def in_flight(self, tp: TopicPartition) -> int:
        """Records of ``tp`` registered but not yet fully acknowledged."""
        ledger = self._ledgers.get(tp)
        return 0 if ledger is None else len(ledger.pending)

    def positions(self, tp: TopicPartition) -> tuple[int | None, int | None]:
        """``(processed, committed)`` of ``tp``: the next offset after the records fully
        acknowledged, and the last position committed by this tracker (None: not yet)."""
        ledger = self._ledgers.get(tp)
        return (None, None) if ledger is None else (ledger.position, ledger.committed)
