"""``assign(scenario)``: the assignor as one pure function, phase by phase.

grouping (tasks, eligibility) -> claims (rule 2) -> actives (rules 3-5) ->
standbys (rule 6) -> expansion to topic partitions + stats. Everything works on
integer task numbers per group and member indices in member-id order, so the
output never depends on the order of members or mapping keys; topic partitions
appear only at the end, where each member's partition tuple is built once per
group and shared by the group's topics.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from operator import ne

from streamjoin.assignor.conflicts import Claims, resolve_claims
from streamjoin.assignor.grouping import Grouping, build_grouping
from streamjoin.assignor.model import (
    AssignmentResult,
    AssignmentStats,
    MemberAssignment,
    MemberState,
    Scenario,
)
from streamjoin.assignor.standby import assign_standbys, claimed_standbys
from streamjoin.assignor.sticky import UNASSIGNED, ActivePlan, assign_actives
from streamjoin.errors import InvalidScenarioError


def sorted_members(scenario: Scenario) -> list[MemberState]:
    """Members in id order; duplicate ids are an error, not a silent overwrite."""
    members = sorted(scenario.members, key=lambda m: m.member_id)
    for a, b in pairwise(members):
        if a.member_id == b.member_id:
            raise InvalidScenarioError(f"duplicate member id {a.member_id!r}")
    return members


def assign(scenario: Scenario) -> AssignmentResult:
    """Assign every task of ``scenario`` (see ``docs/assignor.md`` for the rules)."""
    members = sorted_members(scenario)
    grouping = build_grouping(
        scenario.topics, scenario.copartition, scenario.changelog_topics, members
    )
    claims = resolve_claims(grouping, members, scenario.config.acceptable_recovery_lag)
    plan = assign_actives(grouping, members, claims, scenario.config)
    standbys = assign_standbys(grouping, members, claims, plan.owners, scenario.config)
    held = len(plan.warmups)
    for (g, p), target in list(plan.warmups.items()):
        chosen = standbys[g]
        if chosen is not None and target in chosen[p]:
            del plan.warmups[(g, p)]  # its standby there already restores that state
    tasks = _tasks_by_member(grouping, len(members), plan, standbys)
    assignments = _expand(grouping, members, plan, tasks)
    stats = _stats(grouping, members, claims, plan, standbys, tasks, held)
    return AssignmentResult(
        assignments=assignments,
        unassigned=grouping.unassigned,
        warnings=grouping.warnings,
        followup_rebalance=held > 0,
        stats=stats,
    )


#: per group (None where nothing is assigned): each member's active tasks and standby
#: tasks (None without standbys), ascending
_Tasks = list[tuple[list[tuple[int, ...]], list[tuple[int, ...]] | None] | None]


def _tasks_by_member(
    grouping: Grouping,
    n_members: int,
    plan: ActivePlan,
    standbys: Sequence[list[list[int]] | None],
) -> _Tasks:
    """Each member's tasks per group, built once for the output and the stats."""
    out: _Tasks = []
    for group in grouping.groups:
        if not grouping.eligible[group.index] or not group.tasks:
            out.append(None)
            continue
        # one list per member, in task order, plus a last one that collects UNASSIGNED (-1)
        owned: list[list[int]] = [[] for _ in range(n_members + 1)]
        for p, o in enumerate(plan.owners[group.index]):
            owned[o].append(p)
        hosted: list[tuple[int, ...]] | None = None
        chosen = standbys[group.index]
        if chosen is not None:
            by_holder: list[list[int]] = [[] for _ in range(n_members)]
            for p, holders in enumerate(chosen):
                for i in holders:
                    by_holder[i].append(p)
            hosted = list(map(tuple, by_holder))
        out.append((list(map(tuple, owned[:-1])), hosted))
    return out


def _expand(
    grouping: Grouping,
    members: Sequence[MemberState],
    plan: ActivePlan,
    tasks: _Tasks,
) -> dict[str, MemberAssignment]:
    active: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    standby: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    warmup: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    for group, layout in zip(grouping.groups, tasks, strict=True):
        if layout is None:
            continue
        owned, hosted = layout
        for i, parts in enumerate(owned):
            if parts:
                target = active[i]
                for topic in group.topics:
                    target[topic] = parts
        for i, parts in enumerate(hosted or ()):
            if parts:
                target = standby[i]
                for topic in group.changelogs:
                    target[topic] = parts
    for (g, p), i in sorted(plan.warmups.items()):
        for topic in grouping.groups[g].changelogs:
            warmup[i][topic] = (*warmup[i].get(topic, ()), p)
    return {
        m.member_id: MemberAssignment(
            active=dict(sorted(active[i].items())),
            standby=dict(sorted(standby[i].items())),
            warmup=dict(sorted(warmup[i].items())),
        )
        for i, m in enumerate(members)
    }


def _stats(
    grouping: Grouping,
    members: Sequence[MemberState],
    claims: Claims,
    plan: ActivePlan,
    standbys: Sequence[list[list[int]] | None],
    tasks: _Tasks,
    held: int,
) -> AssignmentStats:
    moved = orphaned = 0
    standby_tasks = kept = promoted = 0
    for group in grouping.groups:
        g = group.index
        if not grouping.eligible[g] or not group.tasks:
            continue
        prev = claims.owners[g]
        new = plan.owners[g]
        unclaimed = prev.count(UNASSIGNED)
        orphaned += unclaimed
        # counted at C speed: tasks whose owner changed, less orphans (they did not move)
        moved += sum(map(ne, prev, new)) - unclaimed
        if unclaimed and UNASSIGNED in new:
            moved += sum(1 for a, b in zip(prev, new, strict=True) if a == b == UNASSIGNED)
        chosen = standbys[g]
        if chosen is not None:
            standby_tasks += sum(map(len, chosen))
        layout = tasks[g]
        if not group.changelogs or layout is None:
            continue
        owned, hosted = layout
        for i in grouping.eligible[g]:
            claimed = claimed_standbys(members[i], group)
            if not claimed:
                continue
            # set operations on the member's own tasks (no lookups all over the task lists)
            promoted += len(claimed.intersection(owned[i]))
            if hosted is not None:
                kept += len(claimed.intersection(hosted[i]).difference(owned[i]))
    extra = {
        "orphaned": orphaned,
        "contested": claims.contested,
        "conflict_ties": claims.ties,
        "ineligible_owner": claims.ineligible,
        "standby_kept": kept,
        "standby_promotions": promoted,
        "held_for_warmup": held,
    }
    return AssignmentStats(
        tasks=grouping.total_tasks,
        moved=moved,
        min_possible_moves=plan.min_possible_moves,
        standby_tasks=standby_tasks,
        extra=extra,
    )
