"""One test (or a few) per rule of the assignor, plus the KIP-54 and KIP-315 worked examples."""

from __future__ import annotations

import random

import pytest
from assignor_support import active, counts, following, member, run, scenario, standby

from streamjoin.assignor import (
    AssignmentResult,
    MemberAssignment,
    MemberState,
    Scenario,
    ViolationCode,
    assign,
    find_violations,
)
from streamjoin.errors import InvalidAssignmentError, InvalidScenarioError

T4 = ("t0", "t1", "t2", "t3")
JOIN = ("impressions", "clicks")

# ------------------------------------------------------------------------- KIP-54 examples


def test_kip54_example1_member_leaves_keeps_five_assignments() -> None:
    topics = {t: 2 for t in T4}
    fresh = run(scenario(topics, [member(c, T4) for c in ("C0", "C1", "C2")]))
    assert sorted(sum(len(ps) for ps in a.active.values()) for a in fresh.assignments.values()) == [
        2,
        3,
        3,
    ]
    # the KIP's previous assignment, then C1 leaves
    c0 = {"t0": [0], "t1": [1], "t3": [0]}
    c2 = {"t1": [0], "t2": [1]}
    sc = scenario(
        topics,
        [member("C0", T4, generation=1, active=c0), member("C2", T4, generation=1, active=c2)],
    )
    result = run(sc)
    for mid, before in (("C0", c0), ("C2", c2)):
        for t, ps in before.items():
            assert set(ps) <= active(result, mid, t)
    assert result.stats.moved == 0
    assert result.stats.min_possible_moves == 0
    assert sorted(
        sum(len(ps) for ps in a.active.values()) for a in result.assignments.values()
    ) == [
        4,
        4,
    ]


def test_kip54_example2_unequal_subscriptions() -> None:
    topics = {"t0": 1, "t1": 2, "t2": 3}
    subs = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    fresh = run(scenario(topics, [member(c, s) for c, s in subs.items()]))
    assert fresh.assignments["C0"].active == {"t0": (0,)}
    assert fresh.assignments["C1"].active == {"t1": (0, 1)}
    assert fresh.assignments["C2"].active == {"t2": (0, 1, 2)}
    assert fresh.stats.min_possible_moves is None
    # C0 leaves: everything else stays, t0p0 goes to C1
    sc = scenario(
        topics,
        [
            member("C1", subs["C1"], generation=1, active={"t1": [0, 1]}),
            member("C2", subs["C2"], generation=1, active={"t2": [0, 1, 2]}),
        ],
    )
    result = run(sc)
    assert result.assignments["C1"].active == {"t0": (0,), "t1": (0, 1)}
    assert result.assignments["C2"].active == {"t2": (0, 1, 2)}
    assert result.stats.moved == 0


def test_kip54_example3_member_joins_moves_one() -> None:
    topics = {"t0": 2, "t1": 2}
    sc = scenario(
        topics,
        [
            member("C0", topics, generation=1, active={"t0": [0], "t1": [0]}),
            member("C1", topics, generation=1, active={"t0": [1], "t1": [1]}),
            member("C2", topics),
        ],
    )
    result = run(sc)
    assert result.stats.moved == 1
    assert result.stats.min_possible_moves == 1
    assert sum(len(ps) for ps in result.assignments["C2"].active.values()) == 1
    kept = sum(len(active(result, c, t) & {int(c == "C1")}) for c in ("C0", "C1") for t in topics)
    assert kept == 3


# ------------------------------------------------------------------------------ KIP-315


def kip315_previous() -> dict[str, list[int]]:
    return {"A": [0, 1, 2], "B": [3, 4, 5], "C": [6, 7], "D": [8, 9]}


