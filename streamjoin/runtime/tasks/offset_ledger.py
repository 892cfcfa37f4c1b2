"""At-least-once offset bookkeeping (pure: no asyncio, no Kafka).

Each record fetched from a partition is registered with the number of agents
that will see it; every agent acknowledges it once the event was processed and
the records it sent were acknowledged by the broker. The committable position
of a partition is one past the newest record before which everything was fully
acknowledged, so a commit never moves past an event whose processing or sends
are unfinished, even when acknowledgements arrive out of order.

Records are kept by runs (the offsets fetched together, read by the same number
of agents), not one by one: almost always one agent reads a topic and
acknowledges its records in offset order, which moves a cursor through the run
at the cost of one comparison per record. Acknowledgements that do not land on
the cursor (several agents, a record whose sends are still unanswered, a batch,
an event settled apart) are counted per record of the run until the cursor has
passed them all.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
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


class _Run:
    """Offsets of one partition registered together (increasing), each awaiting
    ``consumers`` acknowledgements; the first ``done`` are fully acknowledged."""

    __slots__ = ("ahead", "consumers", "counts", "done", "offsets")

    def __init__(self, offsets: tuple[int, ...], consumers: int) -> None:
        self.offsets = offsets
        self.consumers = consumers
        self.done = 0 if consumers > 0 else len(offsets)  # nobody reads them: done
        #: acknowledgements per index that did not just move the cursor (made for the
        #: first of them; None again once the cursor passed them all)
        self.counts: list[int] | None = None
        #: how many acknowledgements ``counts`` holds past the cursor
        self.ahead = 0


def _last_offset(run: _Run) -> int:
    return run.offsets[-1]


class _PartitionLedger:
    """The runs of one partition not yet passed by its position.

    The head run (``runs[0]``) always has a record still open at its ``done``: a run
    whose records are all done is dropped as soon as it is the head.
    """

    __slots__ = ("committed", "held", "last", "passed", "runs")

    def __init__(self) -> None:
        self.runs: deque[_Run] = deque()
        #: records in ``runs`` (so that counting the ones in flight is a subtraction)
        self.held = 0
        #: the newest offset registered: a registration must come after it
        self.last: int | None = None
        #: one past the newest record of the runs dropped (None: none yet)
        self.passed: int | None = None
        self.committed: int | None = None

    def position(self) -> int | None:
        """The next offset to commit: one past the newest record before which (and
        including which) everything is fully acknowledged."""
        runs = self.runs
        if runs:
            head = runs[0]
            if head.done:
                return head.offsets[head.done - 1] + 1
        return self.passed

    def drop_finished(self) -> None:
        """Drop the runs at the head whose records are all done (the position passes them)."""
        runs = self.runs
        while runs and runs[0].done == len(runs[0].offsets):
            offsets = runs.popleft().offsets
            self.held -= len(offsets)
            self.passed = offsets[-1] + 1

    def find(self, offset: int) -> tuple[_Run, int] | None:
        """The run holding ``offset`` and its index there, if it has acknowledgements
        still due (None: never registered, nobody reads it, or done already)."""
        runs = self.runs
        if not runs:
            return None
        run = runs[0]
        offsets = run.offsets
        if offset > offsets[-1]:
            where = bisect_left(runs, offset, key=_last_offset)
            if where == len(runs):
                return None
            run = runs[where]
            offsets = run.offsets
        if offsets[-1] - offsets[0] == len(offsets) - 1:
            index = offset - offsets[0]  # consecutive offsets, the usual case
        else:  # gaps (compaction, transaction markers)
            index = bisect_left(offsets, offset)
            if offsets[index] != offset:
                return None
        return None if index < run.done else (run, index)

    def pass_counted(self, run: _Run, added: int) -> None:
        """``added`` acknowledgements were counted in ``run``: its cursor passes the records
        now fully acknowledged, and the runs finished at the head are dropped."""
        counts = run.counts
        if counts is None:
            return
        consumers = run.consumers
        ahead = run.ahead + added
        done = run.done
        size = len(counts)
        while done < size and counts[done] == consumers:
            ahead -= consumers
            done += 1
        run.done = done
        run.ahead = ahead
        if not ahead:
            run.counts = None  # the cursor walks on its own again
        if done == size:
            self.drop_finished()


def _end_walk(
    ledger: _PartitionLedger, run: _Run, counts: list[int] | None, start: int, walked: int
) -> None:
    """Write back a walk through ``run`` from index ``start`` to ``walked`` (see
    :meth:`OffsetTracker.ack_records`)."""
    if counts is None:
        run.done = walked
        if walked == len(run.offsets):
            ledger.drop_finished()
    elif start == run.done:
        ledger.pass_counted(run, walked - start)
    else:  # ahead of the cursor: nothing passes yet
        run.ahead += walked - start


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
        self.register_many(tp, (offset,), consumers)

    def register_many(self, tp: TopicPartition, offsets: Sequence[int], consumers: int) -> None:
        """:meth:`register` of each of ``offsets`` (increasing, as fetched) with the same
        number of consumers, in one call: the fetch loop registers a batch at a time, and
        the batch is kept as one run."""
        if not offsets:
            return
        ledger = self._ledgers.get(tp)
        if ledger is None:
            ledger = self._ledgers[tp] = _PartitionLedger()
        last = ledger.last
        if last is not None and offsets[0] <= last:
            raise InternalError(
                f"{tp[0]}[{tp[1]}]: offset {offsets[0]} registered after {last}; "
                "offsets of a partition must be registered in order"
            )
        ledger.last = offsets[-1]
        if consumers <= 0 and not ledger.runs:
            ledger.passed = offsets[-1] + 1  # nobody processes them: done at once
            return
        ledger.runs.append(_Run(tuple(offsets), max(consumers, 0)))
        ledger.held += len(offsets)

    def ack(self, tp: TopicPartition, offset: int) -> None:
        """One agent finished ``offset`` of ``tp`` (processing and its sends)."""
        self.ack_records((_At(tp[0], tp[1], offset),))

    def ack_records(self, records: Iterable[Position]) -> None:
        """:meth:`ack` of each record's offset, in one call (an actor acknowledges the events
        it finished together). Records that come in the offset order of a run only move
        the local index ``walked`` (and, when the run counts its acknowledgements, add one
        to the record's count): the walk is written back when it ends."""
        ledgers = self._ledgers
        topic = ""
        partition = -1
        ledger: _PartitionLedger | None = None
        run: _Run | None = None  # the run walked
        counts: list[int] | None = None  # its counts (None: the walk moves its cursor)
        offsets: tuple[int, ...] = ()
        walked = size = start = consumers = 0
        for record in records:
            offset = record.offset
            if (
                walked < size
                and offsets[walked] == offset
                and record.partition == partition
                and record.topic == topic
            ):
                if counts is None:
                    walked += 1
                    continue
                count = counts[walked] + 1
                if count <= consumers:
                    counts[walked] = count
                    walked += 1
                    continue
            if run is not None and ledger is not None:
                _end_walk(ledger, run, counts, start, walked)
                run = None
                size = 0
            if record.partition != partition or record.topic != topic:
                topic, partition = record.topic, record.partition
                ledger = ledgers.get((topic, partition))
            if ledger is not None and ledger.runs:
                run = ledger.runs[0]
                offsets = run.offsets
                start = run.done
                size = len(offsets)
                counts = run.counts
                if counts is None and run.consumers == 1 and offsets[start] == offset:
                    walked = start + 1  # the usual case: in order
                    continue
                index = offset - offsets[0]
                if index < start or index >= size or offsets[index] != offset:
                    found = ledger.find(offset)  # in another run, or offsets with gaps
                    if found is None:
                        raise InternalError(
                            f"{topic}[{partition}]@{offset} acknowledged but not pending"
                        )
                    run, index = found
                    offsets = run.offsets
                    size = len(offsets)
                    counts = run.counts
                start = index
                walked = index + 1
                consumers = run.consumers
                if counts is None:
                    if consumers == 1 and index == run.done:
                        continue  # in order, behind a run still open
                    counts = run.counts = [0] * size
                count = counts[index] + 1
                if count <= consumers:
                    counts[index] = count
                    continue
                run = None
            raise InternalError(f"{topic}[{partition}]@{offset} acknowledged but not pending")
        if run is not None and ledger is not None:
            _end_walk(ledger, run, counts, start, walked)

    def committable(self) -> dict[TopicPartition, int]:
        """Positions that advanced since the last :meth:`mark_committed`."""
        out: dict[TopicPartition, int] = {}
        for tp, ledger in self._ledgers.items():
            position = ledger.position()
            if position is not None and position != ledger.committed:
                out[tp] = position
        return out

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        for tp, position in positions.items():
            ledger = self._ledgers.get(tp)
            if ledger is not None:
                ledger.committed = position

    def in_flight(self, tp: TopicPartition) -> int:
        """Records of ``tp`` registered that the committable position has not passed yet
        (a record acknowledged out of order still waits for the ones before it)."""
        ledger = self._ledgers.get(tp)
        if ledger is None:
            return 0
        runs = ledger.runs
        return ledger.held - (runs[0].done if runs else 0)

    def positions(self, tp: TopicPartition) -> tuple[int | None, int | None]:
        """``(processed, committed)`` of ``tp``: the next offset after the records fully
        acknowledged, and the last position committed by this tracker (None: not yet)."""
        ledger = self._ledgers.get(tp)
        return (None, None) if ledger is None else (ledger.position(), ledger.committed)
