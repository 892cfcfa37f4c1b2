"""The at-least-once offset ledger."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.errors import InternalError
from streamjoin.events import RawRecord
from streamjoin.runtime.tasks.offset_ledger import OffsetTracker

TP = ("orders", 0)


def test_nothing_is_committable_before_acks() -> None:
    tracker = OffsetTracker()
    tracker.register(TP, 10, 1)
    tracker.register(TP, 11, 1)
    assert tracker.committable() == {}
    assert tracker.in_flight(TP) == 2


def test_in_order_acks_advance_the_position() -> None:
    tracker = OffsetTracker()
    for offset in (5, 6, 7):
        tracker.register(TP, offset, 1)
    tracker.ack(TP, 5)
    assert tracker.committable() == {TP: 6}
    tracker.ack(TP, 6)
    tracker.ack(TP, 7)
    assert tracker.committable() == {TP: 8}


def test_out_of_order_ack_waits_for_the_gap() -> None:
    tracker = OffsetTracker()
    for offset in (0, 1, 2):
        tracker.register(TP, offset, 1)
    tracker.ack(TP, 2)
    tracker.ack(TP, 1)
    assert tracker.committable() == {}
    tracker.ack(TP, 0)
    assert tracker.committable() == {TP: 3}


def test_a_record_read_by_two_agents_needs_both_acks() -> None:
    tracker = OffsetTracker()
    tracker.register(TP, 0, 2)
    tracker.ack(TP, 0)
    assert tracker.committable() == {}
    tracker.ack(TP, 0)
    assert tracker.committable() == {TP: 1}


def test_records_nobody_reads_pass_through() -> None:
    tracker = OffsetTracker()
    tracker.register(TP, 0, 0)
    assert tracker.committable() == {TP: 1}


def test_mark_committed_hides_unchanged_positions() -> None:
    tracker = OffsetTracker()
    tracker.register(TP, 0, 1)
    tracker.ack(TP, 0)
    tracker.mark_committed(tracker.committable())
    assert tracker.committable() == {}
    tracker.register(TP, 1, 1)
    tracker.ack(TP, 1)
    assert tracker.committable() == {TP: 2}


def test_errors_name_the_record() -> None:
    tracker = OffsetTracker()
    with pytest.raises(InternalError, match=r"orders\[0\]@3 acknowledged but not pending"):
        tracker.ack(TP, 3)
    tracker.register(TP, 5, 1)
    with pytest.raises(InternalError, match="registered in order"):
        tracker.register(TP, 4, 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=30), st.randoms())
def test_position_never_passes_an_unacked_record(consumers: list[int], rnd: object) -> None:
    """Whatever the ack order, the committable position is the first not fully acked offset."""
    import random

    assert isinstance(rnd, random.Random)
    tracker = OffsetTracker()
    acks = []
    for offset, n in enumerate(consumers):
        tracker.register(TP, offset, n)
        acks.extend([offset] * n)
    rnd.shuffle(acks)
    remaining = {o: n for o, n in enumerate(consumers)}
    for offset in acks:
        tracker.ack(TP, offset)
        remaining[offset] -= 1
        first_open = next((o for o in sorted(remaining) if remaining[o] > 0), len(consumers))
        assert tracker.committable().get(TP, 0) == first_open


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.lists(st.integers(1, 3), min_size=0, max_size=6), st.integers(0, 2)),
        max_size=6,
    ),
    data=st.data(),
)
def test_registering_a_batch_at_once_is_registering_each_record(
    batches: list[tuple[list[int], int]], data: st.DataObject
) -> None:
    """The fetch loop registers a fetched batch in one call: same ledger as one by one,
    whatever order the acknowledgements come in."""
    one_by_one, at_once = OffsetTracker(), OffsetTracker()
    offset = 0
    acks: list[int] = []
    for gaps, consumers in batches:
        offsets = []
        for gap in gaps:  # offsets increase with gaps (compaction, transaction markers)
            offset += gap
            offsets.append(offset)
        for o in offsets:
            one_by_one.register(TP, o, consumers)
        at_once.register_many(TP, offsets, consumers)
        acks.extend(o for o in offsets for _ in range(consumers))
        assert at_once.committable() == one_by_one.committable()
    for o in data.draw(st.permutations(acks)):
        one_by_one.ack(TP, o)
        at_once.ack(TP, o)
        assert at_once.committable() == one_by_one.committable()
        assert at_once.in_flight(TP) == one_by_one.in_flight(TP)


def test_a_batch_registered_behind_later_offsets_is_refused() -> None:
    tracker = OffsetTracker()
    tracker.register_many(TP, [5, 6], 1)
    with pytest.raises(InternalError, match="registered after 6"):
        tracker.register_many(TP, [4, 7], 1)


@settings(max_examples=200, deadline=None)
@given(
    consumers=st.lists(st.integers(min_value=1, max_value=2), min_size=1, max_size=30),
    data=st.data(),
)
def test_acknowledging_records_together_is_acknowledging_each(
    consumers: list[int], data: st.DataObject
) -> None:
    """An actor acknowledges the events it finished in one call, possibly of two
    partitions: the same ledger as acknowledging them one by one."""
    other = ("orders", 1)
    one_by_one, together = OffsetTracker(), OffsetTracker()
    acks: list[tuple[tuple[str, int], int]] = []
    for offset, n in enumerate(consumers):
        tp = TP if offset % 3 else other
        for tracker in (one_by_one, together):
            tracker.register(tp, offset, n)
        acks.extend([(tp, offset)] * n)
    acks = data.draw(st.permutations(acks))
    while acks:
        size = data.draw(st.integers(1, len(acks)))
        group, acks = acks[:size], acks[size:]
        for tp, offset in group:
            one_by_one.ack(tp, offset)
        together.ack_records([RawRecord(tp[0], tp[1], o, 0, None, None) for tp, o in group])
        assert together.committable() == one_by_one.committable()
        assert together.in_flight(TP) == one_by_one.in_flight(TP)


def test_acknowledging_a_record_not_pending_names_it() -> None:
    tracker = OffsetTracker()
    tracker.register(TP, 0, 1)
    tracker.ack_records([RawRecord("orders", 0, 0, 0, None, None)])
    with pytest.raises(InternalError, match=r"orders\[0\]@0 acknowledged but not pending"):
        tracker.ack_records([RawRecord("orders", 0, 0, 0, None, None)])
