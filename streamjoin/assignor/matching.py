"""Orphaned tasks matched to members holding caught-up state for them (pure).

Why: when a member dies, each of its tasks should go to a member holding a
caught-up copy (its standby), within balance. Taking the best offers first is
not enough with two replicas: orphan x may take the only caught-up holder of
orphan y with room while x had another one, and y then restores from scratch.
And which members get the leftover ``+1`` quotas decides who has room at all.
Here the ``+1`` quotas not needed to save moves are a shared budget, spent
while placing, and a breadth-first search moves already placed caught-up
orphans along chains (and ``+1`` quotas between members) until an unplaced one
fits: with the given quotas and budget, as many orphans as possible end on a
caught-up member. Used by the equal-subscriptions path of
:mod:`streamjoin.assignor.sticky`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

#: a task: (group, partition)
Task = tuple[int, int]

_NONE = -1
#: the node standing for the shared budget of ``+1`` quotas in the search
_BUDGET = -2


class Rooms:
    """How many more tasks each member may take: its room below quota, and maybe a ``+1``.

    ``spare`` members may each take one ``+1`` quota from a shared ``budget``.
    """

    def __init__(self, room: dict[int, int], spare: Iterable[int], budget: int) -> None:
        self.room = room
        self.spare = set(spare)
        self.budget = budget
        #: members that took a ``+1`` from the budget
        self.plus: set[int] = set()

    def can_take(self, i: int) -> bool:
        return self.room[i] > 0 or (self.budget > 0 and i in self.spare)

    def take(self, i: int) -> None:
        """One more task for i: from its room, else with a ``+1`` from the budget."""
        if self.room[i] > 0:
            self.room[i] -= 1
        else:
            self.grant(i)
            self.room[i] -= 1

    def grant(self, i: int) -> None:
        """Give i a ``+1`` quota (one more room) from the budget."""
        self.spare.discard(i)
        self.plus.add(i)
        self.budget -= 1
        self.room[i] += 1

    def move_plus(self, frm: int, to: int) -> None:
        """``frm`` gives its ``+1`` to ``to`` (``frm`` has one task fewer by then)."""
        self.plus.discard(frm)
        self.spare.add(frm)
        self.spare.discard(to)
        self.plus.add(to)


def augment(
    orphans: Iterable[Task],
    owners: list[list[int]],
    caught_up: Callable[[Task], Sequence[int]],
    placed: dict[int, list[Task]],
    rooms: Rooms,
    rank: Callable[[int, Task], int],
) -> int:
    """Place each unplaced orphan on a caught-up holder, moving others along a chain.

    ``caught_up(t)``: members holding caught-up state for task t; ``placed[m]``:
    the caught-up orphans placed on m so far (updated here); ``rank(i, t)``: an
    orphan only moves to a holder ranking no worse for it (0 best). Returns how
    many were placed. Members (and the budget) from which no chain reached room
    are not searched again: a later success never passes through them, so what
    they hold does not change. Cost: about the caught-up holders of the placed
    orphans, per success.
    """
    dead: set[int] = set()
    done = 0
    for start in orphans:
        g, p = start
        if owners[g][p] != _NONE:
            continue
        parent: dict[int, tuple[Task | None, int]] = {}
        queue: deque[int] = deque()
        for i in caught_up(start):
            if i not in dead and i not in parent:
                parent[i] = (start, _NONE)
                queue.append(i)
        end = _NONE
        while queue:
            m = queue.popleft()
            if m == _BUDGET:
                for j in sorted(rooms.plus):
                    if j not in parent and j not in dead:
                        parent[j] = (None, _BUDGET)
                        queue.append(j)
                continue
            if rooms.can_take(m):
                end = m
                break
            if m in rooms.spare and rooms.plus and _BUDGET not in parent and _BUDGET not in dead:
                parent[_BUDGET] = (None, m)
                queue.append(_BUDGET)
            for t in placed.get(m, ()):
                mine = rank(m, t)
                for i in caught_up(t):
                    if i not in parent and i not in dead and rank(i, t) <= mine:
                        parent[i] = (t, m)
                        queue.append(i)
        if end == _NONE:
            dead.update(parent)
            continue
        rooms.take(end)
        m = end
        while True:
            moved, frm = parent[m]
            if moved is None:  # m gave its +1 to the member before the budget node
                taker = parent[_BUDGET][1]
                rooms.move_plus(m, taker)
                m = taker
                continue
            owners[moved[0]][moved[1]] = m
            placed.setdefault(m, []).append(moved)
            if frm == _NONE:
                break
            placed[frm].remove(moved)
            m = frm
        done += 1
    return done


def caught_up_lookup(
    holders: Mapping[int, Mapping[int, Sequence[tuple[int, int, int]]]], tier: int
) -> Callable[[Task], list[int]]:
    """``caught_up(t)`` over per-group ``state_holders`` results: members of that tier."""

    def caught_up(t: Task) -> list[int]:
        return [i for k, _, i in holders[t[0]].get(t[1], ()) if k == tier]

    return caught_up
