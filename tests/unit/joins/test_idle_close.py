"""Idle partitions (``close_idle_after=``): stream time moved on by the wall clock.

Three layers: the pure :class:`IdleClock` (when, and how far); the join core advanced to
an idle stream time, checked against the brute-force model and against a run where a
later record moved time instead; the declared join through the test driver, with a fake
clock, where the results of an idle close are sent by the buffer partition's flush.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import streamjoin
from streamjoin.errors import ConfigurationError, JoinError
from streamjoin.joins.core import JoinInput, JoinOutput, JoinSpec, StreamStreamJoin
from streamjoin.joins.idle import IdleClock
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.testing.driver import TestDriver
from tests.unit.joins.test_join_properties import (
    SETTINGS,
    Ev,
    bounded_lateness_order,
    brute_force,
    events_strategy,
    inputs,
)

SEC = 1_000

# ------------------------------------------------------------------ the idle clock


def test_an_idle_partition_moves_on_by_the_wall_clock_time_since_it_was_last_active() -> None:
    clock = IdleClock(5 * SEC, now_ms=0, processed=0, stream_time_ms=None)
    assert clock.tick(1 * SEC, processed=3, stream_time_ms=700) is None  # active: noted
    assert clock.tick(5 * SEC, processed=3, stream_time_ms=700) is None  # idle 4 s only
    assert clock.tick(6 * SEC, processed=3, stream_time_ms=700) == 700 + 5 * SEC
    assert clock.tick(9 * SEC, processed=3, stream_time_ms=5_700) == 700 + 8 * SEC


def test_a_record_makes_the_partition_active_again_from_its_new_stream_time() -> None:
    clock = IdleClock(5 * SEC, now_ms=0, processed=0, stream_time_ms=100)
    assert clock.tick(6 * SEC, processed=0, stream_time_ms=100) == 100 + 6 * SEC
    # a record (late, say: stream time does not move) arrived since that commit
    assert clock.tick(7 * SEC, processed=1, stream_time_ms=100 + 6 * SEC) is None
    assert clock.idle_since_ms == 7 * SEC
    assert clock.tick(11 * SEC, processed=1, stream_time_ms=100 + 6 * SEC) is None
    assert clock.tick(12 * SEC, processed=1, stream_time_ms=100 + 6 * SEC) == 100 + 11 * SEC


def test_a_partition_is_idle_from_when_its_clock_started() -> None:
    """A task just assigned, with the stream time its state was restored with: idle from
    then (not from when its last record was processed, on another worker perhaps)."""
    clock = IdleClock(5 * SEC, now_ms=50 * SEC, processed=0, stream_time_ms=900)
    assert clock.tick(54 * SEC, processed=0, stream_time_ms=900) is None
    assert clock.tick(55 * SEC, processed=0, stream_time_ms=900) == 900 + 5 * SEC


def test_without_a_stream_time_nothing_moves() -> None:
    clock = IdleClock(1, now_ms=0, processed=0, stream_time_ms=None)
    assert clock.tick(10 * SEC, processed=0, stream_time_ms=None) is None


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, None])
def test_idle_after_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="idle_after_ms"):
        IdleClock(bad, now_ms=0, processed=0, stream_time_ms=None)


@given(
    st.lists(st.tuples(st.integers(0, 3 * SEC), st.booleans(), st.integers(0, 2 * SEC))),
    st.integers(1, 4 * SEC),
)
def test_idle_stream_time_never_runs_ahead_of_the_wall_clock_since_the_last_record(
    steps: list[tuple[int, bool, int]], idle_after_ms: int
) -> None:
    """Whatever the commits and records, an idle close never moves stream time further
    than the wall-clock time since the last record (which came before the commit that
    saw it), and only after ``idle_after_ms`` of it; it only ever grows while idle."""
    now, processed, stream_time = 0, 0, 1_000
    clock = IdleClock(idle_after_ms, now_ms=now, processed=processed, stream_time_ms=stream_time)
    last_record_at, time_at_last_record = now, stream_time
    previous: int | None = None
    for wait, record, jump in steps:
        if record:  # a record arrives, then the commit interval goes by
            processed += 1
            stream_time += jump
            last_record_at, time_at_last_record = now, stream_time
            previous = None
        now += wait
        target = clock.tick(now, processed, stream_time)
        if target is not None:
            assert now - last_record_at >= idle_after_ms
            assert time_at_last_record < target <= time_at_last_record + now - last_record_at
            assert previous is None or target >= previous
            previous = target
            stream_time = max(stream_time, target)


# ------------------------------------------------------------------ the core, idle-closed

outer_specs = st.builds(
    JoinSpec,
    window_ms=st.integers(0, 60),
    grace_ms=st.integers(0, 60),
    how=st.sampled_from(["left", "outer"]),
)
#: a key no generated event has: the record that moves time in the comparison run
PHANTOM_KEY = b"phantom"


def unmatched(outputs: list[JoinOutput]) -> list[JoinOutput]:
    return [o for o in outputs if o.left is None or o.right is None]


@SETTINGS
@given(outer_specs, events_strategy, st.randoms(use_true_random=False), st.data())
def test_an_idle_close_emits_what_a_later_record_would_have_closed(
    spec: JoinSpec, events: list[Ev], rng: random.Random, data: st.DataObject
) -> None:
    """Advancing an idle partition to T emits exactly the unmatched results that a record
    at T (of a key with no partner) would have closed, in the same order; what follows
    (real records, more idle closes) then gives the same results as in that run, so
    nothing is emitted twice."""
    arrival = inputs(bounded_lateness_order(events, spec.grace_ms, rng))
    split = data.draw(st.integers(0, len(arrival)), label="idle after")
    seen = max((e.timestamp_ms for e in arrival[:split]), default=0)
    target = data.draw(st.integers(seen, seen + 3 * (spec.window_ms + spec.grace_ms) + 2))

    idle = StreamStreamJoin(spec, MemoryKeyValueView())
    moved = StreamStreamJoin(spec, MemoryKeyValueView())
    idle_out: list[JoinOutput] = []
    moved_out: list[JoinOutput] = []
    for event in arrival[:split]:
        idle_out.extend(idle.process(event))
        moved_out.extend(moved.process(event))
    closed_idle = idle.advance(target) if arrival[:split] else []
    phantom = JoinInput("right", PHANTOM_KEY, b"p", target, 1 << 40)
    closed_moved = (
        [o for o in moved.process(phantom) if o.key != PHANTOM_KEY] if arrival[:split] else []
    )
    assert closed_idle == closed_moved
    assert all(o.left is None or o.right is None for o in closed_idle)
    for event in arrival[split:]:
        idle_out.extend(idle.process(event))
        moved_out.extend(o for o in moved.process(event) if o.key != PHANTOM_KEY)
    idle_out.extend(idle.advance(1 << 41))
    moved_out.extend(o for o in moved.advance(1 << 41) if o.key != PHANTOM_KEY)
    assert Counter(idle_out + closed_idle) == Counter(moved_out + closed_moved)
    # every unmatched result once at most
    assert max(Counter(unmatched(idle_out + closed_idle)).values(), default=1) == 1
    assert idle.stats.late == moved.stats.late


@SETTINGS
@given(outer_specs, events_strategy, st.randoms(use_true_random=False))
def test_idle_closes_complete_the_brute_force_results_and_a_later_record_repeats_none(
    spec: JoinSpec, events: list[Ev], rng: random.Random
) -> None:
    """Records then silence: idle closes (several, at growing times) emit exactly the
    unmatched results the model has beyond what the records emitted. Records after that
    (far later, a new burst) emit their own results and none of the earlier ones again."""
    arrival = inputs(bounded_lateness_order(events, spec.grace_ms, rng))
    join = StreamStreamJoin(spec, MemoryKeyValueView())
    outputs: list[JoinOutput] = []
    for event in arrival:
        outputs.extend(join.process(event))
    last = max((e.ts for e in events), default=0)
    closes = sorted(rng.randint(last, last + 2 * (spec.window_ms + spec.grace_ms)) for _ in "abc")
    closed: list[JoinOutput] = []
    for at in [*closes, last + spec.window_ms + spec.grace_ms + 1]:
        closed.extend(join.advance(at))
    assert Counter(outputs + closed) == brute_force(spec, events)
    assert Counter(closed) == brute_force(spec, events) - Counter(outputs)
    assert join.stats.buffered == 0

    later = [Ev(e.side, e.key, e.ts + 10_000, e.value + b"'") for e in events]
    more: list[JoinOutput] = []
    offset = {"left": len(arrival), "right": len(arrival)}
    for e in sorted(later, key=lambda e: e.ts):
        more.extend(join.process(JoinInput(e.side, e.key, e.value, e.ts, offset[e.side])))
        offset[e.side] += 1
    more.extend(join.advance(1 << 41))
    assert Counter(more) == brute_force(spec, later)


@SETTINGS
@given(outer_specs, events_strategy, st.randoms(use_true_random=False), st.booleans())
def test_an_idle_close_over_a_table_partition_is_flushed_with_its_stream_time(
    spec: JoinSpec, events: list[Ev], rng: random.Random, crash_after: bool
) -> None:
    """The worker's order: the idle hook runs before the core's own flush hook, so the
    flush that takes an idle close's buffer deletes also takes the stream time it moved
    to. A core restarted over the flushed store emits none of those results again; one
    restarted over the store before that flush emits them again (at-least-once), once."""
    arrival = inputs(bounded_lateness_order(events, spec.grace_ms, rng))
    store = MemoryStorePartition()
    view = TablePartition("buffer", 0, store)
    cores: list[StreamStreamJoin] = []
    closed: list[JoinOutput] = []
    target = max((e.ts for e in events), default=0) + spec.window_ms + spec.grace_ms + 1
    view.before_take(lambda: closed.extend(cores[0].advance(target)) if arrival else None)
    cores.append(StreamStreamJoin(spec, view))
    join = cores[0]
    outputs = [out for event in arrival for out in join.process(event)]
    view.take_pending()
    view.finish_flush(1)  # the flush that made records durable took the idle close too
    assert Counter(outputs + closed) == brute_force(spec, events)
    restarted = StreamStreamJoin(spec, TablePartition("buffer", 0, store))
    assert restarted.stream_time_ms == (target if arrival else None)
    assert restarted.stats.buffered == 0
    assert restarted.advance(1 << 41) == []


# ------------------------------------------------------------------ the declared join

MIN = 60_000


class FakeClock:
    """A monotonic clock the test moves by hand (seconds, like time.monotonic)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def idle_app(
    how: str = "left",
    *,
    close_idle_after: Any = timedelta(seconds=30),
    on_error: Any = "stop",
    partitions: int = 2,
) -> tuple[streamjoin.App, FakeClock, list[tuple[Any, Any, Any]]]:
    app = streamjoin.App("idle-unit")
    orders = app.topic(
        "orders", key_serializer="str", value_serializer="str", partitions=partitions
    )
    payments = app.topic(
        "payments", key_serializer="str", value_serializer="str", partitions=partitions
    )
    out = app.topic("order-payments", key_serializer="str", partitions=partitions)
    calls: list[tuple[Any, Any, Any]] = []

    @app.join(
        orders,
        payments,
        window=timedelta(seconds=20),
        grace=timedelta(seconds=5),
        how=how,
        output=out,
        close_idle_after=close_idle_after,
        on_error=on_error,
    )
    def paid(key: Any, order: Any, payment: Any) -> Any:
        calls.append((key, order, payment))
        if order == "poison":
            raise RuntimeError("cannot join a poisoned order")
        return {"order": order, "payment": payment}

    clock = FakeClock()
    app.joins["paid"].clock = clock
    return app, clock, calls


