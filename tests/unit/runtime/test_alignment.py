"""Timestamp-ordered release of co-partitioned topics."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.errors import ConfigurationError
from streamjoin.events import RawRecord
from streamjoin.runtime.tasks.alignment import TimestampAligner


def rec(topic: str, offset: int, ts: int, partition: int = 0) -> RawRecord:
    return RawRecord(topic, partition, offset, ts, b"k", b"v")


def never(topic: str, partition: int, since: float) -> bool:
    return False


def always(topic: str, partition: int, since: float) -> bool:
    return True


def test_releases_in_timestamp_order_across_topics() -> None:
    aligner = TimestampAligner([("imp", "clk")])
    aligner.add([rec("imp", 0, 10), rec("imp", 1, 30)])
    aligner.add([rec("clk", 0, 20), rec("clk", 1, 40)])
    out = aligner.release(never, 0)
    # stops when one side runs dry and the other is not known to be caught up
    assert [(r.topic, r.timestamp) for r in out] == [("imp", 10), ("clk", 20), ("imp", 30)]
    assert aligner.waiting_on() == [("imp", 0)]
    assert [r.timestamp for r in aligner.release(always, 1)] == [40]


def test_waits_at_most_max_idle() -> None:
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=100)
    aligner.add([rec("clk", 0, 5)])
    assert aligner.release(never, 0) == []
    assert aligner.release(never, 50) == []
    assert [r.timestamp for r in aligner.release(never, 100)] == [5]


def test_idle_ms_waits_for_a_caught_up_side_then_releases() -> None:
    aligner = TimestampAligner([("imp", "clk")], idle_ms=100)
    aligner.add([rec("clk", 0, 5)])
    assert aligner.release(always, 0) == []  # caught up, but a late write may still come
    assert aligner.release(always, 99) == []
    aligner.add([rec("imp", 0, 3)])  # it did: released first, in timestamp order
    assert [(r.topic, r.timestamp) for r in aligner.release(always, 99)] == [("imp", 3)]
    # imp ran dry again: a new wait starts before clk@5 goes
    assert aligner.release(always, 150) == []
    assert [r.timestamp for r in aligner.release(always, 199)] == [5]
    # the default does not wait for a caught-up side
    plain = TimestampAligner([("imp", "clk")])
    plain.add([rec("clk", 0, 5)])
    assert [r.timestamp for r in plain.release(always, 0)] == [5]


def test_negative_waits_are_refused() -> None:
    with pytest.raises(ValueError, match="idle_ms=-1"):
        TimestampAligner([("imp", "clk")], idle_ms=-1)


def test_partitions_are_independent_and_unaligned_topics_are_not_held() -> None:
    aligner = TimestampAligner([("imp", "clk")])
    assert not aligner.aligned("other")
    aligner.add([rec("imp", 0, 10, partition=0), rec("clk", 0, 5, partition=1)])
    aligner.add([rec("clk", 1, 1, partition=0), rec("imp", 1, 7, partition=1)])
    out = aligner.release(never, 0)
    # each partition releases its oldest record, then waits for the side that ran dry
    assert [(r.partition, r.topic, r.timestamp) for r in out] == [(0, "clk", 1), (1, "clk", 5)]
    aligner.drop([("imp", 0)])
    assert aligner.buffered(("imp", 0)) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 1000), max_size=30),
    st.lists(st.integers(0, 1000), max_size=30),
    st.randoms(),
)
def test_each_topic_keeps_its_order_and_the_merge_is_sorted_when_caught_up(
    left: list[int], right: list[int], rnd: object
) -> None:
    import random

    assert isinstance(rnd, random.Random)
    left_records = [rec("l", i, ts) for i, ts in enumerate(sorted(left))]
    right_records = [rec("r", i, ts) for i, ts in enumerate(sorted(right))]
    aligner = TimestampAligner([("l", "r")])
    released = []
    li = ri = 0
    while li < len(left_records) or ri < len(right_records):  # fetch in random chunks
        if li < len(left_records) and (ri >= len(right_records) or rnd.random() < 0.5):
            n = rnd.randint(1, 5)
            aligner.add(left_records[li : li + n])
            li += n
        else:
            n = rnd.randint(1, 5)
            aligner.add(right_records[ri : ri + n])
            ri += n
        done = {"l": li >= len(left_records), "r": ri >= len(right_records)}
        released += aligner.release(lambda t, p, since, done=done: done[t], 0)
    released += aligner.release(always, 0)
    assert sorted(released, key=lambda r: (r.timestamp, r.topic, r.offset)) == released
    assert len(released) == len(left) + len(right)


def test_caught_up_must_be_newer_than_the_wait() -> None:
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=10_000)
    polled_at = {"clk": 5.0}  # the last answer for clicks predates the wait

    def fresh(topic: str, partition: int, since: float) -> bool:
        return polled_at[topic] >= since

    aligner.add([rec("imp", 0, 10)])
    assert aligner.release(fresh, 100) == []
    polled_at["clk"] = 150.0  # a fetch answered after the wait began: really caught up
    assert [r.timestamp for r in aligner.release(fresh, 200)] == [10]


def test_one_long_gap_between_releases_does_not_force() -> None:
    # The event loop stalled for 10 s between two fetch rounds: the other side was never
    # fetched meanwhile, so that gap must not count as 10 s of waiting for it.
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=1_000)
    aligner.max_step_ms = 250  # the step these numbers are worked out for
    aligner.add([rec("clk", 0, 5)])
    assert aligner.release(never, 0) == []
    assert aligner.release(never, 10_000) == []
    assert aligner.forced == []
    # a second stall adds one more bounded step, still short of max_idle_ms
    assert aligner.release(never, 60_000) == []
    assert aligner.forced == []


def test_steady_polling_past_max_idle_forces() -> None:
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=1_000)
    aligner.add([rec("clk", 0, 5)])
    now = 0
    assert aligner.release(never, now) == []
    while now < 900:  # rounds every 100 ms: wall time counts in full
        now += 100
        assert aligner.release(never, now) == []
    assert [r.timestamp for r in aligner.release(never, now + 100)] == [5]
    assert aligner.forced == [("imp", 0)]


def test_a_stall_then_steady_polling_waits_max_idle_of_polling() -> None:
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=1_000)
    aligner.max_step_ms = 250  # the step these numbers are worked out for
    aligner.add([rec("clk", 0, 5)])
    assert aligner.release(never, 0) == []
    assert aligner.release(never, 30_000) == []  # the stall counts one step
    now = 30_000
    for _ in range(7):  # 250 + 7 * 100 = 950 ms counted
        now += 100
        assert aligner.release(never, now) == []
    assert [r.timestamp for r in aligner.release(never, now + 100)] == [5]


def test_slow_rounds_count_at_most_one_step_each() -> None:
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=1_000)
    aligner.max_step_ms = 250
    aligner.add([rec("clk", 0, 5)])
    assert aligner.release(never, 0) == []
    for now in (400, 800, 1_200):  # 3 rounds of 400 ms count 750 ms
        assert aligner.release(never, now) == []
    assert [r.timestamp for r in aligner.release(never, 1_600)] == [5]


def test_a_clock_going_backwards_adds_nothing() -> None:
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=100)
    aligner.add([rec("clk", 0, 5)])
    assert aligner.release(never, 1_000) == []
    assert aligner.release(never, 0) == []
    assert aligner.release(never, 90) == []  # 90 ms counted since the jump back
    assert [r.timestamp for r in aligner.release(never, 100)] == [5]


def test_idle_ms_is_counted_in_bounded_steps_too() -> None:
    aligner = TimestampAligner([("imp", "clk")], idle_ms=500)
    aligner.max_step_ms = 250  # the step these numbers are worked out for
    aligner.add([rec("clk", 0, 5)])
    assert aligner.release(always, 0) == []
    assert aligner.release(always, 5_000) == []  # one stall: 250 ms counted
    assert aligner.release(always, 5_100) == []
    assert [r.timestamp for r in aligner.release(always, 5_250)] == [5]


def test_a_new_wait_starts_from_zero() -> None:
    # A group that blocks again after a release starts a fresh wait in that call.
    aligner = TimestampAligner([("imp", "clk")], max_idle_ms=300)
    aligner.add([rec("imp", 0, 1)])
    assert aligner.release(never, 0) == []
    assert aligner.release(never, 200) == []  # waited 200 ms for clk
    aligner.add([rec("clk", 0, 2), rec("clk", 1, 3)])
    # imp@1 goes; imp ran dry: a new wait for it starts at 200, not the old one at 0
    assert [r.timestamp for r in aligner.release(never, 200)] == [1]
    assert aligner.release(never, 400) == []
    assert [r.timestamp for r in aligner.release(never, 500)] == [2]


def test_the_default_step_covers_an_idle_fetch_round() -> None:
    # aiokafka's getmany returns about every 500 ms while a partition is idle (its fetch
    # long-poll): rounds that slow must still count wall time in full, or align_idle_ms
    # would wait twice as long as asked
    aligner = TimestampAligner([("imp", "clk")], idle_ms=2_000)
    aligner.add([rec("clk", 0, 5)])
    for now in range(0, 2_000, 600):
        assert aligner.release(always, now) == []
    assert [r.timestamp for r in aligner.release(always, 2_400)] == [5]


def _one_step_release(buffers: list[list[RawRecord]]) -> list[RawRecord]:
    """The release order by definition: the smallest (timestamp, topic, offset) head, one
    record at a time, while every side has records."""
    out = []
    while all(buffers):
        first = min((b for b in buffers), key=lambda b: (b[0].timestamp, b[0].topic, b[0].offset))
        out.append(first.pop(0))
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=20), max_size=30),
    st.lists(st.integers(min_value=0, max_value=20), max_size=30),
)
def test_two_sides_with_records_release_in_the_defined_order(
    left: list[int], right: list[int]
) -> None:
    aligner = TimestampAligner([("imp", "clk")])
    imp = [rec("imp", i, ts) for i, ts in enumerate(left)]
    clk = [rec("clk", i, ts) for i, ts in enumerate(right)]
    aligner.add(imp)
    aligner.add(clk)
    expected = _one_step_release([list(imp), list(clk)])
    assert aligner.release(never, 0) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=20), max_size=30),
    st.lists(st.integers(min_value=0, max_value=20), max_size=30),
)
def test_a_topic_named_first_goes_first_on_equal_timestamps(
    table: list[int], stream: list[int]
) -> None:
    """A table's source ("users") before the stream it enriches ("clicks", which sorts
    first by name): a stream record sees the row of its own timestamp (as of, at or before)."""
    aligner = TimestampAligner([("clicks", "users")], first=["users"])
    rows = [rec("users", i, ts) for i, ts in enumerate(table)]
    events = [rec("clicks", i, ts) for i, ts in enumerate(stream)]
    aligner.add(events)
    aligner.add(rows)
    out: list[RawRecord] = []
    a, b = list(rows), list(events)
    while a and b:  # by definition: (timestamp, users before clicks, offset)
        out.append(a.pop(0) if a[0].timestamp <= b[0].timestamp else b.pop(0))
    assert aligner.release(never, 0) == out


def test_three_topics_release_in_timestamp_order_with_the_first_topic_ahead_on_ties() -> None:
    aligner = TimestampAligner([("a", "b", "users")], first=["users"])
    aligner.add([rec("a", 0, 5), rec("a", 1, 7)])
    aligner.add([rec("b", 0, 5), rec("b", 1, 6)])
    aligner.add([rec("users", 0, 5), rec("users", 1, 9)])
    got = [(r.topic, r.timestamp) for r in aligner.release(never, 0)]
    assert got == [("users", 5), ("a", 5), ("b", 5), ("b", 6)]  # then b has nothing left


def test_a_topic_in_two_aligned_groups_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="'users' is in two aligned groups"):
        TimestampAligner([("a", "users"), ("b", "users")])


def test_a_side_known_caught_up_now_lets_the_other_go_in_one_step() -> None:
    """The empty side is caught up by information newer than now: every buffered record of
    the other side goes (what releasing them one at a time, each asking again, gives)."""
    aligner = TimestampAligner([("users", "events")])
    aligner.add([rec("events", o, 100 + o) for o in range(5)])
    asked: list[float] = []

    def up_to_date(topic: str, partition: int, since: float) -> bool:
        asked.append(since)
        return True

    assert [r.offset for r in aligner.release(up_to_date, 50)] == [0, 1, 2, 3, 4]
    assert aligner.holding() == 0


def test_a_side_caught_up_only_since_the_wait_began_lets_one_record_go() -> None:
    """Caught up by information older than now (the last poll): the first record goes, the
    next starts a fresh wait (since now) that this information does not settle."""
    aligner = TimestampAligner([("users", "events")])
    aligner.add([rec("events", o, 100 + o) for o in range(3)])
    assert aligner.release(never, 10) == []  # the wait begins at 10

    def polled_at_20(topic: str, partition: int, since: float) -> bool:
        return since <= 20

    assert [r.offset for r in aligner.release(polled_at_20, 30)] == [0]
    assert aligner.holding() == 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["imp", "clk", "other"]), st.integers(0, 2), st.integers(0, 50)),
        max_size=40,
    ),
    st.booleans(),
)
def test_runs_are_the_release_by_group_and_partition(
    fetched: list[tuple[str, int, int]], caught_up: bool
) -> None:
    """``release_runs`` releases what ``release`` does, in the same order, cut into one run
    per group and partition, each holding only that partition of that group's topics;
    ``add_partition`` buffers what ``add`` does."""
    by_tp: dict[tuple[str, int], list[RawRecord]] = {}
    for topic, partition, ts in fetched:
        records = by_tp.setdefault((topic, partition), [])
        records.append(rec(topic, len(records), ts, partition))
    for records in by_tp.values():
        records.sort(key=lambda r: r.timestamp)
    whole = TimestampAligner([("imp", "clk"), ("other",)])
    cut = TimestampAligner([("imp", "clk"), ("other",)])
    for tp, records in by_tp.items():
        whole.add(records)
        cut.add_partition(tp, records)
    ready = always if caught_up else never
    released = whole.release(ready, 0)
    runs = cut.release_runs(ready, 0)
    assert [r for _, _, run in runs for r in run] == released
    for partition, topics, run in runs:
        assert run
        assert all(r.partition == partition and r.topic in topics for r in run)
    assert len({(p, topics) for p, topics, _ in runs}) == len(runs)