def test_kip315_member_leaves_only_its_partitions_move() -> None:
    topics = {"impressions": 10, "clicks": 10}
    prev = kip315_previous()
    sc = scenario(
        topics,
        [
            member(c, JOIN, generation=3, active={t: ps for t in JOIN})
            for c, ps in prev.items()
            if c != "D"
        ],
        copartition=[JOIN],
    )
    result = run(sc)
    for c in "ABC":
        assert set(prev[c]) <= active(result, c, "impressions")
        assert active(result, c, "impressions") == active(result, c, "clicks")
    assert result.stats.moved == 0
    assert result.stats.extra["orphaned"] == 2
    assert sorted(counts(result, "clicks").values()) == [3, 3, 4]


def test_kip315_fresh_is_copartitioned_and_balanced() -> None:
    sc = scenario(
        {"impressions": 10, "clicks": 10},
        [member(c, JOIN) for c in "ABCD"],
        copartition=[JOIN],
    )
    result = run(sc)
    for c in "ABCD":
        assert active(result, c, "impressions") == active(result, c, "clicks")
    assert sorted(counts(result, "impressions").values()) == [2, 2, 3, 3]


# ------------------------------------------------------------------------- rule 1: validity


def test_member_only_gets_groups_it_fully_subscribes_to() -> None:
    sc = scenario(
        {"a": 4, "b": 4, "c": 4},
        [member("m1", ["a", "b", "c"]), member("m2", ["a", "c"])],
        copartition=[["a", "b"]],
    )
    result = run(sc)
    assert result.assignments["m2"].active.keys() <= {"c"}
    assert active(result, "m1", "a") == {0, 1, 2, 3}
    assert any("m2" in w and "only part" in w for w in result.warnings)


def test_mismatched_partition_counts_assign_the_minimum_and_warn() -> None:
    sc = scenario(
        {"a": 4, "b": 6},
        [member("m1", "ab"), member("m2", "ab")],
        copartition=[["a", "b"]],
    )
    result = run(sc)
    assert result.unassigned == {"b": (4, 5)}
    assert result.stats.tasks == 4
    assert any("different partition counts" in w for w in result.warnings)
    assert active(result, "m1", "b") | active(result, "m2", "b") == {0, 1, 2, 3}


def test_group_without_eligible_member_is_unassigned() -> None:
    sc = scenario({"a": 2, "lonely": 3}, [member("m1", ["a"])])
    result = run(sc)
    assert result.unassigned == {"lonely": (0, 1, 2)}
    assert any("lonely" in w for w in result.warnings)


def test_unknown_subscription_is_a_warning() -> None:
    result = run(scenario({"a": 2}, [member("m1", ["a", "ghost"])]))
    assert any("ghost" in w for w in result.warnings)
    assert active(result, "m1", "a") == {0, 1}


def test_overlapping_copartition_groups_merge() -> None:
    sc = scenario(
        {"a": 3, "b": 3, "c": 3},
        [member("m1", "abc"), member("m2", "abc")],
        copartition=[["a", "b"], ["b", "c"]],
    )
    result = run(sc)
    for m in ("m1", "m2"):
        assert active(result, m, "a") == active(result, m, "b") == active(result, m, "c")


def test_bad_scenarios_raise_named_errors() -> None:
    with pytest.raises(InvalidScenarioError, match="unknown topic 'x'"):
        assign(scenario({"a": 1}, [member("m", "a")], copartition=[["a", "x"]]))
    with pytest.raises(InvalidScenarioError, match="duplicate member id"):
        assign(scenario({"a": 1}, [member("m", "a"), member("m", "a")]))
    with pytest.raises(InvalidScenarioError, match="changelog topic"):
        assign(scenario({"a": 1}, [member("m", "a")], changelogs=["nope"]))


def test_empty_and_trivial_scenarios() -> None:
    assert run(scenario({}, [])).assignments == {}
    result = run(scenario({"a": 0}, [member("m", "a")]))
    assert result.assignments["m"].active == {}
    result = run(scenario({"a": 3}, []))
    assert result.unassigned == {"a": (0, 1, 2)}


