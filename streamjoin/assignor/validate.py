"""Postcondition checker for assignments (pure), independent of how they were built.

``find_violations`` re-derives what every rule demands from the scenario alone
(tasks, eligibility, previous owners, quotas) and compares it with a result;
``validate_assignment`` raises :class:`InvalidAssignmentError` listing them. The
tests run it on every generated case; the runtime may run it on whatever an
assignor returns before sending it to the group.

Balance and minimality are not checked when ``followup_rebalance`` is set: in
high-availability mode a task may stay on a caught-up member beyond its share.
Standby tag spread is checked when members use a single tag key (with several
keys the per-key targets may be jointly unreachable).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

from streamjoin.assignor.conflicts import resolve_claims
from streamjoin.assignor.errors import InvalidAssignmentError, Violation, ViolationCode
from streamjoin.assignor.grouping import Group, Grouping, build_grouping
from streamjoin.assignor.model import AssignmentResult, MemberState, Scenario
from streamjoin.assignor.pipeline import sorted_members
from streamjoin.assignor.standby import TagRule, standby_count, standby_move_allowed

_MAX_VIOLATIONS = 200

#: how checks report a violation
_Reporter = Callable[[ViolationCode, str], None]


def validate_assignment(scenario: Scenario, result: AssignmentResult) -> None:
    """Raise :class:`InvalidAssignmentError` if ``result`` breaks any rule for ``scenario``."""
    violations = find_violations(scenario, result)
    if violations:
        raise InvalidAssignmentError(violations)


def find_violations(scenario: Scenario, result: AssignmentResult) -> list[Violation]:
    """Every broken rule (up to a few hundred), each naming what is wrong."""
    members = sorted_members(scenario)
    grouping = build_grouping(
        scenario.topics, scenario.copartition, scenario.changelog_topics, members
    )
    out: list[Violation] = []

    def bad(code: ViolationCode, message: str) -> None:
        if len(out) < _MAX_VIOLATIONS:
            out.append(Violation(code, message))

    index = {m.member_id: i for i, m in enumerate(members)}
    for mid in sorted(set(result.assignments) - index.keys()):
        bad(ViolationCode.UNKNOWN_MEMBER, f"assignment for unknown member {mid!r}")
    for mid in sorted(index.keys() - set(result.assignments)):
        bad(ViolationCode.MISSING_MEMBER, f"member {mid!r} has no assignment")

    topic_group = {t: g for g in grouping.groups for t in g.topics}
    owners = [[-1] * g.tasks for g in grouping.groups]
    standbys: list[list[list[int]]] = [[[] for _ in range(g.tasks)] for g in grouping.groups]
    for mid, assignment in sorted(result.assignments.items()):
        i = index.get(mid)
        if i is None:
            continue
        member = members[i]
        for kind, parts in (("active", assignment.active), ("standby", assignment.standby)):
            tasks = _member_tasks(member, kind, parts, grouping, topic_group, scenario.topics, bad)
            for g, ps in tasks.items():
                if kind == "active":
                    own = owners[g]
                    for p in ps:
                        if own[p] >= 0:
                            bad(
                                ViolationCode.DUPLICATE_ACTIVE,
                                f"task {grouping.groups[g].name}[{p}] is active on "
                                f"{members[own[p]].member_id!r} and {mid!r}",
                            )
                        own[p] = i
                else:
                    holders = standbys[g]
                    for p in ps:
                        holders[p].append(i)

    expected_unassigned = {t: tuple(ps) for t, ps in grouping.unassigned.items()}
    got_unassigned = {t: tuple(ps) for t, ps in result.unassigned.items() if ps}
    if got_unassigned != expected_unassigned:
        bad(
            ViolationCode.WRONG_UNASSIGNED,
            f"unassigned is {got_unassigned}, expected {expected_unassigned}",
        )

    for g, group in enumerate(grouping.groups):
        eligible = grouping.eligible[g]
        if not eligible:
            continue
        missing = [p for p, o in enumerate(owners[g]) if o < 0]
        if missing:
            bad(
                ViolationCode.MISSING_ACTIVE,
                f"{len(missing)} task(s) of {group.label} have no active owner, "
                f"e.g. partition {missing[0]}",
            )

    _check_stats_and_balance(scenario, result, members, grouping, owners, bad)
    _check_standbys(scenario, members, grouping, owners, standbys, bad)
    return out


def _member_tasks(
    member: MemberState,
    kind: str,
    parts: Mapping[str, Sequence[int]],
    grouping: Grouping,
    topic_group: Mapping[str, Group],
    topics: Mapping[str, int],
    bad: _Reporter,
) -> dict[int, tuple[int, ...]]:
    """Tasks per group in one member's active (or standby) set, reporting malformed parts."""
    mid = member.member_id
    per_group: dict[int, dict[str, tuple[int, ...]]] = {}
    for topic, ps in parts.items():
        if topic not in topics:
            bad(ViolationCode.UNKNOWN_PARTITION, f"{mid!r} {kind} has unknown topic {topic!r}")
            continue
        if topic not in member.topics:
            bad(ViolationCode.NOT_SUBSCRIBED, f"{mid!r} {kind} has unsubscribed topic {topic!r}")
        group = topic_group[topic]
        if kind == "standby" and topic not in group.changelogs:
            bad(
                ViolationCode.STANDBY_NOT_CHANGELOG,
                f"{mid!r} has a standby of {topic!r}, which is not a changelog topic",
            )
            continue
        clean = tuple(sorted(set(ps)))
        if clean and (clean[0] < 0 or clean[-1] >= group.tasks):
            bad(
                ViolationCode.UNKNOWN_PARTITION,
                f"{mid!r} {kind} has {topic!r} partitions outside 0-{group.tasks - 1}: "
                f"{[p for p in clean if p < 0 or p >= group.tasks]}",
            )
            clean = tuple(p for p in clean if 0 <= p < group.tasks)
        per_group.setdefault(group.index, {})[topic] = clean
    out: dict[int, tuple[int, ...]] = {}
    for g, by_topic in per_group.items():
        group = grouping.groups[g]
        expected = group.topics if kind == "active" else group.changelogs
        values = [by_topic.get(t, ()) for t in expected]
        if any(v != values[0] for v in values):
            bad(
                ViolationCode.SPLIT_TASK,
                f"{mid!r} {kind} splits co-partition group {group.label}: "
                + ", ".join(f"{t}={list(v)}" for t, v in zip(expected, values, strict=True)),
            )
        union = sorted(set().union(*values))
        if union and member_index_ok(member, group):
            out[g] = tuple(union)
        elif union:
            bad(
                ViolationCode.NOT_SUBSCRIBED,
                f"{mid!r} is not eligible for {group.label} but has {kind} tasks of it",
            )
    return out


