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
from collections.abc import Mapping, Sequence


class _Owner:
    """Per group: how an owner's standbys are spread over the group's other members."""

    __slots__ = ("at_level", "extra", "level", "over", "quota")

    def __init__(self, level: int, at_level: int, quota: int, extra: int, over: int) -> None:
        #: the smallest count over the other eligible members, and how many have it
        self.level = level
        self.at_level = at_level
        #: every other member should end with ``quota`` or ``quota + 1`` ...
        self.quota = quota
        #: ... and ``extra`` of them with ``quota + 1``
        self.extra = extra
        #: other members holding more than ``quota``
        self.over = over


class Spread:
    """Counts of standbys per (active owner, holder), and the targets they are spread to.

    Per owner it keeps the lowest count and how many members have it, and how many
    are above the quota, so each question and update is O(1) (a new lowest count is
    found once per round of picks, by a look over the group's members).
    """

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
        self._everyone = False
        self._owners: dict[int, _Owner] = {}

    def begin_group(self, eligible: Sequence[int], members: int) -> None:
        """Levels and targets are per group: over its eligible members (of ``members``)."""
        self._eligible = frozenset(eligible)
        self._everyone = len(eligible) == members
        self._owners = {}

    def counts(self, a: int) -> dict[int, int]:
        """a's standbys per holder (all groups so far); read only."""
        return self._pairs.get(a) or {}

    def count(self, a: int, j: int) -> int:
        """Standbys of a's tasks on j (all groups so far)."""
        mine = self._pairs.get(a)
        return mine.get(j, 0) if mine else 0

    def view(self, a: int) -> tuple[int, dict[int, int]]:
        """``(level(a), counts(a))`` in one call, for the fill phase's hot path."""
        state = self._owners.get(a) or self._owner(a)
        return state.level, self._pairs.get(a) or {}

    def level(self, a: int) -> int:
        """The smallest count of a's standbys on any other eligible member of the group."""
        return self._owner(a).level

    def top(self, a: int) -> int:
        """The largest count of a's standbys on any other eligible member of the group."""
        mine = self.counts(a)
        if self._everyone:  # a never holds its own standby
            return max(mine.values(), default=0)
        eligible = self._eligible
        return max((c for j, c in mine.items() if j != a and j in eligible), default=0)

    def may_keep(self, a: int, j: int) -> bool:
        """May j keep (get) one more of a's standbys without clustering a's standbys?

        Below the quota, always; at it, only while fewer than ``extra`` others are
        above it.
        """
        state = self._owners.get(a) or self._owner(a)
        mine = self._pairs.get(a)
        c = mine.get(j, 0) if mine else 0
        return c < state.quota or (c == state.quota and state.over < state.extra)

    def keep(self, a: int, j: int) -> bool:
        """``may_keep`` and, if so, ``add`` (one call on the keep phase's hot path)."""
        state = self._owners.get(a) or self._owner(a)
        mine = self._pairs.get(a)
        if mine is None:
            mine = self._pairs[a] = {}
        c = mine.get(j, 0)
        if c > state.quota or (c == state.quota and state.over >= state.extra):
            return False
        mine[j] = c + 1
        if c == state.quota:
            state.over += 1
        if c == state.level:
            state.at_level -= 1
            if not state.at_level:
                self._relevel(a, state)
        return True

    def keep_all(self, picks: Mapping[int, Mapping[int, int]]) -> bool:
        """Keep every one of ``picks`` (owner -> holder -> how many more) if ``keep``
        would take each of them, whatever the order; else keep none and say so.

        For the keep phase's bulk path: ``keep`` takes all of them exactly when no
        holder ends above the owner's quota + 1, none already is above the quota,
        and the holders reaching quota + 1 fit in the owner's ``extra``.
        """
        for a, adds in picks.items():
            state = self._owners.get(a) or self._owner(a)
            mine = self._pairs.get(a) or {}
            crossing = 0
            for j, more in adds.items():
                after = mine.get(j, 0) + more
                if after > state.quota + 1:
                    return False
                if after == state.quota + 1:
                    crossing += 1
            if state.over + crossing > state.extra:
                return False
        for a, adds in picks.items():
            mine = self._pairs.setdefault(a, {})
            for j, more in adds.items():
                mine[j] = mine.get(j, 0) + more
            del self._owners[a]  # its level and holders above quota: found again when asked
        return True

    def add(self, a: int, j: int) -> None:
        """One more of a's standbys on j (an eligible member of the current group)."""
        mine = self._pairs.get(a)
        if mine is None:
            mine = self._pairs[a] = {}
        c = mine.get(j, 0)
        mine[j] = c + 1
        state = self._owners.get(a)
        if state is not None:
            if c == state.quota:
                state.over += 1
            if c == state.level:
                state.at_level -= 1
                if not state.at_level:
                    self._relevel(a, state)

    def remove(self, a: int, j: int) -> None:
        """One fewer of a's standbys on j (an eligible member of the current group)."""
        mine = self._pairs[a]
        c = mine[j] - 1
        mine[j] = c
        state = self._owners.get(a)
        if state is not None:
            if c == state.quota:
                state.over -= 1
            if c < state.level:
                state.level, state.at_level = c, 1
            elif c == state.level:
                state.at_level += 1

    def _owner(self, a: int) -> _Owner:
        state = self._owners.get(a)
        if state is not None:
            return state
        others = len(self._eligible) - (1 if a in self._eligible else 0)
        quota, extra = divmod(self._slots[a], others) if others else (0, 0)
        eligible = self._eligible
        held = [c for j, c in self.counts(a).items() if c and j != a and j in eligible]
        over = sum(1 for c in held if c > quota)
        state = _Owner(0, others - len(held), quota, extra, over)
        if not state.at_level:
            self._relevel(a, state)
        self._owners[a] = state
        return state

    def _relevel(self, a: int, state: _Owner) -> None:
        """Find the lowest count (and how many have it) again: the old one is gone."""
        mine = self.counts(a)
        values = [mine.get(j, 0) for j in self._eligible if j != a]
        state.level = min(values, default=0)
        state.at_level = values.count(state.level)