def results(driver: TestDriver) -> list[tuple[Any, Any, int]]:
    return [(e.key, e.value, e.timestamp) for e in driver.records("order-payments")]


async def test_an_idle_partition_emits_its_unmatched_results_without_new_input() -> None:
    app, clock, _ = idle_app(close_idle_after=timedelta(seconds=10))
    async with TestDriver(app) as driver:
        await driver.commit()  # (a worker's first commit often comes before any event)
        clock.advance(3600)
        await driver.put("orders", key="o1", value="order-1", timestamp_ms=10 * MIN)
        await driver.put("orders", key="o1", value="order-1b", timestamp_ms=10 * MIN + 3 * SEC)
        await driver.drain()  # (its flush sees the partition active)
        clock.advance(9)
        await driver.flush()
        assert app.joins["paid"].buffer.name == "paid-buffer"
        assert results(driver) == []  # idle, but not for 10 s yet
        clock.advance(1)
        await driver.flush()
        assert results(driver) == []  # stream time 10:13: no window closed (10:00 + 25 s)
        clock.advance(13)
        await driver.flush()
        # idle 23 s: stream time 10:26, and the first order's window closed
        assert results(driver) == [("o1", {"order": "order-1", "payment": None}, 10 * MIN)]
        clock.advance(60)
        await driver.commit()
        assert [r[1]["order"] for r in results(driver)] == ["order-1", "order-1b"]
        stats = driver.runtime.join_stats["paid"] if driver.runtime else None
        assert stats is not None and (stats.emitted, stats.idle_emitted) == (2, 2)
        # the payment arrives after all: its order's window closed, it is late
        await driver.put("payments", key="o1", value="pay-1", timestamp_ms=10 * MIN + 5 * SEC)
        await driver.put("orders", key="o1", value="order-2", timestamp_ms=20 * MIN)
        await driver.drain()
        clock.advance(3600)
        await driver.flush()
        assert stats.late == 1
    assert [r[1] for r in results(driver)] == [
        {"order": "order-1", "payment": None},
        {"order": "order-1b", "payment": None},
        {"order": "order-2", "payment": None},
    ]


