"""Baseline assignors the benchmark compares ours against (pure, deterministic, not shipped).

Both are made just co-partition-aware enough to be comparable with ours: they
assign *tasks* (partition p of every topic of a co-partition group together),
not individual topic partitions, and give each task of a group with changelog
topics one standby on the next member of the sorted list (a ring), so that they
produce the same kind of output as ``streamjoin.assignor.assign``.

* ``range_assign`` is Kafka's RangeAssignor applied to tasks: members sorted
  by id, each group's tasks cut into contiguous chunks, the first
  ``tasks % members`` chunks one larger. With equal partition counts and
  subscriptions this *is* Kafka's range assignment, which co-partitions by
  construction.
* ``round_robin_assign`` deals tasks to the sorted members in turn. (Kafka's
  RoundRobinAssignor deals individual topic partitions and so breaks
  co-partitioning; dealing tasks is the fair comparison.)

Neither looks at previous ownership, capacity, lags or tags: that is the point
of the comparison. They honour ``standby_replicas`` only as "0 or at least 1".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from streamjoin.assignor.model import (
    AssignmentResult,
    AssignmentStats,
    MemberAssignment,
    Scenario,
)

#: (number of tasks, number of eligible members) -> owner position of each task
Placement = Callable[[int, int], list[int]]


def task_groups(scenario: Scenario) -> list[tuple[tuple[str, ...], int]]:
    """Co-partition groups (declared groups merged where they overlap, other topics alone)."""
    groups: list[set[str]] = []
    for declared in scenario.copartition:
        merged = set(declared)
        for existing in [g for g in groups if g & merged]:
            merged |= existing
            groups.remove(existing)
        groups.append(merged)
    grouped = set().union(*groups) if groups else set()
    groups.extend({t} for t in scenario.topics if t not in grouped)
    return sorted((tuple(sorted(g)), min(scenario.topics[t] for t in g)) for g in groups if g)


def _range_positions(tasks: int, members: int) -> list[int]:
    quota, extra = divmod(tasks, members)
    positions: list[int] = []
    for i in range(members):
        positions.extend([i] * (quota + (1 if i < extra else 0)))
    return positions


def _round_robin_positions(tasks: int, members: int) -> list[int]:
    return [p % members for p in range(tasks)]


def _assign(scenario: Scenario, placement: Placement) -> AssignmentResult:
    members = sorted(scenario.members, key=lambda m: m.member_id)
    active: dict[str, dict[str, list[int]]] = {m.member_id: {} for m in members}
    standby: dict[str, dict[str, list[int]]] = {m.member_id: {} for m in members}
    tasks_total = standby_total = 0
    for topics, tasks in task_groups(scenario):
        eligible = [m.member_id for m in members if m.topics.issuperset(topics)]
        if not eligible or tasks == 0:
            continue
        tasks_total += tasks
        n = len(eligible)
        owners = placement(tasks, n)
        per_member: list[list[int]] = [[] for _ in range(n)]
        for task, owner in enumerate(owners):
            per_member[owner].append(task)
        for i, member_id in enumerate(eligible):
            if per_member[i]:
                for topic in topics:
                    active[member_id][topic] = per_member[i]
        changelogs = [t for t in topics if t in scenario.changelog_topics]
        if changelogs and scenario.config.standby_replicas > 0 and n > 1:
            standby_total += tasks
            for i in range(n):
                holder = eligible[(i + 1) % n]
                if per_member[i]:
                    for topic in changelogs:
                        standby[holder].setdefault(topic, []).extend(per_member[i])
    assignments = {
        m: MemberAssignment(
            active={t: tuple(ps) for t, ps in active[m].items()},
            standby={t: tuple(sorted(ps)) for t, ps in standby[m].items()},
        )
        for m in active
    }
    return AssignmentResult(
        assignments=assignments,
        unassigned={},
        warnings=(),
        followup_rebalance=False,
        stats=AssignmentStats(
            tasks=tasks_total, moved=-1, min_possible_moves=None, standby_tasks=standby_total
        ),
    )


def range_assign(scenario: Scenario) -> AssignmentResult:
    """Kafka-style range over tasks, members sorted by id (``moved`` is left at -1)."""
    return _assign(scenario, _range_positions)


def round_robin_assign(scenario: Scenario) -> AssignmentResult:
    """Tasks dealt to members sorted by id in turn (``moved`` is left at -1)."""
    return _assign(scenario, _round_robin_positions)


BASELINES: Sequence[tuple[str, Callable[[Scenario], AssignmentResult]]] = (
    ("range", range_assign),
    ("round-robin", round_robin_assign),
)
