"""The fetcher and the group member over a fake aiokafka consumer: alignment asks aiokafka
only about assigned partitions, revocations leave kept partitions' positions alone, and
assignments start partitions where their tasks were handed out to, or where the group
committed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka import TopicPartition

import streamjoin
from streamjoin.events import RawRecord
from streamjoin.runtime.member import GroupMember
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.table_state.flush import TableFlusher
from streamjoin.runtime.tasks.alignment import TimestampAligner
from streamjoin.runtime.tasks.processing import TaskProcessing
from streamjoin.runtime.tasks.task import Task, TaskManager
from streamjoin.runtime.transport.consumer import FETCH_MAX_WAIT_MS, Fetcher, fetch_options
from streamjoin.stream import Stream

TP = tuple[str, int]
#: the partitions of the one task: imp[0] and clk[0], read together
OWNED = frozenset({("imp", 0), ("clk", 0)})


class _Runtime:
    topics = frozenset({"imp", "clk"})

    def __init__(self) -> None:
        self.dispatched: list[RawRecord] = []

    async def dispatch_many(self, raws: list[RawRecord], task: Task) -> None:
        self.dispatched.extend(raws)


class _Sender:
    async def flush(self) -> None:
        pass


class _Offsets:
    """The group's committed offsets."""

    def __init__(self, committed: dict[TP, int] | None = None) -> None:
        self.stored = dict(committed or {})
        self.asked: list[list[TP]] = []

    async def committed(self, tps: Iterable[TP]) -> dict[TP, int]:
        wanted = sorted(tps)
        self.asked.append(wanted)
        return {tp: self.stored[tp] for tp in wanted if tp in self.stored}

    async def commit(self, offsets: object) -> bool:
        return True


def _tasks() -> TaskManager:
    """imp[0] + clk[0], read together by one agent (no task yet)."""
    app = streamjoin.App("align-consumer")
    imp, clk = app.topic("imp", partitions=1), app.topic("clk", partitions=1)

    @app.agent([imp, clk])
    async def both(stream: Stream) -> None:
        async for _ in stream:
            pass

    return TaskManager(app.topology())