def test_determinism_under_member_and_key_order() -> None:
    rng = random.Random(7)
    topics = {f"t{i}": 6 for i in range(5)}
    members = [
        member(
            f"m{i}",
            rng.sample(sorted(topics), 4),
            capacity=rng.randint(1, 3),
            generation=rng.randint(0, 3),
            active={t: rng.sample(range(6), 2) for t in rng.sample(sorted(topics), 2)},
            standby={"t4": rng.sample(range(6), 2)},
            state_lag={"t4": {p: rng.randint(0, 20_000) for p in range(6)}},
            tags={"zone": rng.choice("ab")},
        )
        for i in range(7)
    ]
    base = scenario(
        topics,
        members,
        copartition=[["t0", "t1"], ["t3", "t4"]],
        changelogs=["t4"],
        standby_replicas=2,
    )
    expected = run(base)
    for _ in range(5):
        shuffled = list(members)
        rng.shuffle(shuffled)
        shuffled = [
            MemberState(
                member_id=m.member_id,
                topics=frozenset(rng.sample(sorted(m.topics), len(m.topics))),
                capacity=m.capacity,
                generation=m.generation,
                active=dict(rng.sample(list(m.active.items()), len(m.active))),
                standby=m.standby,
                state_lag=dict(rng.sample(list(m.state_lag.items()), len(m.state_lag))),
                tags=m.tags,
            )
            for m in shuffled
        ]
        keys = list(topics)
        rng.shuffle(keys)
        sc = Scenario(
            topics={k: topics[k] for k in keys},
            members=tuple(shuffled),
            copartition=(("t4", "t3"), ("t1", "t0")),
            changelog_topics=base.changelog_topics,
            config=base.config,
        )
        assert assign(sc) == expected


# ------------------------------------------------------------------------- rule 2: conflicts


def test_highest_generation_wins_a_conflict() -> None:
    sc = scenario(
        {"a": 2},
        [
            member("old", "a", generation=3, active={"a": [0, 1]}),
            member("new", "a", generation=4, active={"a": [0]}),
        ],
    )
    result = run(sc)
    assert active(result, "new", "a") == {0}
    assert active(result, "old", "a") == {1}
    assert result.stats.extra["contested"] == 1
    assert result.stats.moved == 0


def test_equal_generations_cancel_the_claim() -> None:
    sc = scenario(
        {"a": 4},
        [
            member("x", "a", generation=5, active={"a": [0, 1]}),
            member("y", "a", generation=5, active={"a": [0, 2]}),
        ],
    )
    result = run(sc)
    assert result.stats.extra["conflict_ties"] == 1
    assert result.stats.extra["orphaned"] == 2  # partition 0 (tie) and 3 (nobody)
    assert result.stats.moved == 0


def test_previous_owner_that_is_no_longer_eligible_loses_its_claim() -> None:
    sc = scenario(
        {"a": 2, "b": 2},
        [
            member("x", ["a"], generation=5, active={"a": [0, 1], "b": [0, 1]}),
            member("y", ["a", "b"], generation=4, active={"a": [0]}),
        ],
        copartition=[["a", "b"]],
    )
    result = run(sc)
    assert active(result, "y", "a") == {0, 1}
    assert result.stats.extra["ineligible_owner"] == 2
    assert result.stats.moved == 0


# --------------------------------------------------------------------------- rule 3: balance


def test_capacity_shares() -> None:
    sc = scenario(
        {"a": 12},
        [
            member("m1", "a", capacity=1),
            member("m2", "a", capacity=2),
            member("m3", "a", capacity=3),
        ],
    )
    assert counts(run(sc), "a") == {"m1": 2, "m2": 4, "m3": 6}


def test_capacity_shares_floor_or_ceiling() -> None:
    sc = scenario({"a": 10}, [member("m1", "a", capacity=1), member("m2", "a", capacity=2)])
    got = counts(run(sc), "a")
    assert got["m1"] in (3, 4) and got["m2"] in (6, 7)


