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

The runtime runs it on every assignment it computes, so it is kept close to
linear in tasks and members: a partition tuple shared by a group's topics (as
the core builds them) is cleaned once, per-member load ratios are ranked once
instead of compared as fractions per group, standbys get a quick look over
each member's tuple (C-level counting) before any per-task holder lists are
built, and the search for a movable standby buckets takers by tag values and
load instead of trying every pair of members on every task. Where the quick
look finds something, the per-task checks name it exactly as before.
docs/assignor.md has the measured cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from itertools import chain
from operator import ne

from streamjoin.assignor.conflicts import resolve_claims
from streamjoin.assignor.grouping import Group, Grouping, build_grouping
from streamjoin.assignor.model import AssignmentResult, MemberState, Scenario
from streamjoin.assignor.pipeline import sorted_members
from streamjoin.assignor.standby import TagRule, standby_count
from streamjoin.errors import InvalidAssignmentError, Violation, ViolationCode

_MAX_VIOLATIONS = 200

#: how checks report a violation
_Reporter = Callable[[ViolationCode, str], None]
#: per group, each member holding standbys in it (ascending index) with those tasks
_StandbyParts = list[list[tuple[int, tuple[int, ...]]]]


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
    needed = [frozenset(g.topics) for g in grouping.groups]
    owners = [[-1] * g.tasks for g in grouping.groups]
    standbys: _StandbyParts = [[] for _ in grouping.groups]
    for mid, assignment in sorted(result.assignments.items()):
        i = index.get(mid)
        if i is None:
            continue
        member = members[i]
        for kind, parts in (("active", assignment.active), ("standby", assignment.standby)):
            tasks = _member_tasks(member, kind, parts, grouping, topic_group, needed, bad)
            for g, ps in tasks.items():
                if kind == "active":
                    own = owners[g]
                    if max(map(own.__getitem__, ps)) >= 0:
                        for p in ps:
                            if own[p] >= 0:
                                bad(
                                    ViolationCode.DUPLICATE_ACTIVE,
                                    f"task {grouping.groups[g].name}[{p}] is active on "
                                    f"{members[own[p]].member_id!r} and {mid!r}",
                                )
                    for p in ps:
                        own[p] = i
                else:
                    standbys[g].append((i, ps))

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
        missing = owners[g].count(-1)
        if missing:
            bad(
                ViolationCode.MISSING_ACTIVE,
                f"{missing} task(s) of {group.label} have no active owner, "
                f"e.g. partition {owners[g].index(-1)}",
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
    needed: Sequence[frozenset[str]],
    bad: _Reporter,
) -> dict[int, tuple[int, ...]]:
    """Tasks per group in one member's active (or standby) set, reporting malformed parts."""
    mid = member.member_id
    per_group: dict[int, dict[str, tuple[int, ...]]] = {}
    subscribed = member.topics
    #: id of a partition sequence -> (the sequence, its group's tasks, cleaned, outside):
    #: the core shares one tuple between a group's topics, so it is cleaned once
    cleaned: dict[int, tuple[Sequence[int], int, tuple[int, ...], list[int]]] = {}
    for topic, ps in parts.items():
        group = topic_group.get(topic)  # every topic of the scenario is in a group
        if group is None:
            bad(ViolationCode.UNKNOWN_PARTITION, f"{mid!r} {kind} has unknown topic {topic!r}")
            continue
        if topic not in subscribed:
            bad(ViolationCode.NOT_SUBSCRIBED, f"{mid!r} {kind} has unsubscribed topic {topic!r}")
        if kind == "standby" and topic not in group.changelogs:
            bad(
                ViolationCode.STANDBY_NOT_CHANGELOG,
                f"{mid!r} has a standby of {topic!r}, which is not a changelog topic",
            )
            continue
        hit = cleaned.get(id(ps))
        if hit is None or hit[0] is not ps or hit[1] != group.tasks:
            clean = tuple(sorted(set(ps)))
            outside: list[int] = []
            if clean and (clean[0] < 0 or clean[-1] >= group.tasks):
                outside = [p for p in clean if p < 0 or p >= group.tasks]
                clean = tuple(p for p in clean if 0 <= p < group.tasks)
            hit = cleaned[id(ps)] = (ps, group.tasks, clean, outside)
        _, _, clean, outside = hit
        if outside:
            bad(
                ViolationCode.UNKNOWN_PARTITION,
                f"{mid!r} {kind} has {topic!r} partitions outside 0-{group.tasks - 1}: {outside}",
            )
        by_topic = per_group.get(group.index)
        if by_topic is None:
            by_topic = per_group[group.index] = {}
        by_topic[topic] = clean
    out: dict[int, tuple[int, ...]] = {}
    for g, by_topic in per_group.items():
        group = grouping.groups[g]
        expected = group.topics if kind == "active" else group.changelogs
        values = [by_topic.get(t, ()) for t in expected]
        first = values[0]
        union: tuple[int, ...] = first  # cleaned: sorted and distinct
        if values.count(first) != len(values):
            bad(
                ViolationCode.SPLIT_TASK,
                f"{mid!r} {kind} splits co-partition group {group.label}: "
                + ", ".join(f"{t}={list(v)}" for t, v in zip(expected, values, strict=True)),
            )
            union = tuple(sorted(set().union(*values)))
        if union and needed[g] <= subscribed:  # eligible: subscribes to the whole group
            out[g] = union
        elif union:
            bad(
                ViolationCode.NOT_SUBSCRIBED,
                f"{mid!r} is not eligible for {group.label} but has {kind} tasks of it",
            )
    return out


