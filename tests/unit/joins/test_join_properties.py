"""Properties of the stream-stream join core over random inputs.

The ones the backfill twin relies on: any arrival order whose lateness stays
within grace gives the results of timestamp order (which are the brute-force
answer); a restart over the same state changes nothing; the same input gives
the same bytes. Hypothesis prints the falsifying example; rerun with
``--hypothesis-seed`` or paste the example into a unit test.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamjoin.joins import core as core_module
from streamjoin.joins.core import (
    How,
    JoinInput,
    JoinOutput,
    JoinSpec,
    Side,
    StreamStreamJoin,
)
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
KEYS = [b"", b"a", b"b", b"ab"]
FAR_FUTURE = 1 << 40


@dataclass(frozen=True)
class Ev:
    side: Side
    key: bytes
    ts: int
    value: bytes  # unique per event, so outputs name their events


SIDES: list[Side] = ["left", "right"]
events_strategy = st.lists(
    st.tuples(st.sampled_from(SIDES), st.sampled_from(KEYS), st.integers(0, 400)),
    max_size=40,
).map(
    lambda rows: [
        Ev(side, key, ts, f"{side[0]}{i}".encode()) for i, (side, key, ts) in enumerate(rows)
    ]
)
specs = st.builds(
    JoinSpec,
    window_ms=st.integers(0, 60),
    grace_ms=st.integers(0, 60),
    how=st.sampled_from(["inner", "left", "outer"]),
)


def inputs(arrival: Iterable[Ev]) -> list[JoinInput]:
    """Inputs with per-side seqs in arrival order, like source offsets."""
    seqs = {"left": 0, "right": 0}
    out = []
    for e in arrival:
        out.append(JoinInput(e.side, e.key, e.value, e.ts, seqs[e.side]))
        seqs[e.side] += 1
    return out


def run(
    spec: JoinSpec, arrival: Sequence[JoinInput], view: MemoryKeyValueView | None = None
) -> tuple[list[JoinOutput], StreamStreamJoin]:
    join = StreamStreamJoin(spec, view if view is not None else MemoryKeyValueView())
    outputs: list[JoinOutput] = []
    for event in arrival:
        outputs.extend(join.process(event))
    outputs.extend(join.advance(FAR_FUTURE))  # close every window
    return outputs, join


def brute_force(spec: JoinSpec, events: Sequence[Ev]) -> Counter[JoinOutput]:
    """The join's definition, evaluated over the whole input at once."""
    expected: Counter[JoinOutput] = Counter()
    matched: set[bytes] = set()
    for l_ev in (e for e in events if e.side == "left"):
        for r_ev in (e for e in events if e.side == "right"):
            if l_ev.key == r_ev.key and abs(l_ev.ts - r_ev.ts) <= spec.window_ms:
                expected[JoinOutput(l_ev.key, l_ev.value, r_ev.value, max(l_ev.ts, r_ev.ts))] += 1
                matched |= {l_ev.value, r_ev.value}
    for e in events:
        if e.value not in matched and spec.emits_unmatched(e.side):
            left, right = (e.value, None) if e.side == "left" else (None, e.value)
            expected[JoinOutput(e.key, left, right, e.ts)] += 1
    return expected


def bounded_lateness_order(events: Sequence[Ev], grace_ms: int, rng: random.Random) -> list[Ev]:
    """A random arrival order in which no event arrives more than ``grace_ms`` after
    stream time passed it: sort by timestamp plus a delay in [0, grace]. An event
    ahead of ``e`` has ``ts + delay <= e.ts + e.delay``, so ``ts <= e.ts + grace``."""
    delayed = [(e.ts + rng.randint(0, grace_ms), rng.random(), i) for i, e in enumerate(events)]
    return [events[i] for _, _, i in sorted(delayed)]


def max_lateness(arrival: Sequence[Ev]) -> int:
    worst, stream_time = 0, -1
    for e in arrival:
        worst = max(worst, stream_time - e.ts)
        stream_time = max(stream_time, e.ts)
    return worst


# ------------------------------------------------------------------ properties


@SETTINGS
@given(specs, events_strategy, st.randoms(use_true_random=False))
def test_lateness_within_grace_gives_the_timestamp_order_results(
    spec: JoinSpec, events: list[Ev], rng: random.Random
) -> None:
    in_order = sorted(events, key=lambda e: e.ts)
    shuffled = bounded_lateness_order(events, spec.grace_ms, rng)
    assert max_lateness(shuffled) <= spec.grace_ms

    ordered_out, ordered_join = run(spec, inputs(in_order))
    shuffled_out, shuffled_join = run(spec, inputs(shuffled))

    assert Counter(shuffled_out) == Counter(ordered_out) == brute_force(spec, events)
    assert ordered_join.stats.late == shuffled_join.stats.late == 0
    assert shuffled_join.stats.beyond_grace == 0
    assert shuffled_join.stats.buffered == 0


