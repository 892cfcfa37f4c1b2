"""The leader's half of cooperative rebalancing: moving tasks are withheld until revoked."""

from __future__ import annotations

from streamjoin.assignor import assign
from streamjoin.assignor.cooperative import partition_changes, withhold_moves
from streamjoin.assignor.model import AssignorConfig, MemberState, Scenario

TOPICS = {"clicks": 4, "impressions": 4, "joined-changelog": 4}
COPARTITION = (("clicks", "impressions", "joined-changelog"),)
CHANGELOGS = frozenset({"joined-changelog"})


def scenario(*members: MemberState) -> Scenario:
    return Scenario(
        topics=TOPICS,
        members=members,
        copartition=COPARTITION,
        changelog_topics=CHANGELOGS,
        config=AssignorConfig(standby_replicas=1),
    )


def member(name: str, generation: int = -1, *active: int) -> MemberState:
    parts = tuple(active)
    return MemberState(
        name,
        frozenset(TOPICS),
        generation=generation,
        active={t: parts for t in TOPICS} if parts else {},
    )


def test_a_task_owned_elsewhere_is_pending_not_active() -> None:
    # "a" processed all four tasks; "b" joins: two tasks move to it, but not yet
    s = scenario(member("a", 3, 0, 1, 2, 3), member("b"))
    result = assign(s)
    moving = set(result.assignments["b"].active["clicks"])
    assert len(moving) == 2
    owned = {"a": {"clicks": (0, 1, 2, 3), "impressions": (0, 1, 2, 3)}}
    withheld = withhold_moves(result, owned, s.topics, s.copartition)
    b = withheld.assignments["b"]
    assert b.active == {}
    # the whole task is pending, changelog included (it is warmed up meanwhile)
    assert b.pending == {t: tuple(sorted(moving)) for t in TOPICS}
    # the owner keeps only what stays: it revokes the rest and rejoins
    a = withheld.assignments["a"]
    assert set(a.active["clicks"]) == {0, 1, 2, 3} - moving
    assert withheld.stats.extra["withheld"] == 2


def test_nothing_is_withheld_when_nobody_owns_anything() -> None:
    s = scenario(member("a", 3, 0, 1, 2, 3), member("b"))
    result = assign(s)
    withheld = withhold_moves(result, {}, s.topics, s.copartition)
    assert withheld.assignments == result.assignments
    assert withheld.stats.extra["withheld"] == 0


def test_the_follow_up_hands_the_task_over() -> None:
    # after "a" revoked, it owns only what it kept; "b" claims what was pending for it
    first = scenario(member("a", 3, 0, 1, 2, 3), member("b"))
    result = withhold_moves(
        assign(first),
        {"a": {"clicks": (0, 1, 2, 3), "impressions": (0, 1, 2, 3)}},
        first.topics,
        first.copartition,
    )
    kept = result.assignments["a"].active["clicks"]
    pending = result.assignments["b"].pending["clicks"]
    follow_up = scenario(member("a", 4, *kept), member("b", 4, *pending))
    owned = {"a": {"clicks": kept, "impressions": kept}}
    final = withhold_moves(assign(follow_up), owned, follow_up.topics, follow_up.copartition)
    assert final.assignments["b"].active["clicks"] == pending
    assert final.assignments["b"].pending == {}
    assert final.assignments["a"].active["clicks"] == kept
    assert final.stats.extra["withheld"] == 0


def test_a_task_claimed_by_two_owners_goes_to_neither_new_owner_until_both_let_go() -> None:
    s = scenario(member("a", 3, 0, 1), member("b", 3, 2, 3), member("c"))
    result = assign(s)
    owned = {"a": {"clicks": (0, 1)}, "b": {"clicks": (0, 2, 3)}}  # "b" is a zombie for 0
    withheld = withhold_moves(result, owned, s.topics, s.copartition)
    for name, assignment in withheld.assignments.items():
        for p in assignment.active.get("clicks", ()):
            others = {m for m, tps in owned.items() if p in tps.get("clicks", ()) and m != name}
            assert not others, (name, p)


def test_partition_changes() -> None:
    changes = partition_changes([("t", 0), ("t", 1)], [("t", 1), ("t", 2)])
    assert changes.revoked == {("t", 0)}
    assert changes.added == {("t", 2)}
    assert changes.kept == {("t", 1)}
