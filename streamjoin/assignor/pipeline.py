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

from streamjoin.assignor.conflicts import Claims, resolve_claims
from streamjoin.assignor.errors import InvalidScenarioError
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
    assignments = _expand(grouping, members, plan, standbys)
    stats = _stats(grouping, members, claims, plan, standbys, held)
    return AssignmentResult(
        assignments=assignments,
        unassigned=grouping.unassigned,
        warnings=grouping.warnings,
        followup_rebalance=held > 0,
        stats=stats,
    )


def _expand(
    grouping: Grouping,
    members: Sequence[MemberState],
    plan: ActivePlan,
    standbys: Sequence[list[list[int]] | None],
) -> dict[str, MemberAssignment]:
    active: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    standby: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    warmup: list[dict[str, tuple[int, ...]]] = [{} for _ in members]
    for group in grouping.groups:
        if not grouping.eligible[group.index] or not group.tasks:
            continue
        per_member: dict[int, list[int]] = {}
        for p, o in enumerate(plan.owners[group.index]):
            if o != UNASSIGNED:
                per_member.setdefault(o, []).append(p)
        for i, ps in per_member.items():
            parts = tuple(ps)
            target = active[i]
            for topic in group.topics:
                target[topic] = parts
        chosen = standbys[group.index]
        if chosen is not None:
            per_member = {}
            for p, holders in enumerate(chosen):
                for i in holders:
                    per_member.setdefault(i, []).append(p)
            for i, ps in per_member.items():
                parts = tuple(sorted(ps))
                for topic in group.changelogs:
                    standby[i][topic] = parts
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
        orphaned += prev.count(UNASSIGNED)
        moved += sum(1 for a, b in zip(prev, new, strict=True) if a != b and a != UNASSIGNED)
        chosen = standbys[g]
        if chosen is not None:
            standby_tasks += sum(len(c) for c in chosen)
        if not group.changelogs:
            continue
        for i in grouping.eligible[g]:
            for p in claimed_standbys(members[i], group):
                if new[p] == i:
                    promoted += 1
                elif chosen is not None and i in chosen[p]:
                    kept += 1
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
