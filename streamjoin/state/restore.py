"""Restore decisions for one store partition (pure: offsets in, a decision out).

Given the changelog offset stored with a local store and the changelog
partition's earliest and end offsets, decide whether the store is usable as
is, needs the remainder replayed, or must be wiped and rebuilt (its offset is
beyond the end of the changelog, e.g. after the topic was recreated, or before
its beginning, i.e. records it never saw were deleted).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from streamjoin.errors import ChangelogReadError


class RestoreAction(Enum):
    UP_TO_DATE = "up-to-date"
    REPLAY = "replay"
    REBUILD = "rebuild"


@dataclass(frozen=True)
class RestorePlan:
    action: RestoreAction
    #: first changelog offset to read (None when nothing is read)
    start: int | None
    #: records to replay (upper bound: compaction may have removed some)
    records: int
    reason: str = ""

    @property
    def needs_restore(self) -> bool:
        return self.action is not RestoreAction.UP_TO_DATE


def plan_restore(stored_offset: int | None, earliest: int, end: int) -> RestorePlan:
    """``stored_offset``: last applied changelog offset (None: empty store);
    ``earliest``/``end``: the changelog partition's log start and end (next offset)."""
    if end < earliest or earliest < 0:
        raise ChangelogReadError(f"invalid changelog bounds: earliest={earliest}, end={end}")
    if stored_offset is None:
        if end == earliest:
            return RestorePlan(RestoreAction.UP_TO_DATE, None, 0)
        return RestorePlan(RestoreAction.REPLAY, earliest, end - earliest)
    if stored_offset >= end:
        return RestorePlan(
            RestoreAction.REBUILD,
            earliest,
            end - earliest,
            f"store offset {stored_offset} is beyond the changelog end {end}",
        )
    if stored_offset + 1 < earliest:
        return RestorePlan(
            RestoreAction.REBUILD,
            earliest,
            end - earliest,
            f"store offset {stored_offset} is before the changelog start {earliest}",
        )
    if stored_offset + 1 == end:
        return RestorePlan(RestoreAction.UP_TO_DATE, None, 0)
    return RestorePlan(RestoreAction.REPLAY, stored_offset + 1, end - stored_offset - 1)


def lag_of(stored_offset: int | None, end: int) -> int:
    """How many changelog records a store is behind (what a member reports to the assignor)."""
    if stored_offset is None:
        return end
    return max(0, end - stored_offset - 1)
