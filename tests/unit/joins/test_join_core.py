"""The stream-stream join core, one behaviour at a time (see docs/joins.md for the semantics)."""

from __future__ import annotations

from typing import Any

import pytest

from streamjoin.errors import ConfigurationError, CorruptJoinState, JoinError
from streamjoin.joins.core import (
    BUFFER_PREFIX,
    EXPIRY_PREFIX,
    META_KEY,
    How,
    JoinInput,
    JoinOutput,
    JoinSpec,
    Side,
    StreamStreamJoin,
)
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.state.keys import MAX_UINT64, encode_uint64, length_prefixed, window_key

W = 100  # window
G = 10  # grace


class Harness:
    """A join over a memory view, with auto-numbered seqs per side."""

    def __init__(self, how: How = "inner", window: int = W, grace: int = G) -> None:
        self.view = MemoryKeyValueView()
        self.join = StreamStreamJoin(JoinSpec(window, grace, how), self.view)
        self.seq = {"left": 0, "right": 0}

    def send(self, side: Side, ts: int, value: str, key: bytes = b"k") -> list[JoinOutput]:
        self.seq[side] += 1
        return self.join.process(JoinInput(side, key, value.encode(), ts, self.seq[side]))

    def left(self, ts: int, value: str, key: bytes = b"k") -> list[JoinOutput]:
        return self.send("left", ts, value, key)

    def right(self, ts: int, value: str, key: bytes = b"k") -> list[JoinOutput]:
        return self.send("right", ts, value, key)


def pair(left: str, right: str, ts: int, key: bytes = b"k") -> JoinOutput:
    return JoinOutput(key, left.encode(), right.encode(), ts)


def only_left(left: str, ts: int, key: bytes = b"k") -> JoinOutput:
    return JoinOutput(key, left.encode(), None, ts)


def only_right(right: str, ts: int, key: bytes = b"k") -> JoinOutput:
    return JoinOutput(key, None, right.encode(), ts)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "args",
    [(-1, 0, "inner"), (0, -1, "inner"), (1, 0, "right"), (True, 0, "inner"), (1.5, 0, "inner")],
)
def test_invalid_specs_are_rejected(args: tuple[Any, Any, Any]) -> None:
    with pytest.raises(ConfigurationError, match="must be"):
        JoinSpec(*args)


def test_zero_window_and_grace_are_valid() -> None:
    assert JoinSpec(0, 0, "outer").window_ms == 0


@pytest.mark.parametrize(
    "args",
    [
        ("middle", b"k", b"v", 0, 0),
        ("left", "k", b"v", 0, 0),
        ("left", b"k", None, 0, 0),
        ("left", b"k", b"v", -1, 0),
        ("left", b"k", b"v", 1 << 63, 0),
        ("left", b"k", b"v", 0, -1),
        ("left", b"k", b"v", 0, True),
    ],
)
def test_invalid_inputs_are_rejected(args: tuple[Any, ...]) -> None:
    with pytest.raises(JoinError, match=r"must be|are bytes"):
        JoinInput(*args)


def test_advance_rejects_negative_time() -> None:
    with pytest.raises(JoinError, match="stream_time_ms must be"):
        Harness().join.advance(-1)


# ------------------------------------------------------------------ matching


def test_inner_join_matches_both_directions() -> None:
    h = Harness()
    assert h.left(1000, "l1") == []
    assert h.right(1050, "r1") == [pair("l1", "r1", 1050)]
    assert h.left(1060, "l2") == [pair("l2", "r1", 1060)]
    assert h.join.stats.matched == 2


@pytest.mark.parametrize("dt", [W, -W])
def test_window_edge_is_inclusive(dt: int) -> None:
    h = Harness()
    h.left(1000, "l")
    assert h.right(1000 + dt, "r") == [pair("l", "r", max(1000, 1000 + dt))]


