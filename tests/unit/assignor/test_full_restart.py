"""Rule 2 with state: a returning owner with caught-up state gets its task back from a
newer owner that is not caught up (a full restart must not lose the assignment).

The story: three workers with one standby each stop at generation 5. w0 comes back
first and alone, so it gets every task at generation 6 and starts restoring the ones it
holds no state for; then w1 joins, then w2. Each reports, from its membership file,
what it owned at generation 5, and, from its stores, their lags.
"""

from __future__ import annotations

from assignor_support import member, run, scenario

from streamjoin.assignor import AssignmentResult, MemberState, Scenario
from streamjoin.assignor.conflicts import TIED, resolve_claims
from streamjoin.assignor.grouping import build_grouping

TOPICS = {"src": 6, "log": 6}
GROUP = [["src", "log"]]
#: before the restart: actives and (spread) standbys at generation 5
BEFORE = {"w0": ([0, 3], [1, 5]), "w1": ([1, 4], [2, 3]), "w2": ([2, 5], [0, 4])}
RESTORING = 50_000  # lag of a store being rebuilt: above acceptable_recovery_lag


def returning(mid: str) -> MemberState:
    """A worker back after the restart: its old claims at generation 5, caught up."""
    active, standby = BEFORE[mid]
    return member(
        mid,
        TOPICS,
        generation=5,
        active={"src": active},
        standby={"log": standby},
        state_lag={"log": dict.fromkeys(active + standby, 0)},
    )


def following(
    sc: Scenario, result: AssignmentResult, generation: int, restored: bool
) -> list[MemberState]:
    """Members one rebalance later: what they were given, at ``generation``. Stores they
    held before stay caught up; new ones are still restoring unless ``restored``."""
    out = []
    for m in sc.members:
        got = result.assignments[m.member_id]
        held = set(m.state_lag.get("log", {}))
        given = {*got.active.get("log", ()), *got.standby.get("log", ())}
        lag = {p: 0 if p in held or restored else RESTORING for p in given | held}
        out.append(
            member(
                m.member_id,
                TOPICS,
                generation=generation,
                active={"src": got.active.get("src", ())},
                standby=got.standby,
                state_lag={"log": lag},
            )
        )
    return out


def plan(members: list[MemberState]) -> tuple[Scenario, AssignmentResult]:
    sc = scenario(TOPICS, members, copartition=GROUP, changelogs=["log"], standby_replicas=1)
    return sc, run(sc)


def actives(result: AssignmentResult) -> dict[str, set[int]]:
    return {m: set(a.active.get("src", ())) for m, a in result.assignments.items()}


def restart_one_by_one(restored: bool) -> AssignmentResult:
    sc, result = plan([returning("w0")])
    assert actives(result) == {"w0": set(range(6))}  # alone: everything, at generation 6
    sc, result = plan([*following(sc, result, 6, restored), returning("w1")])
    if not restored:
        assert {1, 4} <= actives(result)["w1"]  # w0 was still restoring them
    sc, result = plan([*following(sc, result, 7, restored), returning("w2")])
    return result


def test_returning_owners_get_their_tasks_back_from_a_restoring_first_worker() -> None:
    result = restart_one_by_one(restored=False)
    assert actives(result) == {mid: set(a) for mid, (a, _) in BEFORE.items()}


def test_returning_owners_get_their_tasks_back_when_the_first_worker_caught_up() -> None:
    """w0 finished restoring before the others came back: its newer claims are caught up
    too and win the conflicts, but the tasks it sheds go back to their returning owners."""
    result = restart_one_by_one(restored=True)
    assert actives(result) == {mid: set(a) for mid, (a, _) in BEFORE.items()}


def winner_of_task_0(*members: MemberState) -> str | None:
    """Whose claim on task 0 wins rule 2 (None: tied)."""
    sc = scenario(TOPICS, members, copartition=GROUP, changelogs=["log"])
    ordered = sorted(members, key=lambda m: m.member_id)
    grouping = build_grouping(sc.topics, sc.copartition, sc.changelog_topics, ordered)
    raw = resolve_claims(grouping, ordered, sc.config.acceptable_recovery_lag).raw[0][0]
    return None if raw == TIED else ordered[raw].member_id


def claimant(mid: str, generation: int, lag: int | None) -> MemberState:
    return member(
        mid,
        TOPICS,
        generation=generation,
        active={"src": [0]},
        state_lag={"log": {0: lag}} if lag is not None else None,
    )


def test_a_caught_up_claim_beats_a_newer_one_that_is_not() -> None:
    assert winner_of_task_0(claimant("old", 5, 0), claimant("new", 6, RESTORING)) == "old"
    # within acceptable_recovery_lag (10,000) counts as caught up; no lag is no state
    assert winner_of_task_0(claimant("old", 5, 10_000), claimant("new", 6, None)) == "old"


def test_equally_caught_up_claims_go_by_generation() -> None:
    assert winner_of_task_0(claimant("old", 5, 0), claimant("new", 6, 0)) == "new"
    assert winner_of_task_0(claimant("old", 5, RESTORING), claimant("new", 6, None)) == "new"
    assert winner_of_task_0(claimant("a", 6, 0), claimant("b", 6, 7)) is None


def test_stateless_groups_go_by_generation_alone() -> None:
    sc = scenario(
        {"t": 2},
        [
            member("old", ["t"], generation=5, active={"t": [0]}),
            member("new", ["t"], generation=6, active={"t": [0]}),
        ],
    )
    assert 0 in run(sc).assignments["new"].active["t"]


def test_workers_back_together_keep_their_tasks() -> None:
    """All back in one rebalance (a realistic group.initial.rebalance.delay.ms), or
    restarted with their instance ids: their old claims are uncontested."""
    result = plan([returning(mid) for mid in BEFORE])[1]
    assert actives(result) == {mid: set(a) for mid, (a, _) in BEFORE.items()}
    assert result.stats.moved == 0
