"""Moving a stopped consumer group's committed offsets: skip a poison record, reset, show.

Under ``on_error="stop"`` a record an agent cannot process stops the worker, and every
restart stops at it again. ``streamjoin offsets skip`` moves the group past it without
Kafka's Java tools. The rules, all enforced here:

* **Only a stopped group.** A running member commits its own positions and would undo the
  move (and the broker refuses a group-less commit into an active group anyway), so
  every move first checks that the group has no members (DescribeGroups).
* **A committed offset is the next record to read.** Skipping the record at offset *N*
  commits *N + 1*. A skip only moves from exactly *N* (where a worker stopped by that
  record leaves the group's offset); from anywhere else it would also skip, or replay,
  other records, so it is refused unless forced.
* **Resets stay inside the partition's records**: earliest, a given offset, or the first
  record at or after a time (the end when there is none).

The planning is pure (:func:`plan_skip`, :func:`plan_reset`); the rest is a thin shell
over aiokafka's admin client (group and committed offsets) and consumers (log start and
end offsets, offsets by time, and the commit itself, from a consumer that joins nothing).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamjoin.errors import (
    ConfigurationError,
    OffsetMoveRefused,
    ProvisioningError,
)
from streamjoin.runtime.group.group_info import describe_group_raw
from streamjoin.runtime.transport.topic_admin import describe_partition_counts

__all__ = [
    "OffsetMove",
    "PartitionOffsets",
    "ResetTarget",
    "active_members",
    "apply_moves",
    "ensure_stopped",
    "offsets_at",
    "parse_time",
    "plan_reset",
    "plan_skip",
    "read_offsets",
]


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition as the group sees it: its committed offset and its records' range."""

    topic: str
    partition: int
    #: the next offset the group reads (None: the group never committed here)
    committed: int | None
    #: the log start offset (the first record still kept)
    beginning: int
    #: the offset the next record written will get
    end: int

    @property
    def lag(self) -> int:
        """Records the group has not read yet (from the log start when never committed)."""
        position = self.beginning if self.committed is None else self.committed
        return max(0, self.end - max(position, self.beginning))

    @property
    def name(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True)
class OffsetMove:
    """A committed offset to change: ``old`` (None: no commit yet) to ``new``."""

    topic: str
    partition: int
    old: int | None
    new: int

    @property
    def changes(self) -> bool:
        return self.old != self.new

    def describe(self) -> str:
        old = "none" if self.old is None else str(self.old)
        note = "" if self.changes else " (unchanged)"
        return f"{self.topic}[{self.partition}]: {old} -> {self.new}{note}"


@dataclass(frozen=True)
class ResetTarget:
    """Where ``reset`` moves each selected partition: exactly one of the three is set."""

    earliest: bool = False
    offset: int | None = None
    #: epoch milliseconds: the first record at or after it
    time_ms: int | None = None

    def __post_init__(self) -> None:
        chosen = sum((self.earliest, self.offset is not None, self.time_ms is not None))
        if chosen != 1:
            raise ConfigurationError(
                "choose exactly one of --to-earliest, --to-offset N, --to-time T"
            )
        if self.offset is not None and self.offset < 0:
            raise ConfigurationError(f"--to-offset must be >= 0, got {self.offset}")


# ---------------------------------------------------------------------------- pure planning


def parse_time(text: str) -> int:
    """Epoch milliseconds from ``1700000000000`` or an ISO 8601 time (UTC unless it says)."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    try:
        when = dt.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigurationError(
            f"--to-time {text!r} is neither epoch milliseconds nor an ISO 8601 time "
            "(e.g. 2024-05-01T12:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


def plan_skip(current: PartitionOffsets, offset: int, *, force: bool = False) -> OffsetMove:
    """Commit ``offset + 1``: the group reads on after the record at ``offset``.

    Refused (unless ``force``) when the group's position is not ``offset``: it would skip
    the records in between too, or move back over processed ones.
    """
    if not current.beginning <= offset < current.end:
        raise OffsetMoveRefused(
            f"{current.name} has no record at offset {offset} "
            f"(its records are at {_span(current.beginning, current.end)})"
        )
    position = current.committed
    if position is None:
        position = current.beginning  # a group without a commit starts at the earliest
    if position != offset and not force:
        if position < offset:
            raise OffsetMoveRefused(
                f"the group's next record in {current.name} is {position}, not {offset}: "
                f"skipping {offset} would also skip {offset - position} records before it "
                f"({position}..{offset - 1}). Skip the record at {position} if that is the "
                "one that fails, or add --force to skip them all"
            )
        raise OffsetMoveRefused(
            f"the group is already past offset {offset} in {current.name} (next: {position}); "
            f"add --force to move it back to {offset + 1}"
        )
    return OffsetMove(current.topic, current.partition, current.committed, offset + 1)


def plan_reset(
    partitions: Sequence[PartitionOffsets],
    target: ResetTarget,
    by_time: Mapping[tuple[str, int], int | None] | None = None,
) -> list[OffsetMove]:
    """The moves of a reset. ``by_time``: per partition, the offset of the first record at
    or after ``target.time_ms`` (None: no such record; the partition moves to its end)."""
    moves: list[OffsetMove] = []
    for p in partitions:
        if target.earliest:
            new = p.beginning
        elif target.offset is not None:
            if not p.beginning <= target.offset <= p.end:
                raise OffsetMoveRefused(
                    f"offset {target.offset} is outside {p.name} "
                    f"(offsets {p.beginning}..{p.end}, where {p.end} is the end)"
                )
            new = target.offset
        else:
            found = (by_time or {}).get((p.topic, p.partition))
            new = p.end if found is None else max(found, p.beginning)
        moves.append(OffsetMove(p.topic, p.partition, p.committed, new))
    return moves


def _span(beginning: int, end: int) -> str:
    return "none: the partition is empty" if end <= beginning else f"{beginning}..{end - 1}"


# ---------------------------------------------------------------------------- the shell


async def active_members(
    bootstrap_servers: str, group_id: str, **client_kwargs: object
) -> tuple[str, int]:
    """The group's state (as Kafka names it) and how many members it has."""
    group = await describe_group_raw(bootstrap_servers, group_id, **client_kwargs)
    return group["state"], len(group["members"])


