"""How one member's standbys spread over the others (pure): the bookkeeping for rule 6.

Why: with one replica, when every task of member a has its standby on the same
member b, a's failure hands all of a's tasks to b, and balance then forces some
of them onto members without a copy, which restore them from the changelog. So
for each active owner a, the standbys of a's tasks go round-robin over the
other eligible members: the counts ``c[a][j]`` of a's standbys on j differ by
at most one. With equal active loads (tasks a multiple of the members, equal
capacities) that is exactly what lets the active side give every orphan of a
failed member to a member holding its copy while staying balanced.

This module only keeps the counts and answers questions about them; where a
standby goes is decided in :mod:`streamjoin.assignor.standby`, where spread
ranks after tag spread and balance and before stickiness. Counts are global
across groups (a failure orphans the member's tasks of every group); levels
are per group, over the group's eligible members.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


class _Owner:
    """Per group: how an owner's standbys are spread over the group's other members."""

    __slots__ = ("extra", "hist", "level", "quota")

    def __init__(self, hist: dict[int, int], quota: int, extra: int) -> None:
        #: number of other eligible members holding each count of this owner's standbys
        self.hist = hist
        #: the smallest count over the other eligible members
        self.level = min((c for c, n in hist.items() if n), default=0)
        #: every other member should end with ``quota`` or ``quota + 1`` ...
        self.quota = quota
        #: ... and ``extra`` of them with ``quota + 1``
        self.extra = extra


class Spread:
    """Counts of standbys per (active owner, holder), and the targets they are spread to."""

    def __init__(self, owners: Sequence[Sequence[int]], replicas: Sequence[int]) -> None:
        """``owners[g][p]``: task p's active (-1: none); ``replicas[g]``: standbys per task."""
        slots: Counter[int] = Counter()
        for own, k in zip(owners, replicas, strict=True):
            if k:
                per_owner = Counter(own)
                per_owner.pop(-1, None)
                for o, n in per_owner.items():
                    slots[o] += k * n
        #: standbys each owner's tasks need, over all groups
        self._slots = slots
        self._pairs: dict[int, dict[int, int]] = {}
        self._eligible: frozenset[int] = frozenset()
        self._owners: dict[int, _Owner] = {}

    def begin_group(self, eligible: Sequence[int]) -> None:
        """Levels and targets are per group: over its eligible members."""
        self._eligible = frozenset(eligible)
        self._owners = {}

    def count(self, a: int, j: int) -> int:
        """Standbys of a's tasks on j (all groups so far)."""
        mine = self._pairs.get(a)
        return mine.get(j, 0) if mine else 0

    def level(self, a: int) -> int:
        """The smallest count of a's standbys on any other eligible member of the group."""
        return self._owner(a).level

    def top(self, a: int) -> int:
        """The largest count of a's standbys on any other eligible member of the group."""
        return max(c for c, n in self._owner(a).hist.items() if n)

    def may_keep(self, a: int, j: int) -> bool:
        """May j keep (get) one more of a's standbys without clustering a's standbys?

        Below the quota, always; at it, only while fewer than ``extra`` others are
        above it.
        """
        state = self._owner(a)
        c = self.count(a, j)
        if c < state.quota:
            return True
        if c > state.quota or not state.extra:
            return False
        above = sum(n for level, n in state.hist.items() if level > state.quota)
        return above < state.extra

    def add(self, a: int, j: int) -> None:
        mine = self._pairs.setdefault(a, {})
        c = mine.get(j, 0)
        mine[j] = c + 1
        state = self._owners.get(a)
        if state is not None and j in self._eligible:
            hist = state.hist
            hist[c] -= 1
            hist[c + 1] = hist.get(c + 1, 0) + 1
            while not hist.get(state.level):
                state.level += 1

    def remove(self, a: int, j: int) -> None:
        mine = self._pairs[a]
        c = mine[j]
        mine[j] = c - 1
        state = self._owners.get(a)
        if state is not None and j in self._eligible:
            state.hist[c] -= 1
            state.hist[c - 1] = state.hist.get(c - 1, 0) + 1
            state.level = min(state.level, c - 1)

    def _owner(self, a: int) -> _Owner:
        state = self._owners.get(a)
        if state is not None:
            return state
        others = len(self._eligible) - (1 if a in self._eligible else 0)
        hist: dict[int, int] = {}
        nonzero = 0
        for j, c in self._pairs.get(a, {}).items():
            if c and j != a and j in self._eligible:
                hist[c] = hist.get(c, 0) + 1
                nonzero += 1
        hist[0] = others - nonzero
        quota, extra = divmod(self._slots[a], others) if others else (0, 0)
        state = _Owner(hist, quota, extra)
        self._owners[a] = state
        return state
