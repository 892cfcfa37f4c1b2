"""What a join core keeps of its buffer in memory over a table partition (its only writer
between flushes): partners read by key, windows closed from a heap of the index entries,
with the results and the state of a core that reads the view every time."""

from __future__ import annotations

import random
from collections.abc import Iterator
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamjoin.errors import CorruptJoinState
from streamjoin.joins import core as core_module
from streamjoin.joins.core import (
    BUFFER_GROUP_OF,
    BUFFER_PREFIX,
    JoinInput,
    JoinOutput,
    JoinSpec,
    StreamStreamJoin,
)
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.state.keys import encode_uint64, length_prefixed
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import GroupOf, TablePartition
from tests.unit.joins.test_join_properties import (
    FAR_FUTURE,
    SETTINGS,
    Ev,
    events_strategy,
    inputs,
    specs,
)


class _CountingPartition(TablePartition):
    """A table partition that counts the range reads made through it."""

    __slots__ = ("group_scans", "grouped", "scans")

    def __init__(self, store: MemoryStorePartition) -> None:
        super().__init__("buffer", 0, store)
        self.scans = 0
        self.group_scans = 0
        self.grouped = False

    def group_keys_by(self, group_of: GroupOf) -> None:
        assert group_of is BUFFER_GROUP_OF
        self.grouped = True
        super().group_keys_by(group_of)

    def scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        self.scans += 1
        return super().scan(start, end)

    def scan_group(self, group: bytes, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        self.group_scans += 1
        return super().scan_group(group, start, end)


def _flush(view: TablePartition, offset: int) -> None:
    view.take_pending()
    view.finish_flush(offset)


@pytest.mark.pure_python  # (subclasses TablePartition)
def test_over_a_table_partition_partners_and_closes_need_no_range_read() -> None:
    view = _CountingPartition(MemoryStorePartition())
    join = StreamStreamJoin(JoinSpec(10, 0, "left"), view)
    assert join.process(JoinInput("left", b"a", b"l0", 100, 0)) == []
    _flush(view, 1)  # the partner is in the store now
    assert join.process(JoinInput("right", b"a", b"r0", 105, 0)) == [
        JoinOutput(b"a", b"l0", b"r0", 105)
    ]
    assert join.process(JoinInput("left", b"b", b"l1", 106, 1)) == []
    # b's window closes (matched a's do not emit)
    assert join.advance(200) == [JoinOutput(b"b", b"l1", None, 106)]
    assert (view.scans, view.group_scans) == (2, 0)  # the buffer and the index, at start
    assert join.stats.buffered == 0
    assert not view.grouped  # nothing reads a range: the partition need not index groups


@pytest.mark.pure_python  # (subclasses TablePartition)
def test_a_core_that_keeps_too_much_reads_ranges_over_grouped_writes() -> None:
    view = _CountingPartition(MemoryStorePartition())
    with patch.object(core_module, "TRACKED_KEYS_MAX", 1):
        join = StreamStreamJoin(JoinSpec(10, 0), view)
        join.process(JoinInput("left", b"a", b"l0", 100, 0))
        assert not view.grouped
        join.process(JoinInput("left", b"b", b"l1", 100, 1))  # two buffered: too many
        assert view.grouped
        assert join.process(JoinInput("right", b"a", b"r0", 101, 0)) == [
            JoinOutput(b"a", b"l0", b"r0", 101)
        ]
        assert view.group_scans == 1


@pytest.mark.pure_python  # (subclasses TablePartition)
def test_a_restart_reads_the_index_into_memory_once() -> None:
    store = MemoryStorePartition()
    view = TablePartition("buffer", 0, store)
    join = StreamStreamJoin(JoinSpec(10, 0, "left"), view)
    join.process(JoinInput("left", b"a", b"l0", 100, 0))
    join.process(JoinInput("left", b"b", b"l1", 101, 1))
    _flush(view, 1)
    again_view = _CountingPartition(store)
    again = StreamStreamJoin(JoinSpec(10, 0, "left"), again_view)
    assert again_view.scans == 2  # the buffer and the index, at start
    assert not again_view.grouped
    assert again.process(JoinInput("right", b"b", b"r0", 105, 0)) == [
        JoinOutput(b"b", b"l1", b"r0", 105)
    ]
    assert again.advance(200) == [JoinOutput(b"a", b"l0", None, 100)]
    assert (again_view.scans, again_view.group_scans) == (2, 0)


def test_a_malformed_index_entry_is_refused_when_read_into_memory() -> None:
    store = MemoryStorePartition()
    view = TablePartition("buffer", 0, store)
    StreamStreamJoin(JoinSpec(10, 0), view).process(JoinInput("left", b"a", b"l0", 100, 0))
    view.put(b"\x01" + encode_uint64(100) + b"X", b"\x00")
    _flush(view, 1)
    with pytest.raises(CorruptJoinState):
        StreamStreamJoin(JoinSpec(10, 0), TablePartition("buffer", 0, store))


@pytest.mark.pure_python  # (subclasses TablePartition)
def test_a_partner_gone_behind_the_cores_back_is_read_from_the_view_after_all() -> None:
    """Only the core writes its buffer between flushes; if something else did, a partner
    read by key that is missing makes the core read ranges again, as a core that never
    kept anything would."""
    view = _CountingPartition(MemoryStorePartition())
    join = StreamStreamJoin(JoinSpec(10, 0), view)
    join.process(JoinInput("left", b"a", b"l0", 100, 0))
    join.process(JoinInput("left", b"a", b"l1", 101, 1))
    view.delete(BUFFER_PREFIX + b"L" + length_prefixed(b"a") + encode_uint64(100) + bytes(8))
    assert join.process(JoinInput("right", b"a", b"r0", 102, 0)) == [
        JoinOutput(b"a", b"l1", b"r0", 102)
    ]
    assert view.group_scans == 1
    assert view.grouped
    join.process(JoinInput("right", b"c", b"r1", 103, 1))
    assert view.group_scans == 2  # nothing kept in memory any more: every event reads


def _buffered_events(store: MemoryStorePartition) -> dict[bytes, bytes]:
    """The buffer and index entries of ``store`` (everything but the metadata)."""
    return {k: v for k, v in store.items(b"", None) if k[:1] in (b"\x01", BUFFER_PREFIX)}


def test_entries_written_behind_the_metadata_are_dropped_without_output() -> None:
    """Under at-least-once, a worker that lost a partition while frozen can still deliver
    the flush it had under way when it resumes: its changelog writes land after the new
    owner's, and the next restore holds events that owner had already closed (the
    impression below still unmatched, though the new owner saw its click). The metadata
    says nothing is buffered below its expiry hint: those entries are leftovers, and a
    core that loads them drops them without output (seen in CI: false unmatched
    impressions after a stalled worker rejoined)."""
    store = MemoryStorePartition()
    view = TablePartition("buffer", 0, store)
    owner = StreamStreamJoin(JoinSpec(10, 0, "left"), view)
    owner.process(JoinInput("left", b"a", b"imp", 100, 0))
    _flush(view, 1)
    late_flush = _buffered_events(store)  # what the frozen worker still delivers
    assert owner.process(JoinInput("right", b"a", b"clk", 105, 0)) == [
        JoinOutput(b"a", b"imp", b"clk", 105)
    ]
    assert owner.process(JoinInput("left", b"b", b"other", 300, 1)) == []  # closes a's
    _flush(view, 2)
    store.write(late_flush, 3)

    again_view = TablePartition("buffer", 0, store)
    again = StreamStreamJoin(JoinSpec(10, 0, "left"), again_view)
    assert again.stats.leftovers_dropped == 1
    assert again.advance(1000) == [JoinOutput(b"b", b"other", None, 300)]
    _flush(again_view, 4)
    assert _buffered_events(store) == {}


def test_an_event_the_metadata_missed_is_buffered_once_when_replayed() -> None:
    """A flush cut short can leave an event's entries in the changelog without the
    metadata that counts it; its replay finds it buffered (no second copy in memory: its
    partner is joined once and its window closes once)."""
    store = MemoryStorePartition()
    view = TablePartition("buffer", 0, store)
    first = StreamStreamJoin(JoinSpec(10, 0, "left"), view)
    first.process(JoinInput("left", b"a", b"l0", 100, 0))
    _flush(view, 1)
    first.process(JoinInput("left", b"a", b"l1", 102, 1))
    partial = {k: v for k, v in view.take_pending().items() if k != core_module.META_KEY}
    store.write(partial, 2)  # the entries reached the changelog, the metadata did not

    again_view = TablePartition("buffer", 0, store)
    again = StreamStreamJoin(JoinSpec(10, 0, "left"), again_view)
    assert again.process(JoinInput("left", b"a", b"l1", 102, 1)) == []  # the replay
    assert again.process(JoinInput("right", b"a", b"r0", 104, 0)) == [
        JoinOutput(b"a", b"l0", b"r0", 104),
        JoinOutput(b"a", b"l1", b"r0", 104),
    ]
    assert again.advance(1000) == []
    assert again.stats.expired == 3


def _run(
    spec: JoinSpec, feed: list[JoinInput], cuts: list[int], replayed: int, view_of: type
) -> tuple[list[JoinOutput], dict[bytes, bytes]]:
    """The results and the final state of ``feed`` with a restart (over the state flushed
    so far) at each cut, the last ``replayed`` events before it processed again."""
    store = MemoryStorePartition()
    memory: dict[bytes, bytes] = {}
    outputs: list[JoinOutput] = []
    start = 0
    offset = 0
    for cut in [*cuts, len(feed)]:
        if view_of is TablePartition:
            view: TablePartition | MemoryKeyValueView = TablePartition("buffer", 0, store)
        else:
            view = MemoryKeyValueView(memory)
        join = StreamStreamJoin(spec, view)
        for event in feed[max(0, start - replayed) : cut]:
            outputs.extend(join.process(event))
        start = cut
        if isinstance(view, TablePartition):
            offset += 1
            _flush(view, offset)
        else:
            memory = view.snapshot()
    final = TablePartition("buffer", 0, store) if view_of is TablePartition else view
    join = StreamStreamJoin(spec, final)
    outputs.extend(join.advance(FAR_FUTURE))
    if isinstance(final, TablePartition):
        _flush(final, offset + 1)
        return outputs, dict(store.items())
    return outputs, final.snapshot()


@SETTINGS
@given(specs, events_strategy, st.randoms(use_true_random=False), st.data())
def test_keeping_the_buffer_in_memory_changes_no_result(
    spec: JoinSpec, events: list[Ev], rng: random.Random, data: st.DataObject
) -> None:
    """Over a table partition, with the buffer kept in memory, not kept (more events than
    the core keeps) or dropped half-way, across restarts (read back from the store) with
    replays: the results and the state of a core over a memory view that reads every time."""
    arrival = list(events)
    rng.shuffle(arrival)
    feed = inputs(arrival)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(feed)), max_size=3), label="cuts"))
    replayed = data.draw(st.integers(0, 5), label="replayed")
    with patch.object(core_module, "TRACKED_KEYS_MAX", 0):
        reading = _run(spec, feed, cuts, replayed, MemoryKeyValueView)
    for tracked in (1, 3, 1_000):
        with patch.object(core_module, "TRACKED_KEYS_MAX", tracked):
            assert _run(spec, feed, cuts, replayed, TablePartition) == reading
