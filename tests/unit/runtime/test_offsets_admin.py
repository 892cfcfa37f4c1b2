"""Planning moves of a group's committed offsets (pure: no broker)."""

from __future__ import annotations

import pytest

from streamjoin.errors import ConfigurationError, OffsetMoveRefused
from streamjoin.runtime.ops.offset_moves import (
    OffsetMove,
    PartitionOffsets,
    ResetTarget,
    parse_time,
    plan_reset,
    plan_skip,
)


def part(committed: int | None, beginning: int = 0, end: int = 10, p: int = 0) -> PartitionOffsets:
    return PartitionOffsets("events", p, committed, beginning, end)


def test_skip_commits_the_offset_after_the_record() -> None:
    move = plan_skip(part(4), 4)
    assert move == OffsetMove("events", 0, 4, 5)
    assert move.describe() == "events[0]: 4 -> 5"
    # a group that never committed starts at the earliest record
    assert plan_skip(part(None, beginning=3), 3) == OffsetMove("events", 0, None, 4)


def test_skip_refuses_to_skip_more_or_to_go_back_unless_forced() -> None:
    with pytest.raises(
        OffsetMoveRefused, match=r"next record in events\[0\] is 2, not 5: .*3 records"
    ):
        plan_skip(part(2), 5)
    with pytest.raises(OffsetMoveRefused, match="already past offset 5"):
        plan_skip(part(8), 5)
    assert plan_skip(part(2), 5, force=True).new == 6
    assert plan_skip(part(8), 5, force=True).new == 6


def test_skip_needs_a_record_at_the_offset() -> None:
    with pytest.raises(
        OffsetMoveRefused, match=r"no record at offset 10 \(its records are at 2..9\)"
    ):
        plan_skip(part(10, beginning=2), 10, force=True)
    with pytest.raises(OffsetMoveRefused, match="the partition is empty"):
        plan_skip(part(None, beginning=5, end=5), 5)


def test_reset_targets() -> None:
    parts = [part(7, beginning=2, p=0), part(None, beginning=0, end=4, p=1)]
    assert [m.new for m in plan_reset(parts, ResetTarget(earliest=True))] == [2, 0]
    assert [m.new for m in plan_reset(parts, ResetTarget(offset=3))] == [3, 3]
    with pytest.raises(OffsetMoveRefused, match=r"offset 5 is outside events\[1\] \(offsets 0..4"):
        plan_reset(parts, ResetTarget(offset=5))
    by_time = {("events", 0): 6, ("events", 1): None}
    moves = plan_reset(parts, ResetTarget(time_ms=1), by_time)
    assert [(m.old, m.new) for m in moves] == [(7, 6), (None, 4)]  # no record since: the end
    assert moves[0].changes and moves[1].describe() == "events[1]: none -> 4"
    assert not OffsetMove("events", 0, 3, 3).changes
    assert OffsetMove("events", 0, 3, 3).describe() == "events[0]: 3 -> 3 (unchanged)"


def test_reset_target_is_exactly_one_choice() -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        ResetTarget()
    with pytest.raises(ConfigurationError, match="exactly one"):
        ResetTarget(earliest=True, offset=1)


def test_times_parse_as_epoch_ms_or_iso_8601() -> None:
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000_000  # UTC unless it says
    assert parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(ConfigurationError, match="neither epoch milliseconds nor an ISO 8601"):
        parse_time("yesterday")


def test_lag_counts_from_the_log_start_without_a_commit() -> None:
    assert part(7).lag == 3
    assert part(None, beginning=4).lag == 6
    assert part(1, beginning=4).lag == 6  # a commit before the log start reads from it