async def ensure_stopped(bootstrap_servers: str, group_id: str, **client_kwargs: object) -> None:
    """Raise :class:`OffsetMoveRefused` while the group has members."""
    _, members = await active_members(bootstrap_servers, group_id, **client_kwargs)
    if members:
        raise OffsetMoveRefused(
            f"group {group_id} has {members} active member{'s' if members != 1 else ''}; "
            "stop the workers first"
        )


async def read_offsets(
    bootstrap_servers: str,
    group_id: str,
    topics: Iterable[str],
    *,
    partition: int | None = None,
    **client_kwargs: object,
) -> list[PartitionOffsets]:
    """Committed, log start and end offsets of every partition of ``topics`` (or only
    ``partition``), sorted. Unknown topics and partitions are an error naming them."""
    wanted = sorted(set(topics))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        counts = await describe_partition_counts(admin, wanted)
        missing = [t for t in wanted if t not in counts]
        if missing:
            raise OffsetMoveRefused(f"no such topic: {', '.join(missing)}")
        tps = [
            TopicPartition(t, p)
            for t in wanted
            for p in range(counts[t])
            if partition is None or p == partition
        ]
        if not tps:
            raise OffsetMoveRefused(
                f"partition {partition} does not exist in "
                + ", ".join(f"{t} ({counts[t]} partitions)" for t in wanted)
            )
        committed = await admin.list_consumer_group_offsets(group_id, partitions=tps)
    finally:
        await admin.close()
    async with _reader(bootstrap_servers, client_kwargs) as consumer:
        beginnings = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
    out = []
    for tp in tps:
        meta = committed.get(tp)
        offset = None if meta is None or meta.offset < 0 else int(meta.offset)
        out.append(PartitionOffsets(tp.topic, tp.partition, offset, beginnings[tp], ends[tp]))
    return out


async def offsets_at(
    bootstrap_servers: str,
    partitions: Iterable[PartitionOffsets],
    time_ms: int,
    **client_kwargs: object,
) -> dict[tuple[str, int], int | None]:
    """Per partition, the offset of its first record at or after ``time_ms`` (or None)."""
    tps = [TopicPartition(p.topic, p.partition) for p in partitions]
    async with _reader(bootstrap_servers, client_kwargs) as consumer:
        found = await consumer.offsets_for_times({tp: time_ms for tp in tps})
    return {(tp.topic, tp.partition): None if f is None else f.offset for tp, f in found.items()}


async def apply_moves(
    bootstrap_servers: str,
    group_id: str,
    moves: Sequence[OffsetMove],
    **client_kwargs: object,
) -> None:
    """Commit the moves for ``group_id`` from a consumer that joins nothing (generation -1:
    the broker accepts it only while the group has no members)."""
    changed = [m for m in moves if m.changes]
    if not changed:
        return
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=group_id,
        enable_auto_commit=False,
        **client_kwargs,
    )
    await consumer.start()
    try:
        tps = {TopicPartition(m.topic, m.partition): m.new for m in changed}
        consumer.assign(list(tps))
        await consumer.commit(tps)
    except Exception as exc:
        raise ProvisioningError(
            f"committing offsets for group {group_id!r} failed: {type(exc).__name__}: {exc} "
            "(did a worker start meanwhile?)"
        ) from exc
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def _reader(
    bootstrap_servers: str, client_kwargs: Mapping[str, object]
) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer outside any group, for log start/end offsets and offsets by time."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers, group_id=None, **dict(client_kwargs)
    )
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()
