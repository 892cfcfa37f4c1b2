"""The consumer's alignment release asks aiokafka only about partitions it is assigned."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition

import streamjoin
from streamjoin.events import RawRecord
from streamjoin.runtime.group.membership import MembershipSettings
from streamjoin.runtime.tasks.task import Task, TaskManager
from streamjoin.runtime.transport.consumer import FETCH_MAX_WAIT_MS, KafkaConsumerService
from streamjoin.stream import Stream


class _Runtime:
    topics = frozenset({"imp", "clk"})

    def __init__(self) -> None:
        self.dispatched: list[RawRecord] = []

    async def dispatch_many(self, raws: list[RawRecord], task: Task) -> None:
        self.dispatched.extend(raws)


class _Sender:
    async def flush(self) -> None:
        pass


def _tasks() -> TaskManager:
    """The running task of imp[0] + clk[0], read together by one agent."""
    app = streamjoin.App("align-consumer")
    imp, clk = app.topic("imp", partitions=1), app.topic("clk", partitions=1)

    @app.agent([imp, clk])
    async def both(stream: Stream) -> None:
        async for _ in stream:
            pass

    manager = TaskManager(app.topology())
    manager.assign([("imp", 0), ("clk", 0)])
    return manager


class _Consumer:
    """aiokafka's consumer as far as ``_release_aligned`` uses it, asserting like 0.14 does."""

    def __init__(self, assigned: set[TopicPartition], end: int = 10) -> None:
        self.assigned = assigned
        self.end = end
        self.asked: list[str] = []

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


def _fail(exc: BaseException) -> None:
    raise AssertionError(f"unexpected fatal error: {exc!r}")


def _service(
    runtime: _Runtime, consumer_options: dict[str, Any] | None = None
) -> KafkaConsumerService:
    return KafkaConsumerService(
        "127.0.0.1:9",
        client_id="c",
        runtime=runtime,  # type: ignore[arg-type]
        tasks=_tasks(),
        sender=_Sender(),  # type: ignore[arg-type]
        assignor=None,  # type: ignore[arg-type]
        membership=MembershipSettings(group_id="g"),
        commit_interval=1.0,
        client_options={},
        consumer_options=consumer_options or {},
        on_fatal=_fail,
        aligned_groups=[("imp", "clk")],
    )


async def _release(assigned: set[TopicPartition]) -> tuple[_Runtime, _Consumer]:
    runtime = _Runtime()
    service = _service(runtime)
    service._aligner.add([RawRecord("clk", 0, 0, 5, b"k", b"v")])
    assert service._aligner.waiting_on() == [("imp", 0)]
    consumer = _Consumer(assigned)
    await service._release_aligned(consumer)  # type: ignore[arg-type]
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


class _Fetcher:
    """aiokafka's consumer as the rebalance callbacks use it: assign, seek, pause."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = set(assigned)
        self.calls: list[tuple[str, object]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def assign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("assign", sorted(tps)))
        self.assigned = set(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(("seek", (tp, offset)))

    def pause(self, *tps: TopicPartition) -> None:
        self.calls.append(("pause", sorted(tps)))


def test_a_revocation_leaves_the_kept_partitions_fetch_positions_alone() -> None:
    # Re-assigning the fetcher on revocation reset kept partitions that had handed nothing
    # out yet to auto_offset_reset (earliest): a replay onto their state, double counts.
    service = _service(_Runtime())
    fetcher = _Fetcher({TopicPartition("imp", 0), TopicPartition("clk", 0)})
    service._consumer = fetcher  # type: ignore[assignment]
    service._assigned = frozenset({("imp", 0), ("clk", 0)})
    service._drop(frozenset({("clk", 0)}), [])
    assert fetcher.calls == [("pause", [TopicPartition("clk", 0)])]
    assert service.assigned == {("imp", 0)}


def test_partitions_revoked_and_assigned_again_are_fetched_again() -> None:
    # An eager rebalance revokes everything and may give the same partitions back: the
    # fetcher's assignment then looks unchanged, but the revoked partitions are paused.
    service = _service(_Runtime())
    both = {TopicPartition("imp", 0), TopicPartition("clk", 0)}
    fetcher = _Fetcher(both)
    service._consumer = fetcher  # type: ignore[assignment]
    service._assigned = frozenset({("imp", 0), ("clk", 0)})
    service._drop(frozenset({("imp", 0), ("clk", 0)}), [])
    fetcher.calls.clear()
    service._fetch({("imp", 0), ("clk", 0)}, {("imp", 0): 3, ("clk", 0): 4})
    assert fetcher.calls[0] == ("assign", sorted(both))
    assert ("seek", (TopicPartition("imp", 0), 3)) in fetcher.calls


def test_an_assignment_starts_new_partitions_at_the_committed_offset() -> None:
    service = _service(_Runtime())
    fetcher = _Fetcher(set())
    service._consumer = fetcher  # type: ignore[assignment]
    service._delivered_to[TopicPartition("imp", 0)] = 42  # kept: where it was handed out to
    service._fetch({("imp", 0), ("clk", 0)}, {("clk", 0): 7, ("imp", 0): 3})
    assert ("seek", (TopicPartition("imp", 0), 42)) in fetcher.calls
    assert ("seek", (TopicPartition("clk", 0), 7)) in fetcher.calls
    calls = len(fetcher.calls)
    service._fetch({("imp", 0), ("clk", 0)}, {})  # unchanged: the fetcher is left alone
    assert len(fetcher.calls) == calls


def test_fetches_are_held_at_most_100_ms_by_default_and_the_app_can_say_otherwise() -> None:
    # aiokafka's 500 ms made a join stall after each alignment pause: the paused inputs,
    # once resumed, waited for a fetch the broker held for the idle ones
    assert _service(_Runtime())._options["fetch_max_wait_ms"] == FETCH_MAX_WAIT_MS == 100
    chosen = _service(_Runtime(), consumer_options={"fetch_max_wait_ms": 500})
    assert chosen._options["fetch_max_wait_ms"] == 500