def _check_stats_and_balance(
    scenario: Scenario,
    result: AssignmentResult,
    members: Sequence[MemberState],
    grouping: Grouping,
    owners: list[list[int]],
    bad: _Reporter,
) -> None:
    claims = resolve_claims(grouping, members, scenario.config.acceptable_recovery_lag)
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
        before, after = claims.owners[g], owners[g]
        # tasks whose owner changed, less those that had no previous owner (orphans)
        moved += sum(map(ne, before, after)) - before.count(-1)
        if -1 in before and -1 in after:
            moved += sum(1 for a, b in zip(before, after, strict=True) if a == b == -1)
        count.update(after)
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
            weighted = total * members[i].capacity
            if not weighted // cap_sum <= count[i] <= -(-weighted // cap_sum):
                share = Fraction(weighted, cap_sum)
                bad(
                    ViolationCode.UNBALANCED,
                    f"{members[i].member_id!r} has {count[i]} tasks, share is {float(share):.2f}",
                )
    # KIP-54 per group: the most loaded holder ((n-1)/c, then lowest index) against the
    # least loaded eligible member ((n+1)/c, then lowest index). Loads are global, so each
    # member's place in both orders is ranked once instead of per group.
    if len({m.capacity for m in members}) == 1:  # equal capacities: counts order the same
        donor_rank = _ranks(len(members), lambda o: (count[o], -o))
        taker_rank = _ranks(len(members), lambda m: (count[m], m))
    else:
        donor_rank = _ranks(
            len(members), lambda o: (Fraction(count[o] - 1, members[o].capacity), -o)
        )
        taker_rank = _ranks(
            len(members), lambda m: (Fraction(count[m] + 1, members[m].capacity), m)
        )
    for g in live:
        eligible = grouping.eligible[g]
        holders = set(owners[g])
        holders.discard(-1)
        if not holders:
            continue  # no active owner at all: reported as missing_active
        donor = max(holders, key=donor_rank.__getitem__)
        taker = min(eligible, key=taker_rank.__getitem__)
        if (
            donor != taker
            and (count[donor] - 1) * members[taker].capacity
            >= (count[taker] + 1) * members[donor].capacity
        ):
            bad(
                ViolationCode.UNBALANCED,
                f"a task of {grouping.groups[g].label} could move from "
                f"{members[donor].member_id!r} ({count[donor]} tasks) to "
                f"{members[taker].member_id!r} ({count[taker]} tasks)",
            )


