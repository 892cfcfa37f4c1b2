"""Restore decisions from stored and changelog offsets."""

from __future__ import annotations

import pytest

from streamjoin.errors import ChangelogReadError
from streamjoin.state.restore import RestoreAction, lag_of, plan_restore


@pytest.mark.parametrize(
    ("stored", "earliest", "end", "action", "start", "records"),
    [
        (None, 0, 0, RestoreAction.UP_TO_DATE, None, 0),  # empty changelog, empty store
        (None, 0, 100, RestoreAction.REPLAY, 0, 100),  # new worker: everything
        (None, 40, 100, RestoreAction.REPLAY, 40, 60),  # log start moved
        (99, 0, 100, RestoreAction.UP_TO_DATE, None, 0),  # caught up
        (89, 0, 100, RestoreAction.REPLAY, 90, 10),  # the remainder only
        (150, 0, 100, RestoreAction.REBUILD, 0, 100),  # beyond the end: recreated topic
        (100, 0, 100, RestoreAction.REBUILD, 0, 100),  # offset == end is also beyond
        (10, 50, 100, RestoreAction.REBUILD, 50, 50),  # missed deleted records
        (49, 50, 100, RestoreAction.REPLAY, 50, 50),  # exactly at the log start
    ],
)
def test_plan(
    stored: int | None,
    earliest: int,
    end: int,
    action: RestoreAction,
    start: int | None,
    records: int,
) -> None:
    plan = plan_restore(stored, earliest, end)
    assert (plan.action, plan.start, plan.records) == (action, start, records)
    assert plan.needs_restore == (action is not RestoreAction.UP_TO_DATE)
    if action is RestoreAction.REBUILD:
        assert str(stored) in plan.reason


def test_invalid_bounds_are_rejected() -> None:
    with pytest.raises(ChangelogReadError, match="invalid changelog bounds"):
        plan_restore(None, 10, 5)


def test_lag() -> None:
    assert lag_of(None, 100) == 100
    assert lag_of(99, 100) == 0
    assert lag_of(49, 100) == 50
    assert lag_of(500, 100) == 0
