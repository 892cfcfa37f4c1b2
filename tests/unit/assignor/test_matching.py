"""Orphans matched to caught-up holders: greedy first, then chains, as many as possible."""

from __future__ import annotations

import os
from itertools import product

from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.assignor.matching import Rooms, Task, augment

NONE = -1


def greedy_then_augment(
    holders: dict[Task, list[int]], room: dict[int, int], spare: set[int], budget: int
) -> tuple[list[list[int]], Rooms]:
    """What sticky.py does: the offers in order while someone can take them, then chains."""
    tasks = sorted(holders)
    owners = [[NONE] * (max(p for _, p in tasks) + 1)]
    rooms = Rooms(dict(room), spare, budget)
    placed: dict[int, list[Task]] = {}
    for t in tasks:
        for i in holders[t]:
            if rooms.can_take(i):
                owners[0][t[1]] = i
                rooms.take(i)
                placed.setdefault(i, []).append(t)
                break
    augment(tasks, owners, lambda t: holders[t], placed, rooms, lambda i, t: 0)
    return owners, rooms


def best_possible(
    holders: dict[Task, list[int]], room: dict[int, int], spare: set[int], budget: int
) -> int:
    """The most orphans on a caught-up holder, by trying every choice."""
    tasks = sorted(holders)
    best = 0
    for choice in product(*([NONE, *holders[t]] for t in tasks)):
        load: dict[int, int] = {}
        for i in choice:
            if i != NONE:
                load[i] = load.get(i, 0) + 1
        extra = [i for i, n in load.items() if n > room[i]]
        if any(load[i] > room[i] + 1 or i not in spare for i in extra) or len(extra) > budget:
            continue
        best = max(best, sum(1 for i in choice if i != NONE))
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[dict[Task, list[int]], dict[int, int], set[int], int]:
    members = draw(st.integers(1, 5))
    n = draw(st.integers(1, 6))
    holders = {
        (0, p): draw(st.lists(st.integers(0, members - 1), min_size=1, max_size=3, unique=True))
        for p in range(n)
    }
    room = {i: draw(st.integers(0, 2)) for i in range(members)}
    spare = draw(st.sets(st.integers(0, members - 1)))
    return holders, room, spare, draw(st.integers(0, 2))


@settings(max_examples=int(os.environ.get("STREAMJOIN_ASSIGNOR_EXAMPLES", "400")), deadline=None)
@given(instances())
def test_as_many_orphans_as_possible_end_on_a_caught_up_holder(
    case: tuple[dict[Task, list[int]], dict[int, int], set[int], int],
) -> None:
    holders, room, spare, budget = case
    owners, rooms = greedy_then_augment(holders, room, set(spare), budget)
    got = [(t, owners[0][t[1]]) for t in holders if owners[0][t[1]] != NONE]
    assert all(i in holders[t] for t, i in got)
    assert len(got) == best_possible(holders, room, spare, budget)
    # rooms and +1 quotas add up: nobody beyond its room, the +1s from the budget
    assert rooms.plus <= spare and len(rooms.plus) + rooms.budget == budget
    for i, r in room.items():
        taken = sum(1 for _, j in got if j == i)
        assert taken + rooms.room[i] == r + (1 if i in rooms.plus else 0)
        assert rooms.room[i] >= 0


def test_a_chain_frees_the_only_holder() -> None:
    """x could go to A or B, y only to A; greedy gave A to x: x moves to B."""
    holders = {(0, 0): [0, 1], (0, 1): [0]}
    owners, _ = greedy_then_augment(holders, {0: 1, 1: 1}, set(), 0)
    assert owners[0] == [1, 0]


def test_a_plus_one_quota_moves_to_where_the_state_is() -> None:
    """The budget's only +1 went to A for x (which C could take too); y's only holder B
    needs it: x moves to C, and A's +1 goes to B."""
    holders = {(0, 0): [0, 2], (0, 1): [1]}
    owners, rooms = greedy_then_augment(holders, {0: 0, 1: 0, 2: 1}, {0, 1}, 1)
    assert owners[0] == [2, 1]
    assert rooms.plus == {1} and rooms.spare == {0}
