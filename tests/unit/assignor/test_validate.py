"""The validator: every rule it checks is reported on a broken result, and its shortcuts
(quick looks over standby tuples, the bucketed movable-standby search) agree with the
plain per-task definitions they replace."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import pytest
from assignor_support import member, scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.assignor import (
    AssignmentResult,
    MemberAssignment,
    Scenario,
    ViolationCode,
    assign,
    find_violations,
)
from streamjoin.assignor.standby import TagRule, standby_move_allowed
from streamjoin.assignor.validate import _movable_standby

JOIN = ("clicks", "impressions", "joins-changelog")
ZONES = {"m1": "a", "m2": "b", "m3": "c", "m4": "a"}


def join_scenario(**config: int) -> Scenario:
    """Four members over a 6-partition join with its changelog, one standby, three zones."""
    return scenario(
        {t: 6 for t in JOIN},
        [member(m, JOIN, tags={"zone": z}) for m, z in ZONES.items()],
        copartition=[JOIN],
        changelogs=["joins-changelog"],
        standby_replicas=config.get("standby_replicas", 1),
    )


Parts = dict[str, dict[str, tuple[int, ...]]]


def edited(
    result: AssignmentResult,
    edit: Callable[[Parts, Parts], None],
    **changes: object,
) -> AssignmentResult:
    """``result`` with its active and standby maps edited in place by ``edit``."""
    active = {m: dict(a.active) for m, a in result.assignments.items()}
    standby = {m: dict(a.standby) for m, a in result.assignments.items()}
    edit(active, standby)
    out = replace(
        result,
        assignments={m: MemberAssignment(active[m], standby.get(m, {})) for m in active},
    )
    return replace(out, **changes) if changes else out


def owner_of(result: AssignmentResult, p: int) -> str:
    return next(m for m, a in result.assignments.items() if p in a.active.get(JOIN[0], ()))


def standby_of(result: AssignmentResult, p: int) -> str:
    return next(m for m, a in result.assignments.items() if p in a.standby.get(JOIN[2], ()))


def set_task(parts: Parts, mid: str, p: int, present: bool, topics: Sequence[str]) -> None:
    for t in topics:
        now = set(parts[mid].get(t, ()))
        now = now | {p} if present else now - {p}
        parts[mid][t] = tuple(sorted(now))


def codes(sc: Scenario, result: AssignmentResult) -> set[ViolationCode]:
    return {v.code for v in find_violations(sc, result)}


def test_a_correct_result_has_no_violation() -> None:
    sc = join_scenario()
    assert find_violations(sc, assign(sc)) == []


def test_each_rule_is_reported() -> None:
    sc = join_scenario()
    good = assign(sc)
    a0, s0 = owner_of(good, 0), standby_of(good, 0)
    other = next(m for m in ZONES if m not in (a0, s0))

    def ghost(active: Parts, standby: Parts) -> None:
        active["ghost"] = {}

    def drop_member(active: Parts, standby: Parts) -> None:
        del active["m4"]

    def out_of_range(active: Parts, standby: Parts) -> None:
        active[a0]["clicks"] = (*active[a0]["clicks"], 9)

    def unknown_topic(active: Parts, standby: Parts) -> None:
        active[a0]["nope"] = (0,)

    def duplicate(active: Parts, standby: Parts) -> None:
        set_task(active, other, 0, True, JOIN)

    def split(active: Parts, standby: Parts) -> None:
        set_task(active, a0, 0, False, ["clicks"])
        set_task(active, other, 0, True, ["clicks"])

    def orphan(active: Parts, standby: Parts) -> None:
        set_task(active, a0, 0, False, JOIN)

    def standby_of_a_source(active: Parts, standby: Parts) -> None:
        standby[other]["clicks"] = (0,)

    def standby_on_active(active: Parts, standby: Parts) -> None:
        set_task(standby, s0, 0, False, JOIN[2:])
        set_task(standby, a0, 0, True, JOIN[2:])

    def no_standby(active: Parts, standby: Parts) -> None:
        set_task(standby, s0, 0, False, JOIN[2:])

    cases: list[tuple[Callable[[Parts, Parts], None], ViolationCode]] = [
        (ghost, ViolationCode.UNKNOWN_MEMBER),
        (drop_member, ViolationCode.MISSING_MEMBER),
        (out_of_range, ViolationCode.UNKNOWN_PARTITION),
        (unknown_topic, ViolationCode.UNKNOWN_PARTITION),
        (duplicate, ViolationCode.DUPLICATE_ACTIVE),
        (split, ViolationCode.SPLIT_TASK),
        (orphan, ViolationCode.MISSING_ACTIVE),
        (standby_of_a_source, ViolationCode.STANDBY_NOT_CHANGELOG),
        (standby_on_active, ViolationCode.STANDBY_ON_ACTIVE),
        (no_standby, ViolationCode.STANDBY_COUNT),
    ]
    for edit, code in cases:
        assert code in codes(sc, edited(good, edit)), (edit.__name__, code)
    wrong_unassigned = replace(good, unassigned={"clicks": (1,)})
    assert ViolationCode.WRONG_UNASSIGNED in codes(sc, wrong_unassigned)
    wrong_stats = replace(good, stats=replace(good.stats, tasks=good.stats.tasks + 1))
    assert ViolationCode.WRONG_STATS in codes(sc, wrong_stats)


def test_an_unsubscribed_topic_and_an_ineligible_owner_are_reported() -> None:
    sc = scenario(
        {"a": 2, "b": 2},
        [member("m1", ["a"]), member("m2", ["a", "b"])],
        copartition=[["a", "b"]],
    )
    result = AssignmentResult(
        assignments={
            "m1": MemberAssignment({"a": (0, 1), "b": (0, 1)}, {}),
            "m2": MemberAssignment({}, {}),
        },
        unassigned={},
        warnings=(),
        followup_rebalance=False,
        stats=assign(sc).stats,
    )
    found = find_violations(sc, result)
    assert [v.code for v in found][:2] == [ViolationCode.NOT_SUBSCRIBED] * 2
    assert "'m1' active has unsubscribed topic 'b'" in found[0].message
    assert "not eligible for {a, b}" in found[1].message


def test_moving_more_than_needed_is_not_minimal() -> None:
    sc = scenario(
        {"a": 4},
        [
            member("m1", "a", generation=1, active={"a": [0, 1]}),
            member("m2", "a", generation=1, active={"a": [2, 3]}),
        ],
    )
    swapped = edited(
        assign(sc),
        lambda active, standby: active.update(m1={"a": (2, 3)}, m2={"a": (0, 1)}),
    )
    swapped = replace(swapped, stats=replace(swapped.stats, moved=4))
    assert codes(sc, swapped) == {ViolationCode.NOT_MINIMAL}


def test_a_standby_in_its_actives_zone_is_reported_when_another_zone_is_free() -> None:
    sc = join_scenario()
    good = assign(sc)
    a0, s0 = owner_of(good, 0), standby_of(good, 0)
    same_zone = next(m for m, z in ZONES.items() if z == ZONES[a0] and m != a0)

    def into_the_actives_zone(active: Parts, standby: Parts) -> None:
        set_task(standby, s0, 0, False, JOIN[2:])
        set_task(standby, same_zone, 0, True, JOIN[2:])

    assert ViolationCode.STANDBY_TAG_SPREAD in codes(sc, edited(good, into_the_actives_zone))


def test_standbys_piled_on_one_member_are_unbalanced() -> None:
    sc = scenario({"c": 6}, [member(m, "c") for m in ("m1", "m2", "m3")], changelogs=["c"])
    sc = replace(sc, config=replace(sc.config, standby_replicas=1))
    good = assign(sc)

    def pile(active: Parts, standby: Parts) -> None:
        for mid in standby:
            standby[mid] = {}
        for p in range(6):
            holder = next(m for m in ("m1", "m2", "m3") if p not in active[m].get("c", ()))
            set_task(standby, holder, p, True, ["c"])

    assert codes(sc, edited(good, pile)) == {ViolationCode.STANDBY_UNBALANCED}


def test_a_group_left_without_any_active_is_reported_not_a_crash() -> None:
    sc = join_scenario()
    nothing = edited(assign(sc), lambda active, standby: [a.clear() for a in active.values()])
    assert ViolationCode.MISSING_ACTIVE in codes(sc, nothing)


def test_unbalanced_standbys_of_tasks_without_an_active_are_not_a_crash() -> None:
    sc = join_scenario()
    good = assign(sc)

    def wreck(active: Parts, standby: Parts) -> None:
        for a in active.values():
            a.clear()
        for mid in standby:
            standby[mid] = {}
        standby["m1"] = {JOIN[2]: tuple(range(6))}  # 6 standbys on m1, none elsewhere

    # tag spread is undefined without an active: the move search skips those tasks
    assert ViolationCode.MISSING_ACTIVE in codes(sc, edited(good, wreck))


# --------------------------------------------------------------- the movable-standby search


def brute_force_movable(
    eligible: Sequence[int],
    loads: Mapping[int, int],
    chosen: Sequence[Sequence[int]],
    active: Sequence[int],
    tags: TagRule,
) -> tuple[int, int, int] | None:
    """The definition: every pair of members, every task, in member/member/task order."""
    for o in eligible:
        for m in eligible:
            if loads[o] < loads[m] + 2:
                continue
            for p, holders in enumerate(chosen):
                if o not in holders or (active[p] < 0 and tags.active):
                    continue
                if standby_move_allowed(p, o, m, active, chosen, tags):
                    return o, m, p
    return None


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_the_bucketed_search_finds_the_same_first_move_as_every_pair(data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 7), label="members")
    tasks = data.draw(st.integers(1, 8), label="tasks")
    k = data.draw(st.integers(1, n - 1), label="replicas")
    keys = data.draw(st.sampled_from([(), ("zone",), ("zone", "rack")]), label="keys")
    values = st.sampled_from(["a", "b", "c"])
    members = [
        member(f"m{i}", "c", tags={key: data.draw(values) for key in keys}) for i in range(n)
    ]
    eligible = list(range(n))
    active = [data.draw(st.integers(-1, n - 1)) for _ in range(tasks)]
    chosen = [
        sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=k + 1))) for _ in range(tasks)
    ]
    loads = {i: sum(i in h for h in chosen) for i in eligible}
    if max(loads.values()) - min(loads.values()) < 2:
        return
    tags = TagRule(members, eligible, k)
    parts = [(i, tuple(p for p, h in enumerate(chosen) if i in h)) for i in eligible]
    parts = [(i, ps) for i, ps in parts if ps]
    expected = brute_force_movable(eligible, loads, chosen, active, tags)
    assert _movable_standby(eligible, loads, parts, chosen, active, tags) == expected


@pytest.mark.parametrize("replicas", [1, 2])
def test_mutated_results_report_exactly_like_a_fresh_full_check(replicas: int) -> None:
    """Moving single standbys around: the quick looks never hide a violation."""
    sc = join_scenario(standby_replicas=replicas)
    good = assign(sc)
    mids = sorted(ZONES)
    for src in mids:
        for dst in mids:
            for p in range(6):
                if p not in good.assignments[src].standby.get(JOIN[2], ()):
                    continue

                def move(
                    active: Parts, standby: Parts, src: str = src, dst: str = dst, p: int = p
                ) -> None:
                    set_task(standby, src, p, False, JOIN[2:])
                    set_task(standby, dst, p, True, JOIN[2:])

                broken = edited(good, move)
                found = codes(sc, broken)
                active0 = owner_of(good, p)
                if src == dst:
                    assert found == set()
                    continue
                holders = [m for m in mids if p in broken.assignments[m].standby.get(JOIN[2], ())]
                if dst == active0:
                    assert ViolationCode.STANDBY_ON_ACTIVE in found
                if len(holders) != replicas:
                    assert ViolationCode.STANDBY_COUNT in found
                elif replicas == 1 and dst != active0 and ZONES[dst] == ZONES[active0]:
                    assert ViolationCode.STANDBY_TAG_SPREAD in found