@SETTINGS
@given(specs, events_strategy, st.randoms(use_true_random=False))
def test_any_arrival_order_emits_each_pair_and_each_unmatched_event_at_most_once(
    spec: JoinSpec, events: list[Ev], rng: random.Random
) -> None:
    """With unbounded lateness results may be missing, never wrong or repeated."""
    arrival = list(events)
    rng.shuffle(arrival)
    out, join = run(spec, inputs(arrival))
    counts = Counter(out)
    assert max(counts.values(), default=1) == 1
    expected = brute_force(spec, events)
    pairs = [o for o in out if o.left is not None and o.right is not None]
    assert all(expected[o] == 1 for o in pairs)  # every pair is a true pair
    in_pairs = {v for o in pairs for v in (o.left, o.right)}
    for o in out:
        if o.left is None or o.right is None:
            (value,) = [v for v in (o.left, o.right) if v is not None]
            assert value not in in_pairs  # unmatched means never matched
            assert spec.emits_unmatched("left" if o.left is not None else "right")
    assert join.stats.processed == len(events)
    assert join.stats.buffered == 0
    assert join.stats.expired == len(events) - join.stats.late
    assert join.stats.matched == len(pairs)
    assert join.stats.unmatched_emitted == len(out) - len(pairs)


@SETTINGS
@given(specs, events_strategy, st.randoms(use_true_random=False), st.data())
def test_restarting_over_the_same_state_changes_nothing(
    spec: JoinSpec, events: list[Ev], rng: random.Random, data: st.DataObject
) -> None:
    arrival = list(events)
    rng.shuffle(arrival)
    feed = inputs(arrival)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(feed)), max_size=4), label="cuts"))

    uninterrupted, join = run(spec, feed)
    final_state = join.view

    view = MemoryKeyValueView()
    restarted: list[JoinOutput] = []
    start = 0
    for cut in [*cuts, len(feed)]:
        # a new worker: state restored from the changelog into a fresh view
        view = MemoryKeyValueView(view.snapshot())
        worker = StreamStreamJoin(spec, view)
        for event in feed[start:cut]:
            restarted.extend(worker.process(event))
        start = cut
    restarted.extend(StreamStreamJoin(spec, view).advance(FAR_FUTURE))

    assert restarted == uninterrupted
    assert isinstance(final_state, MemoryKeyValueView)
    assert view.snapshot() == final_state.snapshot()


@SETTINGS
@given(specs, events_strategy, st.randoms(use_true_random=False))
def test_the_same_input_gives_the_same_bytes(
    spec: JoinSpec, events: list[Ev], rng: random.Random
) -> None:
    arrival = list(events)
    rng.shuffle(arrival)
    feed = inputs(arrival)
    first_view, second_view = MemoryKeyValueView(), MemoryKeyValueView()
    first = [StreamStreamJoin(spec, first_view).process(e) for e in feed]
    second = [StreamStreamJoin(spec, second_view).process(e) for e in feed]
    assert first == second
    assert first_view.snapshot() == second_view.snapshot()


@settings(max_examples=50, deadline=None)
@given(events_strategy, st.sampled_from(["inner", "left", "outer"]))
def test_emission_order_within_one_call(events: list[Ev], how: How) -> None:
    """Matches of one event in (partner ts, partner seq) order; closings in (ts, side, seq)."""
    spec = JoinSpec(50, 20, how)
    feed = inputs(sorted(events, key=lambda e: e.ts))
    seq_of = {e.value: e.seq for e in feed}
    ts_of = {e.value: e.timestamp_ms for e in feed}
    join = StreamStreamJoin(spec, MemoryKeyValueView())
    for event in feed:
        out = join.process(event)
        matches = [o for o in out if o.left is not None and o.right is not None]
        partners = [o.right if event.side == "left" else o.left for o in matches]
        keys = [(ts_of[p], seq_of[p]) for p in partners if p is not None]
        assert keys == sorted(keys)
    closing = join.advance(FAR_FUTURE)
    order = [
        (
            o.timestamp_ms,
            "left" if o.left is not None else "right",
            seq_of[o.left or o.right or b""],
        )
        for o in closing
    ]
    assert order == sorted(order)


