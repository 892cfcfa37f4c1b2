"""The at-least-once offset ledger."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

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


# -- against a reference model: every record counted on its own

TOPIC_PARTITIONS = [("orders", 0), ("orders", 1), ("payments", 0)]


class _Reference:
    """The ledger's meaning, record by record: acknowledgements still due per offset; the
    position is one past the longest fully acknowledged prefix of the registered offsets."""

    def __init__(self) -> None:
        self.order: dict[tuple[str, int], list[int]] = {}
        self.due: dict[tuple[str, int], dict[int, int]] = {}
        self.passed: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}

    def register_many(self, tp: tuple[str, int], offsets: list[int], consumers: int) -> None:
        if not offsets:
            return
        order = self.order.setdefault(tp, [])
        if order and offsets[0] <= order[-1]:
            raise InternalError("registered out of order")
        order.extend(offsets)
        self.due.setdefault(tp, {}).update((o, max(consumers, 0)) for o in offsets)
        self._pass(tp)

    def ack(self, tp: tuple[str, int], offset: int) -> None:
        due = self.due.get(tp, {})
        if due.get(offset, 0) <= 0:
            raise InternalError("acknowledged but not pending")
        due[offset] -= 1
        self._pass(tp)

    def _pass(self, tp: tuple[str, int]) -> None:
        order, due = self.order[tp], self.due[tp]
        passed = self.passed.get(tp, 0)
        while passed < len(order) and due[order[passed]] == 0:
            passed += 1
        self.passed[tp] = passed

    def positions(self, tp: tuple[str, int]) -> tuple[int | None, int | None]:
        if tp not in self.order:
            return (None, None)
        passed = self.passed[tp]
        return (self.order[tp][passed - 1] + 1 if passed else None, self.committed.get(tp))

    def in_flight(self, tp: tuple[str, int]) -> int:
        return len(self.order.get(tp, ())) - self.passed.get(tp, 0)

    def committable(self) -> dict[tuple[str, int], int]:
        out = {}
        for tp in self.order:
            processed, committed = self.positions(tp)
            if processed is not None and processed != committed:
                out[tp] = processed
        return out

    def outstanding(self, tp: tuple[str, int]) -> list[int]:
        """Every acknowledgement still due for ``tp``, in offset order."""
        return [o for o in self.order.get(tp, ()) for _ in range(self.due[tp][o])]


class LedgerAgainstReference(RuleBasedStateMachine):
    """Runs of random sizes and consumer counts registered on three partitions; their
    acknowledgements in offset order or shuffled, partitions interleaved, alone or
    together, with now and then one not pending; commits in between."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = OffsetTracker()
        self.reference = _Reference()
        self.next_offset = dict.fromkeys(TOPIC_PARTITIONS, 0)

    @rule(
        tp=st.sampled_from(TOPIC_PARTITIONS),
        start=st.integers(-2, 3),
        gaps=st.lists(st.sampled_from([1, 1, 1, 1, 2, 5]), max_size=8),
        consumers=st.sampled_from([0, 1, 1, 1, 2, 3]),
        one_by_one=st.booleans(),
    )
    def register(
        self, tp: tuple[str, int], start: int, gaps: list[int], consumers: int, one_by_one: bool
    ) -> None:
        offset = self.next_offset[tp] + start  # start <= 0: at or before the last one
        offsets = [offset]
        for gap in gaps:
            offset += gap
            offsets.append(offset)
        if one_by_one:
            offsets = offsets[:1]
        refused = _raises(self.reference.register_many, tp, offsets, consumers)
        if one_by_one:
            assert _raises(self.tracker.register, tp, offsets[0], consumers) == refused
        else:
            assert _raises(self.tracker.register_many, tp, offsets, consumers) == refused
        if not refused:
            self.next_offset[tp] = offsets[-1] + 1

    @rule(data=st.data(), in_order=st.booleans(), stray=st.booleans(), together=st.booleans())
    def acknowledge(self, data: st.DataObject, in_order: bool, stray: bool, together: bool) -> None:
        queues = {tp: self.reference.outstanding(tp) for tp in TOPIC_PARTITIONS}
        acks: list[tuple[tuple[str, int], int]] = []
        if in_order:  # each partition's in offset order, the partitions interleaved
            while any(queues.values()) and data.draw(st.integers(0, 9)):
                tp = data.draw(st.sampled_from([tp for tp, q in queues.items() if q]))
                acks.append((tp, queues[tp].pop(0)))
        else:
            every = [(tp, o) for tp, q in queues.items() for o in q]
            acks = data.draw(st.permutations(every))[: data.draw(st.integers(0, 12))]
        if stray:  # one whose acknowledgements are all in, or never registered
            tp = data.draw(st.sampled_from(TOPIC_PARTITIONS))
            offset = data.draw(st.integers(-1, self.next_offset[tp] + 1))
            acks.insert(data.draw(st.integers(0, len(acks))), (tp, offset))
        records = [RawRecord(tp[0], tp[1], o, 0, None, None) for tp, o in acks]
        for tp, offset in acks:
            if _raises(self.reference.ack, tp, offset):
                break
            if not together:
                self.tracker.ack(tp, offset)
        else:
            if together:
                self.tracker.ack_records(records)
            return
        # the reference refused one: the tracker refuses it too, having counted the others
        if together:
            with pytest.raises(InternalError, match="acknowledged but not pending"):
                self.tracker.ack_records(records)
        else:
            with pytest.raises(InternalError, match="acknowledged but not pending"):
                self.tracker.ack(tp, offset)

    @rule()
    def commit(self) -> None:
        positions = self.tracker.committable()
        self.tracker.mark_committed(positions)
        self.reference.committed.update(positions)

    @invariant()
    def same_positions(self) -> None:
        assert self.tracker.committable() == self.reference.committable()
        for tp in [*TOPIC_PARTITIONS, ("elsewhere", 0)]:
            assert self.tracker.positions(tp) == self.reference.positions(tp)
            assert self.tracker.in_flight(tp) == self.reference.in_flight(tp)


def _raises(call: Callable[..., object], *args: object) -> bool:
    try:
        call(*args)
    except InternalError:
        return True
    return False


LedgerAgainstReference.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
test_the_ledger_matches_a_record_by_record_reference = LedgerAgainstReference.TestCase