async def test_a_matched_order_is_not_emitted_unmatched_and_activity_resets_idleness() -> None:
    app, clock, _ = idle_app(partitions=1)  # (every key in one partition)
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value="order-1", timestamp_ms=10 * MIN)
        await driver.drain()
        clock.advance(20)
        await driver.put("payments", key="o1", value="pay-1", timestamp_ms=10 * MIN + 15 * SEC)
        await driver.put("orders", key="o2", value="order-2", timestamp_ms=10 * MIN + 15 * SEC)
        await driver.drain()  # active again: idle from here (not from the first order)
        clock.advance(25)
        await driver.flush()
        assert results(driver) == [("o1", {"order": "order-1", "payment": "pay-1"}, 615_000)]
        clock.advance(5)
        await driver.flush()  # idle 30 s: stream time 10:45, order-2 (10:15 + 25 s) closed
        assert results(driver)[1:] == [("o2", {"order": "order-2", "payment": None}, 615_000)]


async def test_an_idle_close_is_durable_with_the_flush_that_sent_its_results() -> None:
    """The flush that sends an idle close's results also takes the stream time it moved
    to: after a crash right after it, the new owner finds the window closed (a payment
    for the order is late) and emits nothing again."""
    app, clock, _ = idle_app(partitions=1)
    partitions = [("orders", 0), ("payments", 0)]
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value="order-1", timestamp_ms=10 * MIN)
        await driver.drain()
        clock.advance(40)
        await driver.flush()  # idle 40 s: stream time 10:40
        assert len(results(driver)) == 1
        await driver.lose(partitions)
        await driver.assign(partitions)
        await driver.put("payments", key="o1", value="pay-1", timestamp_ms=10 * MIN + 5 * SEC)
        await driver.drain()
        clock.advance(3600)
        await driver.commit()
        assert driver.runtime is not None
        assert driver.runtime.join_stats["paid"].late == 1
    assert results(driver) == [("o1", {"order": "order-1", "payment": None}, 10 * MIN)]