class _CountingReads(MemoryKeyValueView):
    """A view that counts the partner reads made through it."""

    reads = 0

    def scan_group(self, group: bytes, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        _CountingReads.reads += 1
        return super().scan_group(group, start, end)


@SETTINGS
@given(specs, events_strategy, st.randoms(use_true_random=False), st.data())
def test_counting_buffered_keys_changes_no_result(
    spec: JoinSpec, events: list[Ev], rng: random.Random, data: st.DataObject
) -> None:
    """A core that counts each key's buffered events skips the partner read of a key with
    nothing on the other side. With counting on, off (more keys than it keeps) or dropped
    half-way, across restarts (counts read back from the state) with replays of events
    already processed, the results and the state are those of a core that reads every time."""
    arrival = list(events)
    rng.shuffle(arrival)
    feed = inputs(arrival)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(feed)), max_size=3), label="cuts"))
    replayed = data.draw(st.integers(0, 5), label="replayed")  # processed again after a restart

    def through_restarts(tracked_keys_max: int) -> tuple[list[JoinOutput], dict[bytes, bytes]]:
        view: MemoryKeyValueView = _CountingReads()
        outputs: list[JoinOutput] = []
        start = 0
        with patch.object(core_module, "TRACKED_KEYS_MAX", tracked_keys_max):
            for cut in [*cuts, len(feed)]:
                view = _CountingReads(view.snapshot())  # state restored from the changelog
                worker = StreamStreamJoin(spec, view)
                for event in feed[max(0, start - replayed) : cut]:
                    outputs.extend(worker.process(event))
                start = cut
            outputs.extend(StreamStreamJoin(spec, view).advance(FAR_FUTURE))
        return outputs, view.snapshot()

    _CountingReads.reads = 0
    reading = through_restarts(0)
    reads_without = _CountingReads.reads
    for tracked_keys_max in (1, 2, 1_000):
        _CountingReads.reads = 0
        assert through_restarts(tracked_keys_max) == reading
        assert _CountingReads.reads <= reads_without


def test_a_key_with_nothing_on_the_other_side_is_not_read() -> None:
    view = _CountingReads()
    join = StreamStreamJoin(JoinSpec(10, 0), view)
    _CountingReads.reads = 0
    assert join.process(JoinInput("left", b"a", b"l0", 100, 0)) == []  # no right event of a
    assert join.process(JoinInput("left", b"b", b"l1", 100, 1)) == []
    assert _CountingReads.reads == 0
    assert len(join.process(JoinInput("right", b"a", b"r0", 105, 0))) == 1  # a has a left one
    assert _CountingReads.reads == 1
    # a restart counts what the state holds
    again = StreamStreamJoin(JoinSpec(10, 0), view)
    assert again.process(JoinInput("right", b"c", b"r1", 106, 1)) == []
    assert len(again.process(JoinInput("right", b"b", b"r2", 107, 2))) == 1
    assert _CountingReads.reads == 2


@SETTINGS
@given(specs, events_strategy, st.randoms(use_true_random=False), st.data())
def test_over_a_table_partition_flushes_and_crashes_change_no_result(
    spec: JoinSpec, events: list[Ev], rng: random.Random, data: st.DataObject
) -> None:
    """Over a table partition the core writes its metadata once per flush, not per event.
    With flushes, and crashes that lose what was not flushed (the events since the last
    flush are processed again by a new core over the store), the results and the flushed
    state are those of the same run over an in-memory view."""
    arrival = list(events)
    rng.shuffle(arrival)
    feed = inputs(arrival)
    steps = data.draw(
        st.lists(st.tuples(st.integers(0, len(feed)), st.booleans()), max_size=6), label="steps"
    )
    points = dict(steps)  # event index -> crash (True) or flush (False) before it

    def over_memory() -> tuple[list[JoinOutput], dict[bytes, bytes]]:
        outputs: list[JoinOutput] = []
        flushed: dict[bytes, bytes] = {}
        view = MemoryKeyValueView()
        join = StreamStreamJoin(spec, view)
        at, last_flush, crashed = 0, 0, set()
        while True:
            if at in points and at not in crashed:
                if points[at]:  # a crash: back to what was flushed, once
                    crashed.add(at)
                    view = MemoryKeyValueView(flushed)
                    join = StreamStreamJoin(spec, view)
                    at = last_flush
                    continue
                flushed, last_flush = view.snapshot(), at
            if at == len(feed):
                break
            outputs.extend(join.process(feed[at]))
            at += 1
        outputs.extend(join.advance(FAR_FUTURE))
        return outputs, view.snapshot()

    def over_a_table_partition() -> tuple[list[JoinOutput], dict[bytes, bytes]]:
        outputs: list[JoinOutput] = []
        store = MemoryStorePartition()
        view = TablePartition("buffer", 0, store)
        join = StreamStreamJoin(spec, view)
        at, last_flush, offset, crashed = 0, 0, 0, set()
        while True:
            if at in points and at not in crashed:
                if points[at]:
                    crashed.add(at)
                    view.abandon()
                    view = TablePartition("buffer", 0, store)
                    join = StreamStreamJoin(spec, view)
                    at = last_flush
                    continue
                view.take_pending()
                offset += 1
                view.finish_flush(offset)
                last_flush = at
            if at == len(feed):
                break
            outputs.extend(join.process(feed[at]))
            at += 1
        outputs.extend(join.advance(FAR_FUTURE))
        view.take_pending()
        view.finish_flush(offset + 1)
        return outputs, dict(store.items())

    assert over_a_table_partition() == over_memory()