def test_unequal_subscriptions_reach_weighted_balance() -> None:
    topics = {"a": 8, "b": 4}
    sc = scenario(
        topics,
        [
            member("m1", ["a"], generation=1, active={"a": range(8)}),
            member("m2", ["a", "b"], capacity=2),
        ],
    )
    result = run(sc)
    got = {m: len(active(result, m, "a")) + len(active(result, m, "b")) for m in ("m1", "m2")}
    assert got == {"m1": 4, "m2": 8}


def test_unequal_subscriptions_relieve_the_worst_overload_first() -> None:
    """C0 is the most overloaded: it gives t0 to C2, and C1 keeps both t1 tasks (1 move, not 2)."""
    sc = scenario(
        {"t0": 1, "t1": 2, "t2": 3, "audit": 4},
        [
            member("C0", ["t0", "audit"], generation=2, active={"t0": [0]}),
            member("C1", ["t0", "t1", "audit"], generation=2, active={"t1": [0, 1]}),
            member("C2", ["t0", "t1", "t2"], capacity=2, generation=2, active={"t2": [0, 1, 2]}),
        ],
    )
    result = run(sc)
    assert result.stats.moved == 1
    assert active(result, "C2", "t0") == {0}
    assert active(result, "C1", "t1") == {0, 1}


def test_unequal_subscriptions_donate_where_the_taker_has_state() -> None:
    sc = scenario(
        {"a": 8, "b": 4},
        [
            member("m1", ["a"], generation=1, active={"a": range(8)}),
            member("m2", ["a", "b"], capacity=2, state_lag={"a": {2: 0, 5: 30, 6: 50_000}}),
        ],
        changelogs=["a"],
    )
    result = run(sc)
    assert {2, 5, 6} <= active(result, "m2", "a")
    assert len(active(result, "m2", "a")) == 4


def test_validator_rejects_an_unbalanced_assignment() -> None:
    sc = scenario({"a": 4}, [member("m1", "a"), member("m2", "a")])
    good = assign(sc)
    bad = AssignmentResult(
        assignments={
            "m1": MemberAssignment(active={"a": (0, 1, 2)}, standby={}),
            "m2": MemberAssignment(active={"a": (3,)}, standby={}),
        },
        unassigned={},
        warnings=(),
        followup_rebalance=False,
        stats=good.stats,
    )
    codes = {v.code for v in find_violations(sc, bad)}
    assert ViolationCode.UNBALANCED in codes
    with pytest.raises(InvalidAssignmentError) as info:
        from streamjoin.assignor import validate_assignment

        validate_assignment(sc, bad)
    assert ViolationCode.UNBALANCED in info.value.codes


def test_validator_rejects_split_and_duplicate_tasks() -> None:
    sc = scenario({"a": 2, "b": 2}, [member("m1", "ab"), member("m2", "ab")], copartition=["ab"])
    bad = AssignmentResult(
        assignments={
            "m1": MemberAssignment(active={"a": (0,), "b": (1,)}, standby={}),
            "m2": MemberAssignment(active={"a": (0, 1), "b": (0,)}, standby={}),
        },
        unassigned={},
        warnings=(),
        followup_rebalance=False,
        stats=assign(sc).stats,
    )
    codes = {v.code for v in find_violations(sc, bad)}
    assert {ViolationCode.SPLIT_TASK, ViolationCode.DUPLICATE_ACTIVE} <= codes


# --------------------------------------------------------------------- rule 4: stickiness


def test_extra_quota_goes_to_members_that_keep_more() -> None:
    # 7 tasks over 3 members: quotas 3,2,2; the 3 goes to whoever held 3 before
    sc = scenario(
        {"a": 7},
        [
            member("m1", "a", generation=1, active={"a": [0]}),
            member("m2", "a", generation=1, active={"a": [1, 2, 3]}),
            member("m3", "a", generation=1, active={"a": [4, 5, 6]}),
        ],
    )
    result = run(sc)
    assert result.stats.moved == result.stats.min_possible_moves == 1


