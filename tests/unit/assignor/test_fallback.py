"""The fallback assignment: safe by construction on any scenario, and it moves nothing."""

from __future__ import annotations

from assignor_support import following, member, scenario
from hypothesis import given
from test_assignor_properties import SETTINGS, scenarios

from streamjoin.assignor import Scenario, assign, fallback_assignment, find_violations
from streamjoin.assignor.conflicts import resolve_claims
from streamjoin.assignor.grouping import build_grouping
from streamjoin.assignor.pipeline import sorted_members


def unsafe(sc: Scenario) -> list[str]:
    return [str(v) for v in find_violations(sc, fallback_assignment(sc)) if v.unsafe]


@SETTINGS
@given(scenarios())
def test_no_safety_rule_is_broken(sc: Scenario) -> None:
    assert unsafe(sc) == []


@SETTINGS
@given(scenarios())
def test_previous_owners_keep_their_tasks(sc: Scenario) -> None:
    members = sorted_members(sc)
    grouping = build_grouping(sc.topics, sc.copartition, sc.changelog_topics, members)
    claims = resolve_claims(grouping, members, sc.config.acceptable_recovery_lag)
    result = fallback_assignment(sc)
    for group in grouping.groups:
        for p, o in enumerate(claims.owners[group.index]):
            if o >= 0:
                got = result.assignments[members[o].member_id].active
                assert all(p in got.get(t, ()) for t in group.topics)


def test_orphans_go_to_the_least_loaded_and_standbys_follow_the_active() -> None:
    topics = {"a": 6, "c": 6}
    sc = scenario(
        topics,
        [
            member("m1", topics, generation=1, active={"a": [0, 1, 2], "c": [0, 1, 2]}),
            member("m2", topics),
            member("m3", topics),
        ],
        copartition=[["a", "c"]],
        changelogs=["c"],
        standby_replicas=1,
    )
    result = fallback_assignment(sc)
    assert {m: a.active.get("a") for m, a in result.assignments.items()} == {
        "m1": (0, 1, 2),
        "m2": (3, 5),
        "m3": (4,),
    }
    # standby of each task on the next eligible member after its active
    assert {m: a.standby.get("c") for m, a in result.assignments.items()} == {
        "m1": (4,),
        "m2": (0, 1, 2),
        "m3": (3, 5),
    }
    assert result.stats.moved == 0 and result.stats.extra["orphaned"] == 3
    assert not result.followup_rebalance


def test_after_a_valid_assignment_nothing_moves() -> None:
    topics = {"a": 10, "b": 10}
    sc = scenario(topics, [member(f"m{i}", topics) for i in range(4)], copartition=[["a", "b"]])
    first = assign(sc)
    again = Scenario(sc.topics, tuple(following(sc, first, 1)), sc.copartition)
    assert {m: a.active for m, a in fallback_assignment(again).assignments.items()} == {
        m: a.active for m, a in first.assignments.items()
    }