def _ranks(n: int, key: Callable[[int], tuple[Fraction | int, int]]) -> list[int]:
    """Position of each of ``range(n)`` when sorted by ``key`` (distinct keys: no ties)."""
    rank = [0] * n
    for position, i in enumerate(sorted(range(n), key=key)):
        rank[i] = position
    return rank


def _check_standbys(
    scenario: Scenario,
    members: Sequence[MemberState],
    grouping: Grouping,
    owners: list[list[int]],
    standbys: _StandbyParts,
    bad: _Reporter,
) -> None:
    """Rule 6, group by group.

    Each part first gets a quick look over the members' standby tuples (C-level counting
    and lookups); per-task holder lists are built, and the per-task checks that name what
    is wrong are run, only for a part the quick look cannot clear.
    """
    for group in grouping.groups:
        g = group.index
        eligible = grouping.eligible[g]
        if not eligible or not group.tasks:
            continue
        k = standby_count(scenario.config, len(eligible)) if group.changelogs else 0
        parts, active = standbys[g], owners[g]
        chosen: list[list[int]] | None = None
        if not _counts_plainly_right(k, parts, active, group.tasks):
            chosen = _holders(group.tasks, parts)
            _report_counts(group, members, k, chosen, active, bad)
        if not k:
            continue
        tags = TagRule(members, eligible, k)
        spread_rule = len(tags.keys) == 1 and tags.active
        # the quick look assumes one standby per task, which only holds if counts passed
        if spread_rule and (
            chosen is not None or not _spread_plainly_right(k, parts, active, tags)
        ):
            chosen = chosen if chosen is not None else _holders(group.tasks, parts)
            _report_tag_spread(group, chosen, active, tags, bad)
        loads = dict.fromkeys(eligible, 0)
        for i, ps in parts:
            loads[i] = len(ps)
        if max(loads.values()) - min(loads.values()) < 2:
            continue
        chosen = chosen if chosen is not None else _holders(group.tasks, parts)
        found = _movable_standby(eligible, loads, parts, chosen, active, tags)
        if found is not None:
            o, m, p = found
            bad(
                ViolationCode.STANDBY_UNBALANCED,
                f"standby of {group.name}[{p}] could move from "
                f"{members[o].member_id!r} ({loads[o]}) to "
                f"{members[m].member_id!r} ({loads[m]})",
            )
            return


def _holders(tasks: int, parts: Sequence[tuple[int, tuple[int, ...]]]) -> list[list[int]]:
    """Per task, the members holding a standby of it (ascending)."""
    chosen: list[list[int]] = [[] for _ in range(tasks)]
    for i, ps in parts:
        for p in ps:
            chosen[p].append(i)
    return chosen


def _counts_plainly_right(
    k: int, parts: Sequence[tuple[int, tuple[int, ...]]], active: Sequence[int], tasks: int
) -> bool:
    """True if every task has exactly ``k`` standbys and none sits on the task's active."""
    if not k:
        return not parts
    per_task = Counter(chain.from_iterable(ps for _, ps in parts))
    if len(per_task) != tasks or set(per_task.values()) != {k}:
        return False
    return not any(i in map(active.__getitem__, ps) for i, ps in parts)


def _spread_plainly_right(
    k: int, parts: Sequence[tuple[int, tuple[int, ...]]], active: Sequence[int], tags: TagRule
) -> bool:
    """True if, with one replica and one tag key, every standby's value differs from its
    active's (one key with several values makes the target 2). False: look closer.
    Only meaningful once every task is known to have exactly one standby."""
    if k != 1 or -1 in active:
        return False
    value = {i: v[0] for i, v in tags.values.items()}
    owner_value = list(map(value.__getitem__, active))
    return not any(value[i] in map(owner_value.__getitem__, ps) for i, ps in parts)