async def test_a_partition_idle_since_it_was_assigned_closes_too() -> None:
    """Its input stopped before a crash: the new owner gets no event, yet emits the
    unmatched result once the partition was idle for close_idle_after on its watch."""
    app, clock, _ = idle_app(partitions=1)
    partitions = [("orders", 0), ("payments", 0)]
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value="order-1", timestamp_ms=10 * MIN)
        await driver.drain()
        await driver.lose(partitions)
        clock.advance(3600)  # (idle time before the task was assigned here does not count)
        await driver.assign(partitions)
        await driver.flush()  # the first flush starts the partition's idle clock
        assert results(driver) == []
        clock.advance(29)
        await driver.flush()
        assert results(driver) == []
        clock.advance(1)
        await driver.commit()
        assert results(driver) == [("o1", {"order": "order-1", "payment": None}, 10 * MIN)]
        clock.advance(60)
        await driver.commit()
        assert driver.runtime is not None
        assert driver.runtime.join_stats["paid"].idle_emitted == 1  # the worker's counters
    assert len(results(driver)) == 1


async def test_the_first_event_takes_over_the_partition_a_flush_made() -> None:
    """A flush made the join's part of a partition restored with buffered orders; the
    first event then makes it active: it must be that same part (one core per buffer),
    idle from that event on, not from the flush."""
    app, clock, _ = idle_app(partitions=1)
    partitions = [("orders", 0), ("payments", 0)]
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value="order-1", timestamp_ms=10 * MIN)
        await driver.drain()
        await driver.lose(partitions)
        await driver.assign(partitions)
        await driver.flush()  # before any event: the flush makes the part
        clock.advance(20)
        await driver.put("orders", key="o2", value="order-2", timestamp_ms=10 * MIN + SEC)
        await driver.drain()
        clock.advance(20)
        await driver.flush()
        assert results(driver) == []  # idle 20 s since the event (40 since the flush)
        clock.advance(10)
        await driver.flush()  # stream time 10:31: both orders' windows closed, once each
        assert [r[1]["order"] for r in results(driver)] == ["order-1", "order-2"]
        clock.advance(600)
        await driver.commit()
    assert len(results(driver)) == 2


