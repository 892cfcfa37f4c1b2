"""Changelog fetch answers turned into records and decisions (pure: bytes in, records out).

The restore path (:mod:`streamjoin.runtime.table_state.changelog_reader`) sends Kafka Fetch
requests itself and hands each partition's answer here. Nothing in this module
awaits or touches a socket; record sets are parsed with aiokafka's record batch
readers (C-accelerated), and records come out as plain ``(offset, key, value)``
triples, without the per-record ``ConsumerRecord`` of aiokafka's consumer.

Reading a partition's record set follows Kafka's Java consumer:

* records before the fetch offset are dropped (a fetch from the middle of a
  batch returns the whole batch);
* control batches (transaction markers) are dropped but still advance the position;
* under ``read_committed``, batches of aborted transactions are dropped too,
  using the aborted-transaction list the broker sends with the fetch;
* the next position is the end of the last complete batch (``next_offset``), so
  offset gaps (compaction, markers, skipped batches) advance it; a batch cut
  off by the fetch size limit is left for the next fetch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from aiokafka.errors import for_code
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streamjoin.errors import CorruptRecordSet

READ_UNCOMMITTED = 0
READ_COMMITTED = 1

#: one changelog record: offset, key, value (None: a tombstone)
Record = tuple[int, bytes | None, bytes | None]


class RecordBatch(Protocol):
    """What is used of aiokafka's record batches (v2 ``DefaultRecordBatch``, or legacy v0/v1).

    Legacy batches have ``producer_id`` None and no ``base_offset``; only v2 batches
    with a producer id are looked at for transactions.
    """

    @property
    def next_offset(self) -> int: ...
    @property
    def is_control_batch(self) -> bool: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def producer_id(self) -> int | None: ...
    @property
    def base_offset(self) -> int: ...
    def validate_crc(self) -> bool: ...
    def __iter__(self) -> Any: ...


class BatchReader(Protocol):
    """aiokafka's ``MemoryRecords``: the batches of one partition's fetched bytes, in order."""

    def has_next(self) -> bool: ...
    def next_batch(self) -> RecordBatch | None: ...


@dataclass
class RecordSet:
    """The data batches of one partition's fetch answer, and where the next fetch starts."""

    #: the fetch offset: records below it (in the first batch) are not returned
    start: int
    #: batches holding data, in offset order (control and aborted batches removed)
    batches: list[RecordBatch]
    #: offset of the next fetch: the end of the last complete batch (or ``start``)
    next_offset: int

    @property
    def advanced(self) -> bool:
        return self.next_offset > self.start


def scan_record_set(
    data: bytes | None,
    fetch_offset: int,
    aborted_transactions: Iterable[tuple[int, int]] | None = None,
    *,
    check_crcs: bool = True,
) -> RecordSet:
    """Split one partition's fetched bytes into data batches and the next fetch offset.

    ``aborted_transactions`` are the broker's ``(producer_id, first_offset)`` pairs
    of a ``read_committed`` fetch; None reads uncommitted (only control batches are
    dropped). Only batch headers are parsed here; records are decoded by
    :func:`batch_records` when they are used.
    """
    if not data:
        return RecordSet(fetch_offset, [], fetch_offset)
    return scan_batches(
        MemoryRecords(data), fetch_offset, aborted_transactions, check_crcs=check_crcs
    )


def scan_batches(
    records: BatchReader,
    fetch_offset: int,
    aborted_transactions: Iterable[tuple[int, int]] | None = None,
    *,
    check_crcs: bool = True,
) -> RecordSet:
    """:func:`scan_record_set` of bytes already wrapped by aiokafka (the main fetch path)."""
    aborted = sorted(aborted_transactions or (), key=lambda pair: pair[1])
    aborting: set[int] = set()
    batches: list[RecordBatch] = []
    next_offset = fetch_offset
    while records.has_next():
        batch = records.next_batch()
        if batch is None:  # pragma: no cover - has_next() said there is one
            break
        end = batch.next_offset
        if end <= next_offset:
            continue  # entirely before the fetch offset
        if check_crcs and not batch.validate_crc():
            raise CorruptRecordSet(f"record batch ending at offset {end - 1} fails its CRC check")
        next_offset = end
        producer_id = batch.producer_id
        if aborted_transactions is not None and producer_id is not None and producer_id >= 0:
            while aborted and aborted[0][1] <= batch.base_offset:
                aborting.add(aborted.pop(0)[0])
            if batch.is_control_batch:
                if _is_abort_marker(batch):
                    aborting.discard(producer_id)
                continue
            if batch.is_transactional and producer_id in aborting:
                continue
        if batch.is_control_batch:
            continue
        batches.append(batch)
    return RecordSet(fetch_offset, batches, next_offset)