def test_balanced_previous_assignment_is_a_fixed_point() -> None:
    topics = {"a": 9, "b": 9, "c": 5}
    sc = scenario(
        topics,
        [member(f"m{i}", topics, capacity=1 + i % 2) for i in range(4)],
        copartition=[["a", "b"]],
        changelogs=["c"],
        standby_replicas=1,
    )
    first = run(sc)
    again = run(
        Scenario(
            sc.topics,
            tuple(following(sc, first, 1)),
            sc.copartition,
            sc.changelog_topics,
            sc.config,
        )
    )
    assert again.stats.moved == 0
    assert {m: a.active for m, a in again.assignments.items()} == {
        m: a.active for m, a in first.assignments.items()
    }
    assert {m: a.standby for m, a in again.assignments.items()} == {
        m: a.standby for m, a in first.assignments.items()
    }


def test_restart_with_old_state_keeps_claim() -> None:
    topics = {"a": 6}
    sc = scenario(
        topics,
        [
            member("m1", "a", generation=2, active={"a": [0, 1, 2]}),
            member("m2", "a", generation=2, active={"a": [3, 4, 5]}),
            member("m3", "a"),
        ],
    )
    result = run(sc)
    assert result.stats.moved == 2
    assert len(active(result, "m1", "a") & {0, 1, 2}) == 2


# ------------------------------------------------------------------------ rule 5: state


def test_orphan_goes_to_caught_up_member_with_room() -> None:
    topics = {"src": 4, "log": 4}
    join = ("src", "log")
    sc = scenario(
        topics,
        [
            member("m1", join, generation=1, active={"src": [0], "log": [0]}),
            member(
                "m2",
                join,
                generation=1,
                active={"src": [1], "log": [1]},
                state_lag={"log": {3: 10}},
            ),
            member("m3", join, state_lag={"log": {3: 5}}),
            member("m4", join, state_lag={"log": {3: 99_999}}),
        ],
        copartition=[join],
        changelogs=["log"],
    )
    result = run(sc)
    # partitions 2 and 3 are orphaned; m3 (lag 5) beats m2 (lag 10) and m4 (not caught up)
    assert 3 in active(result, "m3", "src")


def test_orphan_prefers_any_state_over_none() -> None:
    join = ("src", "log")
    sc = scenario(
        {"src": 2, "log": 2},
        [
            member("m1", join),
            member("m2", join, state_lag={"log": {1: 50_000}}),
        ],
        copartition=[join],
        changelogs=["log"],
    )
    result = run(sc)
    assert active(result, "m2", "src") == {1}


def test_extra_quota_goes_to_caught_up_member() -> None:
    sc = scenario(
        {"log": 3},
        [
            member("a", ["log"]),
            member("b", ["log"]),
            member("c", ["log"], state_lag={"log": {0: 0, 1: 0}}),
        ],
        changelogs=["log"],
    )
    result = run(sc)
    assert active(result, "c", "log") == {0, 1} or len(active(result, "c", "log")) == 1
    sc2 = scenario(
        {"log": 4},
        [
            member("a", ["log"]),
            member("b", ["log"]),
            member("c", ["log"], state_lag={"log": {0: 0, 1: 0}}),
        ],
        changelogs=["log"],
    )
    assert active(run(sc2), "c", "log") == {0, 1}


def _shedding(*receivers: MemberState, held: int = 4) -> AssignmentResult:
    """w1 owns tasks 0..held-1 of a stateful join; ``receivers`` join with what they report."""
    join = ("src", "cl")
    owner = member(
        "w1",
        join,
        generation=5,
        active={"src": range(held)},
        state_lag={"cl": dict.fromkeys(range(held), 0)},
    )
    sc = scenario(
        {"src": held, "cl": held},
        [owner, *receivers],
        copartition=[join],
        changelogs=["cl"],
    )
    result = run(sc)
    assert result.stats.moved == result.stats.min_possible_moves
    # same answer whatever the member order
    reversed_members = Scenario(
        sc.topics, sc.members[::-1], sc.copartition, sc.changelog_topics, sc.config
    )
    assert assign(reversed_members) == result
    return result


