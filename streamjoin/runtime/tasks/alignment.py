"""Timestamp-ordered consumption of co-partitioned topics (pure: no Kafka, no asyncio).

A join's agent reads partition p of both of its input topics as one stream.
If records were handed over in fetch order, one side could run far ahead of
the other (after a restart, or because one topic has more data), advancing the
join's stream time and closing windows before the other side's matching events
arrived. Like Kafka Streams, the aligner buffers fetched records per topic
partition and releases, for each partition number of a group, always the
buffered record with the lowest timestamp, but only while every topic of the
group has a buffered record, or the empty ones are known to be caught up (no
more data to fetch, according to a fetch answered *after* the group started
waiting, so a stale "empty" answer cannot let one side run ahead) and the group
waited ``idle_ms`` (0 by default; like Kafka Streams' ``max.task.idle.ms``, it
gives a producer that writes one input a little behind the other time to catch
up), or the group waited longer than ``max_idle_ms`` for a partition known to
have more data.

Waited time is counted in bounded steps: each :meth:`TimestampAligner.release`
call adds the time since the previous call, but at most ``max_step_ms``
(:data:`MAX_WAIT_STEP_MS`, 1 s). The runtime calls ``release`` once per
fetch round (about every 100-200 ms: the fetch loop's ``getmany`` waits at most
100 ms, and the broker holds a fetch that finds nothing for ``fetch_max_wait_ms``,
100 ms by default), so steady polling counts wall time in full
and reaches ``max_idle_ms``/``idle_ms`` on time; but when the event loop stalls
(GC, CPU throttling, a slow callback, a wall-clock jump) the fetcher stalls
with it, and that gap adds at most one step instead of forcing a group whose
other side was never given a chance to be fetched. The wall-clock start of a
wait is still what ``caught_up`` compares fetch answers against.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import groupby
from operator import attrgetter

from streamjoin.errors import ConfigurationError
from streamjoin.events import RawRecord

TopicPartition = tuple[str, int]

#: a record's (topic, partition), in C (records are grouped by it in runs)
topic_partition_of: Callable[[RawRecord], TopicPartition] = attrgetter("topic", "partition")

#: The most one ``release`` call adds to a group's waited time, whatever the gap since
#: the previous call (a few fetch rounds' worth).
MAX_WAIT_STEP_MS = 1_000.0


class TimestampAligner:
    """Buffers records of aligned topics and releases them in timestamp order per partition."""

    #: cap on the waited time one ``release`` call adds (see the module docstring)
    max_step_ms: float = MAX_WAIT_STEP_MS

    def __init__(
        self,
        groups: Iterable[Iterable[str]],
        max_idle_ms: int = 5_000,
        idle_ms: int = 0,
        first: Iterable[str] = (),
    ) -> None:
        if max_idle_ms < 0 or idle_ms < 0:
            raise ConfigurationError(
                f"alignment waits must be >= 0 ms, got max_idle_ms={max_idle_ms}, idle_ms={idle_ms}"
            )
        early = frozenset(first)
        #: each group's topics in release order for equal timestamps
        self._groups: list[tuple[str, ...]] = [
            tuple(sorted(set(g), key=lambda t: (t not in early, t))) for g in groups
        ]
        self._group_of: dict[str, int] = {}
        for index, group in enumerate(self._groups):
            for topic in group:
                if topic in self._group_of:
                    raise ConfigurationError(
                        f"topic {topic!r} is in two aligned groups: merge them into one"
                    )
                self._group_of[topic] = index
        #: (timestamp, rank, offset) orders any two buffered records of a group
        self._rank = {t: rank for group in self._groups for rank, t in enumerate(group)}
        self._buffers: dict[TopicPartition, deque[RawRecord]] = {}
        #: per blocked group: wall-clock start of its wait (for ``caught_up``) ...
        self._blocked_since: dict[tuple[int, int], float] = {}
        #: ... and how long it has waited, counted in steps of at most ``max_step_ms``
        self._waited: dict[tuple[int, int], float] = {}
        self._last_release_ms: float | None = None
        self.max_idle_ms = max_idle_ms
        self.idle_ms = idle_ms
        #: (topic, partition) whose data was not waited for any longer (max idle reached);
        #: the runtime logs and clears it
        self.forced: list[TopicPartition] = []

    def aligned(self, topic: str) -> bool:
        return topic in self._group_of

    def add(self, records: Iterable[RawRecord]) -> None:
        # (one fetched partition's records at a time: one run, one buffer lookup)
        for tp, run in groupby(records, topic_partition_of):
            self.add_partition(tp, run)

    def add_partition(self, tp: TopicPartition, records: Iterable[RawRecord]) -> None:
        """:meth:`add` of records all of ``tp`` (a fetched partition's): no per-record key."""
        buffer = self._buffers.get(tp)
        if buffer is None:
            buffer = self._buffers[tp] = deque()
        buffer.extend(records)

    def buffered(self, tp: TopicPartition) -> int:
        buffer = self._buffers.get(tp)
        return 0 if buffer is None else len(buffer)

    def waiting_on(self) -> list[TopicPartition]:
        """Empty topic partitions that hold back a group with buffered records."""
        out = []
        for group_index, partition in self._pending_groups():
            for topic in self._groups[group_index]:
                if not self._buffers.get((topic, partition)):
                    out.append((topic, partition))
        return out

    def _pending_groups(self) -> list[tuple[int, int]]:
        keys = {
            (self._group_of[topic], partition)
            for (topic, partition), buffer in self._buffers.items()
            if buffer
        }
        return sorted(keys)

    def release(
        self, caught_up: Callable[[str, int, float], bool], now_ms: float
    ) -> list[RawRecord]:
        """Records that may be processed now, in per-partition timestamp order (the runs
        of :meth:`release_runs`, one after the other)."""
        out: list[RawRecord] = []
        for _partition, _topics, run in self.release_runs(caught_up, now_ms):
            out.extend(run)
        return out

    def release_runs(
        self, caught_up: Callable[[str, int, float], bool], now_ms: float
    ) -> list[tuple[int, tuple[str, ...], list[RawRecord]]]:
        """Records that may be processed now, as ``(partition, the group's topics, records
        of that partition of those topics in timestamp order)``: one run per group and
        partition with records to release.

        ``caught_up(topic, partition, since_ms)``: True when the partition has nothing left
        to fetch according to information newer than ``since_ms`` (when the wait began).
        Call it once per fetch round: a group's waited time grows by the time since the
        previous call, at most ``max_step_ms`` per call.
        """
        self._advance_waits(now_ms)
        runs: list[tuple[int, tuple[str, ...], list[RawRecord]]] = []
        for group_index, partition in self._pending_groups():
            topics = self._groups[group_index]
            out: list[RawRecord] = []
            runs.append((partition, topics, out))
            buffers = [self._buffers.setdefault((t, partition), deque()) for t in topics]
            key = (group_index, partition)
            while True:
                heads = [b for b in buffers if b]
                if not heads:
                    break
                passed_over = False  # the empty ones are caught up and not waited for
                if len(heads) < len(buffers):
                    missing = [t for t, b in zip(topics, buffers, strict=True) if not b]
                    since = self._blocked_since.setdefault(key, now_ms)
                    waited = self._waited.setdefault(key, 0.0)
                    if not all(caught_up(t, partition, since) for t in missing):
                        if waited < self.max_idle_ms:
                            break  # wait for the other side's data
                        self.forced.append((missing[0], partition))
                    elif waited < self.idle_ms:
                        break  # caught up, but its producer may be a little behind
                    else:
                        # each further record would start a fresh wait (since now) and ask again
                        passed_over = self.idle_ms == 0 and all(
                            caught_up(t, partition, now_ms) for t in missing
                        )
                self._blocked_since.pop(key, None)
                self._waited.pop(key, None)
                if len(heads) == 2 == len(buffers):
                    _merge_two(heads[0], heads[1], out)  # until one runs dry
                    continue
                if passed_over and len(heads) == 1:
                    # the others are empty and caught up (nothing changes while this runs):
                    # all of it goes, in order, as one record at a time would
                    out.extend(heads[0])
                    heads[0].clear()
                    break
                rank = self._rank
                first = min(heads, key=lambda b: (b[0].timestamp, rank[b[0].topic], b[0].offset))
                out.append(first.popleft())
        return [run for run in runs if run[2]]

    def holding(self) -> int:
        """Records buffered across every partition (waiting to be released)."""
        return sum(len(b) for b in self._buffers.values())

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget buffered records of revoked partitions (their owner refetches them)."""
        for tp in tps:
            self._buffers.pop(tp, None)
        self._blocked_since.clear()
        self._waited.clear()

    def _advance_waits(self, now_ms: float) -> None:
        """Add the time since the previous call, capped, to every group already waiting.

        A long gap (the event loop stalled, or the wall clock jumped) adds at most
        ``max_step_ms``; a clock going backwards adds nothing.
        """
        last, self._last_release_ms = self._last_release_ms, now_ms
        if last is None or not self._waited:
            return
        step = min(max(now_ms - last, 0.0), self.max_step_ms)
        if step:
            for key in self._waited:
                self._waited[key] += step


def _merge_two(a: deque[RawRecord], b: deque[RawRecord], out: list[RawRecord]) -> None:
    """Release from two buffers (``a`` the first topic of its group on equal timestamps)
    in timestamp order while both hold records: what one release step at a time would
    do, without its per-record checks (a two-input join's common case)."""
    pop_a, pop_b, emit = a.popleft, b.popleft, out.append
    while a and b:
        if a[0].timestamp <= b[0].timestamp:
            emit(pop_a())
        else:
            emit(pop_b())