def _is_abort_marker(batch: RecordBatch) -> bool:
    first = next(iter(batch), None)
    if first is None or first.key is None:
        raise CorruptRecordSet("a control batch holds no control record")
    return bool(ControlRecord.parse(first.key) == ABORT_MARKER)


def batch_records(batch: RecordBatch, start: int) -> list[Record]:
    """The records of one batch at or after ``start``, as (offset, key, value)."""
    records: list[Record] = [(r.offset, r.key, r.value) for r in batch]
    if records and records[0][0] < start:
        records = [record for record in records if record[0] >= start]
    return records


def split_partition_answer(
    api_version: int, fields: Sequence[Any]
) -> tuple[list[tuple[int, int]] | None, bytes | None]:
    """(aborted transactions, record bytes) of one partition of a Fetch response.

    ``fields`` are what follows ``partition, error_code, high_watermark``:
    v4 ``[lso, aborted, records]``; v5-v10 ``[lso, log_start, aborted, records]``;
    v11 ``[lso, log_start, aborted, preferred_read_replica, records]``; before v4
    only ``[records]``.
    """
    records = fields[-1]
    if api_version < 4:
        return None, records
    aborted = fields[1] if api_version == 4 else fields[2]
    return (list(aborted) if aborted else []), records


# ---------------------------------------------------------------------------- fetch planning


@dataclass
class FetchPlan:
    """Which partitions to fetch from which node, and the ones without a known leader."""

    by_node: dict[int, list[tuple[TopicPartition, int]]] = field(default_factory=dict)
    leaderless: list[TopicPartition] = field(default_factory=list)


def plan_fetches(
    wanted: Sequence[tuple[TopicPartition, int]],
    leader_of: Callable[[TopicPartition], int | None],
    busy: Collection[int] = (),
    rotation: int = 0,
) -> FetchPlan:
    """Group ``(partition, fetch offset)`` pairs by leader: one Fetch request per node.

    Nodes in ``busy`` (a fetch is in flight) get nothing. Each node's partitions are
    rotated by ``rotation``: a broker always returns at least one batch of the first
    partition of a request even above the size limits, so rotating guarantees every
    partition eventually comes first.
    """
    plan = FetchPlan()
    for tp, offset in wanted:
        leader = leader_of(tp)
        if leader is None or leader < 0:
            plan.leaderless.append(tp)
        elif leader not in busy:
            plan.by_node.setdefault(leader, []).append((tp, offset))
    for node, parts in plan.by_node.items():
        shift = rotation % len(parts)
        plan.by_node[node] = parts[shift:] + parts[:shift]
    return plan


# ---------------------------------------------------------------------------- errors


class ErrorAction(Enum):
    """What the reader does about a partition's error code in a Fetch or ListOffsets answer."""

    #: the leader moved or is unknown: refresh metadata, then retry
    REFRESH_METADATA = "refresh-metadata"
    #: transient: retry after a backoff
    RETRY = "retry"
    #: the offset is outside the log: the caller must plan again
    OUT_OF_RANGE = "out-of-range"
    #: anything else: fail loudly
    FAIL = "fail"


_OFFSET_OUT_OF_RANGE = 1
#: the Java consumer's "refresh metadata and retry" codes for fetches
_REFRESH_METADATA = frozenset(
    {
        3,  # UNKNOWN_TOPIC_OR_PARTITION
        5,  # LEADER_NOT_AVAILABLE
        6,  # NOT_LEADER_OR_FOLLOWER
        9,  # REPLICA_NOT_AVAILABLE
        56,  # KAFKA_STORAGE_ERROR
        74,  # FENCED_LEADER_EPOCH
        78,  # OFFSET_NOT_AVAILABLE
        100,  # UNKNOWN_TOPIC_ID
        103,  # INCONSISTENT_TOPIC_ID
    }
)
_RETRY = frozenset(
    {
        7,  # REQUEST_TIMED_OUT
        75,  # UNKNOWN_LEADER_EPOCH
    }
)


def error_action(error_code: int) -> ErrorAction:
    """Classify a non-zero partition error code."""
    if error_code == _OFFSET_OUT_OF_RANGE:
        return ErrorAction.OUT_OF_RANGE
    if error_code in _REFRESH_METADATA:
        return ErrorAction.REFRESH_METADATA
    if error_code in _RETRY:
        return ErrorAction.RETRY
    return ErrorAction.FAIL


def error_name(error_code: int) -> str:
    return f"{for_code(error_code).__name__} ({error_code})"
