"""A safe assignment for when the assignor's own result is unsafe (pure).

The runtime validates every assignment it computes. If a result breaks a rule
of :data:`~streamjoin.errors.SAFETY_CODES` (a task with two actives or
none, a split join, a partition its member cannot consume, a misplaced
standby), the runtime sends this instead. Failing the rebalance would not help:
the assignor is deterministic, so every leader would compute the same result
from the same input and the group would never get an assignment.

Deliberately simple, so that it is right by construction rather than good:

* each task stays with its conflict-resolved previous owner (rule 2), so no
  state moves;
* an orphaned task goes to the eligible member holding the fewest tasks (ties:
  lowest member id);
* a task's standbys go to the members after its active in the group's eligible
  list (in member-id order, wrapping around), as many as rule 6 asks for.

It ignores capacity, lags and tags and is neither balanced nor minimal beyond
that; the next rebalance runs the assignor again, on this as previous state.
"""

from __future__ import annotations

import heapq

from streamjoin.assignor.conflicts import resolve_claims
from streamjoin.assignor.grouping import build_grouping
from streamjoin.assignor.model import (
    AssignmentResult,
    AssignmentStats,
    MemberAssignment,
    Scenario,
)
from streamjoin.assignor.pipeline import sorted_members
from streamjoin.assignor.standby import standby_count


def fallback_assignment(scenario: Scenario) -> AssignmentResult:
    """Previous owners kept, orphans to the least loaded, standbys after the active."""
    members = sorted_members(scenario)
    grouping = build_grouping(
        scenario.topics, scenario.copartition, scenario.changelog_topics, members
    )
    claims = resolve_claims(grouping, members, scenario.config.acceptable_recovery_lag)
    count = [0] * len(members)
    owners: list[list[int]] = []
    for group, eligible in zip(grouping.groups, grouping.eligible, strict=True):
        own = list(claims.owners[group.index]) if eligible else [-1] * group.tasks
        for o in own:
            if o >= 0:
                count[o] += 1
        owners.append(own)
    orphaned = 0
    for group, eligible in zip(grouping.groups, grouping.eligible, strict=True):
        own = owners[group.index]
        if not eligible or -1 not in own:
            continue
        least = [(count[i], i) for i in eligible]
        heapq.heapify(least)
        for p, o in enumerate(own):
            if o < 0:
                n, i = heapq.heappop(least)
                own[p] = i
                count[i] = n + 1
                heapq.heappush(least, (n + 1, i))
                orphaned += 1

    active: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    standby: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    standby_tasks = 0
    for group, eligible in zip(grouping.groups, grouping.eligible, strict=True):
        if not eligible or not group.tasks:
            continue
        own = owners[group.index]
        tasks_of: dict[int, list[int]] = {}
        for p, o in enumerate(own):
            tasks_of.setdefault(o, []).append(p)
        for i, ps in tasks_of.items():
            for topic in group.topics:
                active[i][topic] = tuple(ps)
        k = standby_count(scenario.config, len(eligible)) if group.changelogs else 0
        if not k:
            continue
        position = {m: j for j, m in enumerate(eligible)}
        held: dict[int, list[int]] = {}
        for p, o in enumerate(own):
            at = position[o]
            for step in range(1, k + 1):
                held.setdefault(eligible[(at + step) % len(eligible)], []).append(p)
        standby_tasks += k * group.tasks
        for i, ps in held.items():
            for topic in group.changelogs:
                standby[i][topic] = tuple(sorted(ps))
    return AssignmentResult(
        assignments={
            m.member_id: MemberAssignment(
                active=dict(sorted(active[i].items())), standby=dict(sorted(standby[i].items()))
            )
            for i, m in enumerate(members)
        },
        unassigned=grouping.unassigned,
        warnings=grouping.warnings,
        followup_rebalance=False,
        stats=AssignmentStats(
            tasks=grouping.total_tasks,
            moved=0,
            min_possible_moves=None,
            standby_tasks=standby_tasks,
            extra={"orphaned": orphaned},
        ),
    )