def test_over_quota_member_sheds_the_tasks_a_restarted_worker_has_state_for() -> None:
    """The restarted worker gets back 1 and 3 (caught up), not 2 and 3 with a restore."""
    w2 = member("w2", ("src", "cl"), state_lag={"cl": {1: 3, 3: 2}})
    result = _shedding(w2)
    assert active(result, "w2", "src") == {1, 3}
    assert active(result, "w1", "src") == {0, 2}
    assert result.stats.moved == 2


def test_shed_task_goes_to_the_receiver_with_the_smallest_lag() -> None:
    join = ("src", "cl")
    w2 = member("w2", join, state_lag={"cl": {1: 40, 4: 10}})
    w3 = member("w3", join, state_lag={"cl": {1: 5, 2: 0}})
    result = _shedding(w2, w3, held=6)
    # both are caught up for 1; w3's lag is smaller
    assert active(result, "w3", "src") == {1, 2}
    assert 4 in active(result, "w2", "src")
    assert result.stats.moved == 4


def test_shed_task_goes_to_a_lagging_state_holder_before_a_stateless_member() -> None:
    join = ("src", "cl")
    w2 = member("w2", join, state_lag={"cl": {3: 50_000}})  # has state, not caught up
    w3 = member("w3", join, state_lag={"cl": {0: 0}})
    result = _shedding(w2, w3, held=6)
    assert 3 in active(result, "w2", "src")
    assert 0 in active(result, "w3", "src")


def test_several_over_and_under_quota_members_are_matched_by_state() -> None:
    join = ("src", "cl")
    lag = {"cl": dict.fromkeys(range(8), 0)}
    sc = scenario(
        {"src": 8, "cl": 8},
        [
            member("w1", join, generation=1, active={"src": range(4)}, state_lag=lag),
            member("w2", join, generation=1, active={"src": range(4, 8)}, state_lag=lag),
            member("w3", join, state_lag={"cl": {5: 0, 6: 1}}),
            member("w4", join, state_lag={"cl": {1: 0, 2: 7, 7: 99_999}}),
        ],
        copartition=[join],
        changelogs=["cl"],
    )
    result = run(sc)
    assert active(result, "w3", "src") == {5, 6}
    assert active(result, "w4", "src") == {1, 2}
    assert result.stats.moved == result.stats.min_possible_moves == 4


def test_standby_promoted_when_active_owner_leaves() -> None:
    join = ("src", "log")
    sc = scenario(
        {"src": 4, "log": 4},
        [
            member(
                "m1",
                join,
                generation=1,
                active={t: [0] for t in join},
                standby={"log": [2]},
                state_lag={"log": {2: 0}},
            ),
            member(
                "m2",
                join,
                generation=1,
                active={t: [1] for t in join},
                standby={"log": [0]},
                state_lag={"log": {0: 0}},
            ),
        ],
        copartition=[join],
        changelogs=["log"],
        standby_replicas=1,
    )
    result = run(sc)  # the owner of 2 and 3 left
    assert active(result, "m1", "src") == {0, 2}
    assert active(result, "m2", "src") == {1, 3}
    assert result.stats.extra["standby_promotions"] == 1


# ------------------------------------------------------------------- rule 5: HA mode


def ha_scenario(high_availability: bool) -> Scenario:
    join = ("src", "log")
    return scenario(
        {"src": 4, "log": 4},
        [
            member(
                "m1",
                join,
                generation=1,
                active={t: [0, 1, 2, 3] for t in join},
                state_lag={"log": {0: 0, 1: 0, 2: 0, 3: 0}},
            ),
            member("m2", join),
        ],
        copartition=[join],
        changelogs=["log"],
        high_availability=high_availability,
    )