@pytest.mark.parametrize("dt", [W + 1, -(W + 1)])
def test_one_past_the_window_does_not_match(dt: int) -> None:
    h = Harness(grace=W)  # generous grace: the miss is the window's, not lateness
    h.left(1000, "l")
    assert h.right(1000 + dt, "r") == []


def test_zero_window_matches_equal_timestamps_only() -> None:
    h = Harness(window=0, grace=5)
    h.left(5, "l")
    assert h.right(6, "r6") == []
    assert h.right(5, "r5") == [pair("l", "r5", 5)]


def test_only_equal_keys_join() -> None:
    h = Harness()
    h.left(1000, "a", key=b"a")
    h.left(1000, "ab", key=b"ab")
    assert h.right(1000, "r", key=b"a") == [pair("a", "r", 1000, key=b"a")]


def test_keys_that_prefix_each_other_stay_apart() -> None:
    h = Harness()
    h.left(1000, "x", key=b"\x00")
    assert h.right(1000, "y", key=b"\x00\x00") == []
    assert h.right(1000, "z", key=b"") == []


def test_matches_come_in_partner_timestamp_then_seq_order() -> None:
    h = Harness()
    h.right(1030, "r1")  # seq 1
    h.right(1010, "r2")  # seq 2, earlier timestamp
    h.right(1030, "r3")  # seq 3, same timestamp as r1
    assert h.left(1020, "l") == [
        pair("l", "r2", 1020),
        pair("l", "r1", 1030),
        pair("l", "r3", 1030),
    ]


def test_many_to_many() -> None:
    h = Harness()
    h.left(1000, "l1")
    h.left(1001, "l2")
    assert h.right(1002, "r1") == [pair("l1", "r1", 1002), pair("l2", "r1", 1002)]
    assert h.right(1003, "r2") == [pair("l1", "r2", 1003), pair("l2", "r2", 1003)]
    assert h.join.stats.matched == 4


def test_empty_values_and_keys_are_ordinary() -> None:
    h = Harness()
    h.left(0, "", key=b"")
    assert h.right(0, "", key=b"") == [JoinOutput(b"", b"", b"", 0)]


# ------------------------------------------------------------------ out of order, grace, late


def test_out_of_order_within_grace_still_joins() -> None:
    h = Harness()
    h.left(1000, "l")
    h.right(1000 + W + G, "pushes-time")  # stream time 1110: l's window closes after 1110
    assert h.right(1000 + W, "late-but-ok") == [pair("l", "late-but-ok", 1000 + W)]
    assert h.join.stats.late == 0


def test_partner_is_gone_once_its_window_closed() -> None:
    h = Harness(how="inner")
    h.left(1000, "l")
    h.right(1000 + W + G + 1, "closes-l")  # stream time > 1000 + W + G
    # within W of l, and not late itself (1050 + W + G >= 1111), yet l's window is closed
    # (l may still be stored: an inner join removes closed events in batches)
    assert h.right(1050, "r") == []
    assert h.join.stats.beyond_grace == 1