def member_index_ok(member: MemberState, group: Group) -> bool:
    """Eligibility: the member subscribes to every topic of the group."""
    return frozenset(group.topics) <= member.topics


def _check_stats_and_balance(
    scenario: Scenario,
    result: AssignmentResult,
    members: Sequence[MemberState],
    grouping: Grouping,
    owners: list[list[int]],
    bad: _Reporter,
) -> None:
    claims = resolve_claims(grouping, members)
    stats = result.stats
    if stats.tasks != grouping.total_tasks:
        bad(
            ViolationCode.WRONG_STATS,
            f"stats.tasks={stats.tasks}, expected {grouping.total_tasks}",
        )
    moved = 0
    count: Counter[int] = Counter()
    prev: Counter[int] = Counter()
    live = [g.index for g in grouping.groups if grouping.eligible[g.index] and g.tasks]
    for g in live:
        before = claims.owners[g]
        moved += sum(1 for a, b in zip(before, owners[g], strict=True) if a >= 0 and a != b)
        count.update(owners[g])
        prev.update(before)
    if stats.moved != moved:
        bad(ViolationCode.WRONG_STATS, f"stats.moved={stats.moved}, counted {moved}")
    eligible_sets = {grouping.eligible[g] for g in live}
    equal = len(eligible_sets) <= 1
    expected_min: int | None = None
    if equal and live:
        eligible = grouping.eligible[live[0]]
        total = sum(grouping.groups[g].tasks for g in live)
        cap_sum = sum(members[i].capacity for i in eligible)
        floor = {i: total * members[i].capacity // cap_sum for i in eligible}
        extra = total - sum(floor.values())
        beneficiaries = sum(
            1 for i in eligible if prev[i] > floor[i] and (total * members[i].capacity) % cap_sum
        )
        expected_min = sum(max(0, prev[i] - floor[i]) for i in eligible) - min(extra, beneficiaries)
    elif equal:
        expected_min = 0
    if stats.min_possible_moves != expected_min:
        bad(
            ViolationCode.WRONG_STATS,
            f"stats.min_possible_moves={stats.min_possible_moves}, expected {expected_min}",
        )
    if result.followup_rebalance:
        return
    if expected_min is not None and moved != expected_min:
        bad(ViolationCode.NOT_MINIMAL, f"moved {moved} tasks, the minimum is {expected_min}")
    if equal and live:
        eligible = grouping.eligible[live[0]]
        total = sum(grouping.groups[g].tasks for g in live)
        cap_sum = sum(members[i].capacity for i in eligible)
        for i in eligible:
            share = Fraction(total * members[i].capacity, cap_sum)
            if not share.__floor__() <= count[i] <= share.__ceil__():
                bad(
                    ViolationCode.UNBALANCED,
                    f"{members[i].member_id!r} has {count[i]} tasks, share is {float(share):.2f}",
                )
    for g in live:
        eligible = grouping.eligible[g]
        holders = set(owners[g])
        holders.discard(-1)
        donor = max(holders, key=lambda o: (Fraction(count[o] - 1, members[o].capacity), -o))
        taker = min(eligible, key=lambda m: (Fraction(count[m] + 1, members[m].capacity), m))
        if donor != taker and Fraction(count[donor] - 1, members[donor].capacity) >= Fraction(
            count[taker] + 1, members[taker].capacity
        ):
            bad(
                ViolationCode.UNBALANCED,
                f"a task of {grouping.groups[g].label} could move from "
                f"{members[donor].member_id!r} ({count[donor]} tasks) to "
                f"{members[taker].member_id!r} ({count[taker]} tasks)",
            )


def _check_standbys(
    scenario: Scenario,
    members: Sequence[MemberState],
    grouping: Grouping,
    owners: list[list[int]],
    standbys: list[list[list[int]]],
    bad: _Reporter,
) -> None:
    for group in grouping.groups:
        g = group.index
        eligible = grouping.eligible[g]
        if not eligible or not group.tasks:
            continue
        k = standby_count(scenario.config, len(eligible)) if group.changelogs else 0
        chosen = standbys[g]
        active = owners[g]
        load: Counter[int] = Counter()
        for p, holders in enumerate(chosen):
            if len(holders) != k:
                bad(
                    ViolationCode.STANDBY_COUNT,
                    f"task {group.name}[{p}] has {len(holders)} standby(s), expected {k}",
                )
            if active[p] in holders:
                bad(
                    ViolationCode.STANDBY_ON_ACTIVE,
                    f"task {group.name}[{p}] has a standby on its active "
                    f"{members[active[p]].member_id!r}",
                )
            load.update(holders)
        if not k:
            continue
        tags = TagRule(members, eligible, k)
        if len(tags.keys) == 1 and tags.active:
            for p, holders in enumerate(chosen):
                if active[p] >= 0 and tags.spread(active[p], holders)[0] < tags.target[0]:
                    bad(
                        ViolationCode.STANDBY_TAG_SPREAD,
                        f"task {group.name}[{p}] spans {tags.spread(active[p], holders)[0]} "
                        f"value(s) of tag {tags.keys[0]!r}, {tags.target[0]} possible",
                    )
                    break
        loads = {i: load[i] for i in eligible}
        low = min(loads.values())
        if max(loads.values()) - low < 2:
            continue
        tasks_of: dict[int, list[int]] = {}
        for p, holders in enumerate(chosen):
            for i in holders:
                tasks_of.setdefault(i, []).append(p)
        for o in eligible:
            for m in eligible:
                if loads[o] < loads[m] + 2:
                    continue
                for p in tasks_of.get(o, ()):
                    if standby_move_allowed(p, o, m, active, chosen, tags):
                        bad(
                            ViolationCode.STANDBY_UNBALANCED,
                            f"standby of {group.name}[{p}] could move from "
                            f"{members[o].member_id!r} ({loads[o]}) to "
                            f"{members[m].member_id!r} ({loads[m]})",
                        )
                        return