async def test_an_outer_join_emits_both_sides_unmatched() -> None:
    app, clock, _ = idle_app("outer", close_idle_after=10)
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value="order-1", timestamp_ms=MIN)
        await driver.put("payments", key="p9", value="pay-9", timestamp_ms=MIN)
        await driver.drain()
        clock.advance(26)  # 10 s idle bound passed; 26 s of event time: both windows closed
        await driver.flush()
    assert sorted(results(driver), key=str) == [
        ("o1", {"order": "order-1", "payment": None}, MIN),
        ("p9", {"order": None, "payment": "pay-9"}, MIN),
    ]


async def test_a_failing_join_function_is_skipped_on_an_idle_close_unless_on_error_stop() -> None:
    app, clock, calls = idle_app(on_error="skip")
    async with TestDriver(app) as driver:
        await driver.put("orders", key="o1", value="poison", timestamp_ms=MIN)
        await driver.put("orders", key="o1", value="order-2", timestamp_ms=MIN + 1)
        await driver.drain()
        clock.advance(40)
        await driver.flush()
        assert [r[1]["order"] for r in results(driver)] == ["order-2"]
        assert len(calls) == 2

    app, clock, _ = idle_app(on_error="stop")
    with pytest.raises(RuntimeError, match="poisoned"):
        async with TestDriver(app) as driver:
            await driver.put("orders", key="o1", value="poison", timestamp_ms=MIN)
            await driver.put("orders", key="o1", value="order-2", timestamp_ms=MIN + 1)
            await driver.drain()
            clock.advance(40)
            with pytest.raises(RuntimeError, match="poisoned"):
                await driver.flush()
            # the failed close's windows are closed in memory: no later flush may make that
            # durable without their results (the final commit on the way out fails too)
            with pytest.raises(RuntimeError, match="poisoned"):
                await driver.commit()
            assert results(driver) == []


async def test_a_join_function_returning_an_awaitable_fails_the_idle_close() -> None:
    app = streamjoin.App("idle-unit")
    a = app.topic("a", key_serializer="str", value_serializer="str", partitions=1)
    b = app.topic("b", key_serializer="str", value_serializer="str", partitions=1)

    async def later() -> str:
        return "x"

    @app.join(a, b, window=1000, how="left", output="out", close_idle_after=1)
    def sneaky(key: Any, left: Any, right: Any) -> Any:
        return later()

    clock = FakeClock()
    app.joins["sneaky"].clock = clock
    with pytest.raises(JoinError, match="returned an awaitable"):  # (the final commit too)
        async with TestDriver(app) as driver:
            await driver.put("a", key="k", value="v", timestamp_ms=0)
            await driver.drain()
            clock.advance(5)
            with pytest.raises(JoinError, match="returned an awaitable"):
                await driver.flush()


# ------------------------------------------------------------------ declaration errors


def declare(how: str = "left", **kwargs: Any) -> None:
    app = streamjoin.App("idle-unit")
    a = app.topic("a", partitions=1)
    b = app.topic("b", partitions=1)
    app.join(a, b, window=1000, how=how, **kwargs)(lambda key, left, right: left)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(minutes=1), 60_000),
        (30, 30_000),
        (0.25, 250),
    ],
)
def test_close_idle_after_takes_a_timedelta_or_seconds(value: Any, expected: int) -> None:
    app = streamjoin.App("idle-unit")
    a, b = app.topic("a", partitions=1), app.topic("b", partitions=1)
    app.join(a, b, window=1000, how="left", close_idle_after=value)(lambda k, x, y: x)
    assert app.joins["<lambda>"].close_idle_after_ms == expected


@pytest.mark.parametrize("bad", [0, -1, timedelta(0), float("nan"), "30s", True])
def test_close_idle_after_rejects_what_is_not_a_positive_duration(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="close_idle_after"):
        declare(close_idle_after=bad)


def test_close_idle_after_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(ConfigurationError, match="inner join emits nothing"):
        declare("inner", close_idle_after=30)

    app = streamjoin.App("idle-unit")
    views = app.topic("views", partitions=1)
    ads = app.topic_table(app.topic("ads", partitions=1))
    with pytest.raises(ConfigurationError, match="no windows to close"):
        app.join(views, ads, how="left", close_idle_after=30)(lambda k, v, a: v)


def test_close_idle_after_needs_a_plain_join_function() -> None:
    app = streamjoin.App("idle-unit")
    a, b = app.topic("a", partitions=1), app.topic("b", partitions=1)

    async def joined(key: Any, left: Any, right: Any) -> Any:
        return left

    with pytest.raises(ConfigurationError, match="plain function"):
        app.join(a, b, window=1000, how="left", close_idle_after=30)(joined)
