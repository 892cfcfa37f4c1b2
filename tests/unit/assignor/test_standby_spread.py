"""Rule 6's spread: each member's standbys go round-robin over the others, so that the
failure of any one member is taken over by caught-up copies while staying balanced.

The layouts come from three histories per shape: a fresh group, workers joining one
after another (each reporting what it was given, with caught-up state), and one of them
leaving and coming back. After each, every member in turn dies: the survivors report
their actives and standbys caught up, and the assignor must give each orphaned task to
a member holding its standby. That is possible whenever the active loads are equal
(tasks a multiple of the members): when some members run one task more, those are full
after a failure, and standby balance (which ranks higher) makes them host standbys all
the same, so there only the spread itself is checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from assignor_support import run, scenario

from streamjoin.assignor import AssignmentResult, MemberState, Scenario

SOURCE = "src"
LOG = "log"


def shaped(topics: dict[str, int], members: list[MemberState], replicas: int) -> Scenario:
    return scenario(
        topics,
        members,
        copartition=[[SOURCE, LOG]],
        changelogs=[LOG],
        standby_replicas=replicas,
    )


def reported(sc: Scenario, result: AssignmentResult, generation: int) -> list[MemberState]:
    """Members reporting what they were given, all of it caught up (as after a while)."""
    out = []
    for m in sc.members:
        got = result.assignments[m.member_id]
        held = (*got.active.get(LOG, ()), *got.standby.get(LOG, ()))
        out.append(
            MemberState(
                member_id=m.member_id,
                topics=m.topics,
                generation=generation,
                active={SOURCE: got.active.get(SOURCE, ())},
                standby=got.standby,
                state_lag={LOG: dict.fromkeys(held, 0)} if held else {},
            )
        )
    return out


def histories(
    members: int, tasks: int, replicas: int
) -> Iterator[tuple[str, Scenario, AssignmentResult]]:
    topics = {SOURCE: tasks, LOG: tasks}
    subscribed = frozenset(topics)
    fresh = shaped(topics, [MemberState(f"w{i}", subscribed) for i in range(members)], replicas)
    yield "fresh", fresh, run(fresh)
    group: list[MemberState] = []
    generation = 0
    for i in range(members):
        group.append(MemberState(f"w{i}", subscribed))
        sc = shaped(topics, group, replicas)
        result = run(sc)
        generation += 1
        group = reported(sc, result, generation)
    yield "joins", sc, result
    sc = shaped(topics, group[1:], replicas)
    result = run(sc)
    generation += 1
    back = [*reported(sc, result, generation), MemberState("w0", subscribed)]
    sc = shaped(topics, back, replicas)
    yield "leave and return", sc, run(sc)


def owner_of(result: AssignmentResult) -> dict[int, str]:
    return {p: mid for mid, a in result.assignments.items() for p in a.active.get(SOURCE, ())}


def pair_counts(result: AssignmentResult) -> Counter[tuple[str, str]]:
    """(active owner, standby holder) -> standbys of the owner's tasks on the holder."""
    owner = owner_of(result)
    return Counter(
        (owner[p], mid) for mid, a in result.assignments.items() for p in a.standby.get(LOG, ())
    )


def orphans_without_their_copy(
    sc: Scenario, result: AssignmentResult, replicas: int
) -> list[tuple[str, int]]:
    """For every member in turn: its tasks that the survivors' assignment gives to a
    member without a standby of them."""
    members = reported(sc, result, 99)
    missed = []
    for dead in members:
        survivors = [m for m in members if m is not dead]
        after = owner_of(run(shaped(sc.topics, survivors, replicas)))
        for p in result.assignments[dead.member_id].active.get(SOURCE, ()):
            holders = {m for m, a in result.assignments.items() if p in a.standby.get(LOG, ())}
            if after[p] not in holders:
                missed.append((dead.member_id, p))
    return missed


SHAPES = [
    (members, tasks, replicas)
    for replicas in (1, 2)
    for members in range(3, 9)
    for tasks in range(members, 4 * members + 4)
    if replicas < members
]


@pytest.mark.parametrize(("members", "tasks", "replicas"), SHAPES)
def test_each_members_standbys_spread_over_the_others(
    members: int, tasks: int, replicas: int
) -> None:
    for history, sc, result in histories(members, tasks, replicas):
        counts = pair_counts(result)
        ids = [m.member_id for m in sc.members]
        for a in ids:
            spread = [counts[(a, j)] for j in ids if j != a]
            assert max(spread) - min(spread) <= 1, (history, a, spread)


@pytest.mark.parametrize(("members", "tasks", "replicas"), [s for s in SHAPES if s[1] % s[0] == 0])
def test_any_members_failure_is_taken_over_by_caught_up_copies(
    members: int, tasks: int, replicas: int
) -> None:
    for history, sc, result in histories(members, tasks, replicas):
        assert orphans_without_their_copy(sc, result, replicas) == [], history


def test_the_reported_layout_three_workers_six_partitions() -> None:
    """The user's case: workers started one after another, 1 standby. Before, both tasks
    of a worker had their standby on the same other worker."""
    _, sc, result = next(h for h in histories(3, 6, 1) if h[0] == "joins")
    assert set(pair_counts(result).values()) == {1}
    assert orphans_without_their_copy(sc, result, 1) == []


def test_a_clustered_sticky_standby_yields() -> None:
    """Both of x's tasks have their standby on y: one moves to z, one stays."""
    topics = {SOURCE: 6, LOG: 6}
    subscribed = frozenset(topics)

    def member(mid: str, active: list[int], standby: list[int]) -> MemberState:
        return MemberState(
            mid,
            subscribed,
            generation=3,
            active={SOURCE: active},
            standby={LOG: standby},
            state_lag={LOG: dict.fromkeys(active + standby, 0)},
        )

    sc = shaped(
        topics,
        [member("x", [0, 1], [4, 5]), member("y", [2, 3], [0, 1]), member("z", [4, 5], [2, 3])],
        1,
    )
    result = run(sc)
    assert result.stats.moved == 0
    assert set(pair_counts(result).values()) == {1}
    assert result.stats.extra["standby_kept"] == 3  # one of each clustered pair stays


@pytest.mark.parametrize(("members", "tasks", "replicas"), [(3, 6, 1), (4, 10, 1), (5, 12, 2)])
def test_a_spread_layout_is_kept_as_it_is(members: int, tasks: int, replicas: int) -> None:
    for _, sc, result in histories(members, tasks, replicas):
        again = run(shaped(sc.topics, reported(sc, result, 100), replicas))
        assert {m: a.standby for m, a in again.assignments.items()} == {
            m: a.standby for m, a in result.assignments.items()
        }