def _report_counts(
    group: Group,
    members: Sequence[MemberState],
    k: int,
    chosen: Sequence[Sequence[int]],
    active: Sequence[int],
    bad: _Reporter,
) -> None:
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


def _report_tag_spread(
    group: Group,
    chosen: Sequence[Sequence[int]],
    active: Sequence[int],
    tags: TagRule,
    bad: _Reporter,
) -> None:
    """The first task whose active and standbys cover fewer values of the (single) tag key
    than the eligible members offer (up to replicas + 1)."""
    value = {i: v[0] for i, v in tags.values.items()}
    target = tags.target[0]
    for p, holders in enumerate(chosen):
        a = active[p]
        if a < 0:
            continue
        spread = len({value[a], *(value[i] for i in holders)})
        if spread < target:
            bad(
                ViolationCode.STANDBY_TAG_SPREAD,
                f"task {group.name}[{p}] spans {spread} "
                f"value(s) of tag {tags.keys[0]!r}, {target} possible",
            )
            return


def _movable_standby(
    eligible: Sequence[int],
    loads: Mapping[int, int],
    parts: Sequence[tuple[int, tuple[int, ...]]],
    chosen: Sequence[Sequence[int]],
    active: Sequence[int],
    tags: TagRule,
) -> tuple[int, int, int] | None:
    """The first ``(o, m, p)`` (in member, member, task order) where task p's standby may
    move from ``o`` to ``m`` with ``load_o >= load_m + 2`` (see ``standby_move_allowed``).

    Whether a move keeps the tag spread depends on ``m`` only through its tag values, so
    takers are bucketed by (tag values, load): per ``o`` and tag values, the tasks whose
    spread a move keeps are listed once, and within a bucket the first taker that is
    neither the task's active nor already its standby wins. This keeps the search near
    linear where trying every pair of members on every task was quadratic.
    """
    heaviest = max(loads.values())
    buckets: dict[tuple[tuple[str | None, ...], int], list[int]] = {}
    for m in eligible:  # ascending, so each bucket is too
        if loads[m] <= heaviest - 2:
            values = tags.values[m] if tags.active else ()
            buckets.setdefault((values, loads[m]), []).append(m)
    tasks_of = dict(parts)  # each member's standby tasks, ascending
    for o in eligible:
        mine = tasks_of.get(o)
        if not mine:
            continue
        movable: dict[tuple[str | None, ...], list[int]] = {}
        best: tuple[int, int] | None = None  # (m, p)
        for (values, load), takers in buckets.items():
            if loads[o] < load + 2 or (best is not None and takers[0] > best[0]):
                continue
            ps = movable.get(values)
            if ps is None:
                ps = movable[values] = [
                    p for p in mine if _spread_kept(p, o, values, active, chosen, tags)
                ]
            if not ps:
                continue
            for m in takers:
                if best is not None and m > best[0]:
                    break
                task = next((p for p in ps if active[p] != m and m not in chosen[p]), None)
                if task is not None:
                    best = (m, task)
                    break
        if best is not None:
            return o, best[0], best[1]
    return None


def _spread_kept(
    p: int,
    o: int,
    values: tuple[str | None, ...],
    active: Sequence[int],
    chosen: Sequence[Sequence[int]],
    tags: TagRule,
) -> bool:
    """Does replacing ``o`` among task p's standbys by a member with ``values`` keep, for
    every tag key, the distinct values the task covers (the tag part of
    ``standby_move_allowed``)? Always true when tags do not matter."""
    if not tags.active:
        return True
    a = active[p]
    if a < 0:
        return False  # no active to spread tags from (reported: missing_active)
    holders = chosen[p]
    others = [c for c in holders if c != o]
    before = tags.spread(a, holders)
    for j, covered in enumerate(before):
        after = {tags.values[a][j], values[j], *(tags.values[c][j] for c in others)}
        if len(after) < covered:
            return False
    return True