def test_high_availability_is_off_by_default() -> None:
    result = run(ha_scenario(False))
    assert not result.followup_rebalance
    assert len(active(result, "m2", "src")) == 2


def test_high_availability_keeps_tasks_while_warming_up() -> None:
    sc = ha_scenario(True)
    result = run(sc)
    assert result.followup_rebalance
    assert active(result, "m1", "src") == {0, 1, 2, 3}
    assert len(result.assignments["m2"].warmup["log"]) == 2
    assert result.stats.extra["held_for_warmup"] == 2
    assert result.stats.moved == 0


# -------------------------------------------------------------------------- rule 6: standbys


def test_standbys_distinct_not_on_active_changelog_only() -> None:
    join = ("src", "log")
    sc = scenario(
        {"src": 6, "log": 6},
        [member(f"m{i}", join) for i in range(4)],
        copartition=[join],
        changelogs=["log"],
        standby_replicas=2,
    )
    result = run(sc)
    assert result.stats.standby_tasks == 12
    for mid, a in result.assignments.items():
        assert set(a.standby) <= {"log"}
        assert not standby(result, mid, "log") & active(result, mid, "log")
    assert sorted(len(standby(result, m, "log")) for m in result.assignments) == [3, 3, 3, 3]


def test_standbys_capped_at_eligible_minus_one() -> None:
    sc = scenario(
        {"log": 3},
        [member("a", ["log"]), member("b", ["log"])],
        changelogs=["log"],
        standby_replicas=5,
    )
    assert run(sc).stats.standby_tasks == 3


def test_stateless_group_has_no_standbys() -> None:
    sc = scenario({"a": 3}, [member("x", "a"), member("y", "a")], standby_replicas=1)
    assert run(sc).stats.standby_tasks == 0


def test_standbys_spread_over_zones() -> None:
    zones = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "c1": "c"}
    sc = scenario(
        {"log": 10},
        [member(m, ["log"], tags={"zone": z}) for m, z in zones.items()],
        changelogs=["log"],
        standby_replicas=2,
    )
    result = run(sc)
    for p in range(10):
        holders = [m for m in zones if p in active(result, m, "log") | standby(result, m, "log")]
        assert len({zones[m] for m in holders}) == 3


def test_standbys_stick_to_previous_holders() -> None:
    sc = scenario(
        {"log": 6},
        [
            member(
                "x", ["log"], generation=1, active={"log": [0, 1, 2]}, standby={"log": [3, 4, 5]}
            ),
            member("y", ["log"], generation=1, active={"log": [3, 4, 5]}, standby={"log": [0, 1]}),
            member("z", ["log"], standby={"log": [2]}),
        ],
        changelogs=["log"],
        standby_replicas=1,
    )
    result = run(sc)
    # z now runs 2 and 5, so it must host two of the others' standbys, without state for
    # them; x and y host theirs where their state is (previous standbys, or the task they
    # gave away), but with x's standbys spread over y and z (and y's over x and z), y keeps
    # only one of 0 and 1 and x only one of 3 and 4
    had_state = {"x": {0, 1, 2, 3, 4, 5}, "y": {0, 1, 3, 4, 5}, "z": {2}}
    assert sum(len(standby(result, m, "log") & had_state[m]) for m in had_state) == 4
    assert len(standby(result, "y", "log") & {0, 1}) == 1
    assert len(standby(result, "x", "log") & {3, 4}) == 1


def test_previous_active_becomes_standby_when_moved() -> None:
    sc = scenario(
        {"log": 2},
        [member("x", ["log"], generation=1, active={"log": [0, 1]}), member("y", ["log"])],
        changelogs=["log"],
        standby_replicas=1,
    )
    result = run(sc)
    moved = active(result, "y", "log")
    assert moved and moved <= standby(result, "x", "log")