@pytest.mark.parametrize("how", ["inner", "left"])
def test_inner_joins_remove_closed_events_in_batches(how: How) -> None:
    h = Harness(how=how)
    slack = h.join.spec.expiry_slack_ms
    assert slack == ((W + G) // 8 if how == "inner" else 0)
    h.left(1000, "l")
    h.left(1001, "m")
    # both windows closed (1001 + W + G < stream time), less than slack ago
    closing = h.right(1001 + W + G + 1, "closes-l-and-m")
    assert h.join.stats.expired == (0 if how == "inner" else 2)
    assert closing == ([] if how == "inner" else [only_left("l", 1000), only_left("m", 1001)])
    assert h.right(1000 + W + G + slack + 1, "one-more-ms") == []  # past it: one pass
    assert h.join.stats.expired == 2
    assert h.join.stats.buffered == 2  # the two right events


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_events_whose_window_closed_are_dropped_and_counted(how: How) -> None:
    h = Harness(how=how)
    h.left(1000, "l")
    h.left(2000, "time")
    # 1000 + W + G = 1110 < 2000: late for every join type, not even emitted unmatched
    assert h.left(1000, "late-left") == []
    assert h.right(1000, "late-right") == []
    assert h.join.stats.late == 2
    assert h.join.stats.processed == 4
    assert h.join.advance(10_000) == ([] if how == "inner" else [only_left("time", 2000)])


def test_lateness_boundary() -> None:
    h = Harness()
    h.left(2000, "time")
    h.left(2000 - W - G, "exactly-at-close")  # ts + W + G == stream time: accepted
    h.left(2000 - W - G - 1, "one-too-late")
    assert h.join.stats.late == 1
    assert h.join.stats.buffered == 2


def test_late_events_write_nothing() -> None:
    h = Harness()
    h.left(5000, "time")
    before = h.view.snapshot()
    h.right(100, "late")
    assert h.view.snapshot() == before


def test_stream_time_is_the_max_timestamp_of_both_sides() -> None:
    h = Harness()
    before_any_event = h.join.stream_time_ms
    assert before_any_event is None
    h.left(500, "a")
    h.right(900, "b")
    h.left(700, "c")
    assert h.join.stream_time_ms == 900
    assert h.join.advance(800) == []
    assert h.join.stream_time_ms == 900  # never goes back


# ------------------------------------------------------------------ unmatched emission


@pytest.mark.parametrize("how", ["left", "outer"])
def test_unmatched_left_is_emitted_once_at_window_close_and_not_before(how: How) -> None:
    h = Harness(how=how)
    h.left(1000, "lonely")
    assert h.join.advance(1000 + W + G) == []  # window end + grace: still open
    assert h.join.advance(1000 + W + G + 1) == [only_left("lonely", 1000)]
    assert h.join.advance(1000 + W + G + 2) == []
    assert h.join.advance(100_000) == []
    assert h.join.stats.unmatched_emitted == 1
    assert h.join.stats.buffered == 0


@pytest.mark.parametrize(
    ("how", "expected"),
    [("inner", []), ("left", []), ("outer", [only_right("lonely", 1000)])],
)
def test_unmatched_right_is_emitted_only_by_outer_joins(
    how: How, expected: list[JoinOutput]
) -> None:
    h = Harness(how=how)
    h.right(1000, "lonely")
    assert h.join.advance(2000) == expected


def test_inner_join_never_emits_unmatched() -> None:
    h = Harness(how="inner")
    h.left(1000, "l")
    h.right(5000, "r")
    assert h.join.advance(10_000) == []
    assert h.join.stats.expired == 2


@pytest.mark.parametrize("how", ["left", "outer"])
def test_matched_events_are_not_emitted_unmatched(how: How) -> None:
    h = Harness(how=how)
    h.left(1000, "l")
    h.right(1010, "r")
    assert h.join.advance(10_000) == []
    assert h.join.stats.expired == 2


def test_closing_emits_in_timestamp_side_seq_order() -> None:
    h = Harness(how="outer")
    h.right(1001, "r-b", key=b"b")
    h.left(1001, "l-a", key=b"a")
    h.right(1000, "r-c", key=b"c")
    h.left(1001, "l-c", key=b"c2")
    assert h.join.advance(10_000) == [
        only_right("r-c", 1000, key=b"c"),
        only_left("l-a", 1001, key=b"a"),
        only_left("l-c", 1001, key=b"c2"),
        only_right("r-b", 1001, key=b"b"),
    ]


def test_windows_closed_by_an_event_come_before_its_matches() -> None:
    h = Harness(how="left")
    h.left(1000, "old")
    h.left(1050, "l")
    # stream time 1120 > 1000 + W + G closes "old"; "r" matches "l" (70 apart)
    assert h.right(1120, "r") == [only_left("old", 1000), pair("l", "r", 1120)]


def test_the_left_join_example_from_the_docs() -> None:
    minute = 60_000
    h = Harness(how="left", window=10 * minute, grace=30_000)
    h.left(0, "imp-1")
    assert h.right(3 * minute, "click-1") == [pair("imp-1", "click-1", 3 * minute)]
    assert h.left(14 * minute, "imp-2") == []  # 11 minutes after click-1: no match
    assert h.left(24 * minute + 30_000, "imp-3") == []  # imp-2 closes after 24:30
    assert h.left(24 * minute + 30_001, "imp-4") == [only_left("imp-2", 14 * minute)]


def test_expiry_handles_more_than_one_batch() -> None:
    h = Harness(how="outer", window=0, grace=3_000)
    for i in range(2_500):
        assert h.left(i, f"l{i}") == []
    out = h.join.advance(1_000_000)  # closes 2,500 windows in one call
    assert [o.timestamp_ms for o in out] == list(range(2_500))
    assert len(h.view) == 1  # only the metadata is left
    assert h.join.stats.buffered == 0


def test_expiry_across_batches_stops_at_the_first_open_window() -> None:
    grace = 1_000_000  # nothing closes while the events arrive
    h = Harness(how="outer", window=0, grace=grace)
    for i in range(2_500):
        h.left(i * 10, f"l{i}")
    out = h.join.advance(22_000 + grace)  # closes ts < 22,000: 2,200 events, 3 batches
    assert [o.timestamp_ms for o in out] == [i * 10 for i in range(2_200)]
    assert h.join.stats.buffered == 300
    # the next hint is the first open window: closing one more reads just that one
    assert [o.timestamp_ms for o in h.join.advance(22_001 + grace)] == [22_000]
    assert [o.timestamp_ms for o in h.join.advance(10**9)] == [i * 10 for i in range(2_201, 2_500)]
    assert len(h.view) == 1


# ------------------------------------------------------------------ state


def test_stats_buffered_counts_live_events() -> None:
    h = Harness()
    h.left(1000, "a")
    h.right(1000, "b")
    assert h.join.stats.buffered == 2
    h.join.advance(2000)
    assert h.join.stats.buffered == 0


def test_a_new_instance_continues_from_the_view() -> None:
    h = Harness(how="left")
    h.left(1000, "l")
    again = StreamStreamJoin(h.join.spec, h.view)
    assert again.stream_time_ms == 1000
    assert again.stats.buffered == 1
    assert again.process(JoinInput("right", b"k", b"r", 1001, 1)) == [pair("l", "r", 1001)]
    assert again.advance(5000) == []  # matched before the restart's partner arrived


def test_a_replayed_input_joins_again_but_is_buffered_once() -> None:
    h = Harness(how="left")
    h.left(1000, "l")
    event = JoinInput("right", b"k", b"r", 1001, 7)
    assert h.join.process(event) == [pair("l", "r", 1001)]
    assert h.join.process(event) == [pair("l", "r", 1001)]  # at-least-once duplicate
    assert h.join.stats.buffered == 2
    assert h.join.advance(5000) == []


def test_unknown_metadata_format_is_refused() -> None:
    view = MemoryKeyValueView({META_KEY: b"\x09" + bytes(24)})
    with pytest.raises(CorruptJoinState):
        StreamStreamJoin(JoinSpec(1, 1), view)


def _format_1(state: bytes) -> bytes:
    """Join metadata as format 1 wrote it (without the fresh seqs)."""
    return bytes([1]) + state[1:25]


def test_format_1_state_is_read_and_replays_are_still_found() -> None:
    """State written before format 2 does not say which seqs are buffered: every event's
    buffer key is looked up, so a replay is still joined again and buffered once."""
    h = Harness(how="left")
    h.left(1000, "l")  # seq 1
    h.right(1001, "r")  # seq 1
    h.view.put(META_KEY, _format_1(h.view.get(META_KEY) or b""))
    again = StreamStreamJoin(JoinSpec(W, G, "left"), h.view)
    assert again.stats.buffered == 2
    # the left event again (same seq): a replay, matched again but buffered once
    assert again.process(JoinInput("left", b"k", b"l", 1000, 1)) == [pair("l", "r", 1001)]
    assert again.stats.buffered == 2
    assert again.process(JoinInput("left", b"k", b"l2", 1002, 2)) == [pair("l2", "r", 1002)]
    assert again.stats.buffered == 3
    # everything closes: the index is empty, and so every seq is fresh again
    assert again.advance(10_000) == []
    assert h.view.snapshot() == {
        META_KEY: bytes([2])
        + encode_uint64(10_001)
        + bytes(8)
        + encode_uint64(MAX_UINT64)
        + bytes(16)
    }


def test_a_replay_below_the_fresh_seq_is_found_after_a_restart() -> None:
    """Events with seqs below the highest buffered one are looked up (replays after a
    restart resume from an older offset), events past it are not."""
    h = Harness(how="left")
    for seq in (3, 5, 9):
        assert h.join.process(JoinInput("left", b"k", f"l{seq}".encode(), 1000 + seq, seq)) == []
    again = StreamStreamJoin(JoinSpec(W, G, "left"), h.view)
    assert again.process(JoinInput("left", b"k", b"l5", 1005, 5)) == []  # a replay
    assert again.process(JoinInput("left", b"k", b"l4", 1004, 4)) == []  # new, below 9
    assert again.stats.buffered == 4
    # a new key below the fresh seq is buffered (and counted: its partner finds it)
    assert again.process(JoinInput("left", b"n", b"l6", 1006, 6)) == []
    assert again.process(JoinInput("right", b"n", b"r", 1007, 0)) == [
        JoinOutput(b"n", b"l6", b"r", 1007)
    ]
    assert again.advance(10_000) == [only_left(f"l{seq}", 1000 + seq) for seq in (3, 4, 5, 9)]
    assert again.stats.matched == 1


def test_malformed_expiry_entries_are_refused() -> None:
    h = Harness()
    h.left(1000, "l")
    # at the oldest buffered timestamp, so the expiry scan reaches it
    h.view.put(b"\x01" + encode_uint64(1000) + b"X", b"\x00")
    with pytest.raises(CorruptJoinState):
        h.join.advance(10_000)


def test_state_layout_is_pinned() -> None:
    """The bytes a worker's changelog holds: changing them needs a format version bump."""
    # the shared windowed layout's namespaces (streamjoin.state.window_layout)
    assert (META_KEY, EXPIRY_PREFIX, BUFFER_PREFIX) == (b"\x00join-state", b"\x01", b"\x02")
    h = Harness(how="left")
    h.left(1000, "v", key=b"key")
    h.right(1005, "w", key=b"key")
    assert h.view.snapshot() == {
        META_KEY: bytes([2])
        + encode_uint64(1005 + 1)  # stream time, + 1 so that 0 means "none yet"
        + encode_uint64(2)  # buffered
        + encode_uint64(1000)  # no buffered event is older
        + encode_uint64(2)  # no left event with a seq >= 2 is buffered
        + encode_uint64(2),  # nor a right one
        EXPIRY_PREFIX + encode_uint64(1000) + b"L" + encode_uint64(1) + length_prefixed(b"key"): (
            b"\x01"  # matched
        ),
        EXPIRY_PREFIX + encode_uint64(1005) + b"R" + encode_uint64(1) + length_prefixed(b"key"): (
            b"\x01"
        ),
        BUFFER_PREFIX + b"L" + window_key(b"key", 1000) + encode_uint64(1): b"v",
        BUFFER_PREFIX + b"R" + window_key(b"key", 1005) + encode_uint64(1): b"w",
    }