class _Consumer:
    """aiokafka's consumer as far as the fetcher uses it, asserting like 0.14 does."""

    def __init__(self, assigned: set[TopicPartition], end: int = 10) -> None:
        self.assigned = set(assigned)
        self.end = end
        self.asked: list[str] = []
        self.calls: list[tuple[str, object]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def _check(self, tp: TopicPartition, what: str) -> None:
        self.asked.append(what)
        assert tp in self.assigned, "Partition is not assigned"

    def highwater(self, tp: TopicPartition) -> int:
        self._check(tp, "highwater")
        return self.end

    def last_poll_timestamp(self, tp: TopicPartition) -> int:
        self._check(tp, "last_poll_timestamp")
        return 1_000

    async def position(self, tp: TopicPartition) -> int:
        self._check(tp, "position")
        return self.end

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        for tp in tps:
            self._check(tp, "end_offsets")
        return {tp: self.end for tp in tps}

    def assign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("assign", sorted(tps)))
        self.assigned = set(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(("seek", (tp, offset)))

    def pause(self, *tps: TopicPartition) -> None:
        self.calls.append(("pause", sorted(tps)))

    def resume(self, *tps: TopicPartition) -> None:
        self.calls.append(("resume", sorted(tps)))


def _fail(exc: BaseException) -> None:
    raise AssertionError(f"unexpected fatal error: {exc!r}")


def _member(
    runtime: _Runtime, consumer: _Consumer, offsets: _Offsets | None = None
) -> tuple[GroupMember, TaskManager]:
    fetcher = Fetcher({})
    fetcher._consumer = consumer  # type: ignore[assignment]
    tasks = _tasks()
    processing = TaskProcessing(
        tasks,
        runtime,  # type: ignore[arg-type]
        TimestampAligner([("imp", "clk")], max_idle_ms=5_000),
        flusher=TableFlusher(_Sender(), {}, flush_sends=_Sender().flush),  # type: ignore[arg-type]
        offsets=offsets or _Offsets(),
    )
    member = GroupMember(
        fetcher,
        processing,
        tasks,
        offsets or _Offsets(),
        commit_interval=1.0,
        counters=WorkerCounters(),
        on_fatal=_fail,
        on_assignment=tasks.assign,
        on_revoke=lambda revoked: None,
    )
    return member, tasks


async def _release(assigned: set[TopicPartition]) -> tuple[_Runtime, _Consumer]:
    runtime = _Runtime()
    consumer = _Consumer(assigned)
    member, tasks = _member(runtime, consumer)
    tasks.assign([("imp", 0), ("clk", 0)])
    aligner = member.processing.aligner
    aligner.add([RawRecord("clk", 0, 0, 5, b"k", b"v")])
    assert aligner.waiting_on() == [("imp", 0)]
    await member._release_aligned()
    return runtime, consumer


async def test_a_partition_that_is_not_assigned_is_not_waited_for() -> None:
    # aiokafka's highwater() would fail an assert here; it must not even be asked
    runtime, consumer = await _release(assigned=set())
    assert consumer.asked == []
    assert [(r.topic, r.timestamp) for r in runtime.dispatched] == [("clk", 5)]


async def test_an_assigned_partition_is_checked_with_the_broker() -> None:
    runtime, consumer = await _release(assigned={TopicPartition("imp", 0)})
    assert consumer.asked[:2] == ["highwater", "last_poll_timestamp"]
    assert "end_offsets" in consumer.asked  # caught up per the high watermark: confirmed fresh
    assert [(r.topic, r.timestamp) for r in runtime.dispatched] == [("clk", 5)]


async def test_a_revocation_leaves_the_kept_partitions_fetch_positions_alone() -> None:
    # Re-assigning the fetcher on revocation reset kept partitions that had handed nothing
    # out yet to auto_offset_reset (earliest): a replay onto their state, double counts.
    both = {TopicPartition("imp", 0), TopicPartition("clk", 0)}
    consumer = _Consumer(set())
    member, _ = _member(_Runtime(), consumer, _Offsets({("imp", 0): 1, ("clk", 0): 2}))
    await member.on_partitions_assigned(
        frozenset({("imp", 0), ("clk", 0)}), frozenset({("imp", 0), ("clk", 0)})
    )
    assert consumer.assigned == both
    consumer.calls.clear()
    member._drop(frozenset({("clk", 0)}), [])
    assert consumer.calls == [("pause", [TopicPartition("clk", 0)])]
    assert member.assigned == {("imp", 0)}


async def test_partitions_revoked_and_assigned_again_are_fetched_again() -> None:
    # An eager rebalance revokes everything and may give the same partitions back: the
    # fetcher's assignment then looks unchanged, but the revoked partitions are paused.
    both = {TopicPartition("imp", 0), TopicPartition("clk", 0)}
    consumer = _Consumer(both)
    offsets = _Offsets({("imp", 0): 3, ("clk", 0): 4})
    member, _ = _member(_Runtime(), consumer, offsets)
    member._owned = frozenset({("imp", 0), ("clk", 0)})
    member._drop(frozenset({("imp", 0), ("clk", 0)}), [])
    consumer.calls.clear()
    owned = frozenset({("imp", 0), ("clk", 0)})
    await member.on_partitions_assigned(owned, owned)
    assert consumer.calls[0] == ("assign", sorted(both))
    assert ("seek", (TopicPartition("imp", 0), 3)) in consumer.calls


async def test_an_assignment_starts_new_partitions_at_the_committed_offset() -> None:
    consumer = _Consumer(set())
    offsets = _Offsets({("clk", 0): 7, ("imp", 0): 3})
    member, tasks = _member(_Runtime(), consumer, offsets)
    owned = frozenset({("imp", 0), ("clk", 0)})
    await member.on_partitions_assigned(owned, owned)
    assert ("seek", (TopicPartition("imp", 0), 3)) in consumer.calls
    assert ("seek", (TopicPartition("clk", 0), 7)) in consumer.calls
    (task,) = tasks.live()
    assert task.committed_at_assignment == {("imp", 0): 3, ("clk", 0): 7}
    calls = len(consumer.calls)
    await member.on_partitions_assigned(frozenset(), owned)  # unchanged: left alone
    assert len(consumer.calls) == calls


async def _assigned_with_imp_handed_out_to_42() -> tuple[_Consumer, _Offsets, GroupMember, Task]:
    """A member owning imp[0] and clk[0] (committed at 3 and 7), its task having handed
    imp[0] out up to 42."""
    consumer = _Consumer(set())
    offsets = _Offsets({("clk", 0): 7, ("imp", 0): 3})
    member, tasks = _member(_Runtime(), consumer, offsets)
    await member.on_partitions_assigned(OWNED, OWNED)
    (task,) = tasks.live()
    task.handed_out_to[("imp", 0)] = 42
    return consumer, offsets, member, task


async def test_a_kept_partition_resumes_where_its_task_was_handed_out_to() -> None:
    consumer, offsets, member, _ = await _assigned_with_imp_handed_out_to_42()
    member.fetcher._dropped.add(TopicPartition("x", 0))  # forces the fetcher to be re-pointed
    offsets.asked.clear()
    consumer.calls.clear()
    await member.on_partitions_assigned(frozenset(), OWNED)
    assert offsets.asked == [[("clk", 0)]]  # the kept, handed-out partition is not asked for
    assert ("seek", (TopicPartition("imp", 0), 42)) in consumer.calls
    assert ("seek", (TopicPartition("clk", 0), 7)) in consumer.calls


def test_fetches_are_held_at_most_100_ms_by_default_and_the_app_can_say_otherwise() -> None:
    # aiokafka's 500 ms made a join stall after each alignment pause: the paused inputs,
    # once resumed, waited for a fetch the broker held for the idle ones
    def options(consumer_options: dict[str, Any]) -> dict[str, Any]:
        return fetch_options(
            "127.0.0.1:9",
            client_id="c",
            client_options={},
            consumer_options=consumer_options,
            read_committed=False,
        )

    assert options({})["fetch_max_wait_ms"] == FETCH_MAX_WAIT_MS == 100
    assert options({"fetch_max_wait_ms": 500})["fetch_max_wait_ms"] == 500
    # group options are the membership's, not aiokafka's
    assert "session_timeout_ms" not in options({"session_timeout_ms": 10_000})


async def test_a_kept_partition_resumes_where_it_was_handed_out_to_after_the_lookup() -> None:
    # The fetch loop goes on handing records out while the committed offsets are asked
    # for: a start read before that lookup sought a kept partition back, and its records
    # were handed out twice ("offset 314 registered after 315").
    consumer, offsets, member, task = await _assigned_with_imp_handed_out_to_42()
    asked = offsets.committed

    async def fetch_goes_on(tps: Iterable[TP]) -> dict[TP, int]:
        task.handed_out_to[("imp", 0)] = 50  # delivered meanwhile
        return await asked(tps)

    offsets.committed = fetch_goes_on  # type: ignore[method-assign]
    member.fetcher._dropped.add(TopicPartition("x", 0))  # forces the fetcher to be re-pointed
    consumer.calls.clear()
    await member.on_partitions_assigned(frozenset(), OWNED)
    assert ("seek", (TopicPartition("imp", 0), 50)) in consumer.calls
