"""The human-readable ``--explain`` table: who got what, and why (pure).

Everything is re-derived from the scenario and the result (previous owners via
the same conflict rule, lags, previous standbys), so it explains any result,
not only ours. Per member, one row per task:

* active: ``kept``; ``moved from X`` or ``orphaned (why)``, then where it went
  (``caught-up state, lag N`` / ``has state, lag N`` / ``balance``);
  ``standby promoted`` when the new owner was its standby; ``held for warm-up``.
* standby: ``kept`` / ``new`` (with the member's lag when it reports one).
* warm-up: replicas restoring state before a follow-up rebalance.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamjoin.assignor.conflicts import NO_CLAIM, TIED, resolve_claims
from streamjoin.assignor.grouping import Group, build_grouping
from streamjoin.assignor.model import AssignmentResult, MemberState, Scenario, TopicPartitions
from streamjoin.assignor.pipeline import sorted_members
from streamjoin.assignor.standby import claimed_standbys


def _lag(member: MemberState, group: Group, p: int) -> tuple[int, bool] | None:
    """(total lag, reports all changelogs) of ``member`` for task p, or None without state."""
    parts = [member.state_lag[t][p] for t in group.changelogs if p in member.state_lag.get(t, {})]
    if not parts:
        return None
    return sum(parts), len(parts) == len(group.changelogs)


def explain(scenario: Scenario, result: AssignmentResult) -> str:
    """Render the table for ``result`` of ``scenario``."""
    members = sorted_members(scenario)
    grouping = build_grouping(
        scenario.topics, scenario.copartition, scenario.changelog_topics, members
    )
    claims = resolve_claims(grouping, members, scenario.config.acceptable_recovery_lag)
    acceptable = scenario.config.acceptable_recovery_lag
    stats = result.stats
    names = [m.member_id for m in members]
    label = {g.index: f"G{g.index + 1}" for g in grouping.groups}
    topic_group = {t: g for g in grouping.groups for t in g.topics}

    lines: list[str] = []
    minimum = "n/a" if stats.min_possible_moves is None else str(stats.min_possible_moves)
    lines.append(
        f"{stats.tasks} task(s), {len(members)} member(s): moved {stats.moved} "
        f"(minimum {minimum}), orphaned {stats.extra.get('orphaned', 0)}, "
        f"standbys {stats.standby_tasks}"
        + (", follow-up rebalance requested" if result.followup_rebalance else "")
    )
    lines.append("groups:")
    for grp in grouping.groups:
        changelogs = f"; changelogs: {', '.join(grp.changelogs)}" if grp.changelogs else ""
        lines.append(f"  {label[grp.index]} = {grp.label}: {grp.tasks} task(s){changelogs}")
    for w in result.warnings:
        lines.append(f"warning: {w}")
    for t, ps in sorted(result.unassigned.items()):
        lines.append(f"unassigned: {t} {_ranges(ps)}")

    prev_standby: dict[tuple[int, int], set[int]] = {}
    for group in grouping.groups:
        for i, m in enumerate(members):
            for p in claimed_standbys(m, group):
                prev_standby.setdefault((group.index, p), set()).add(i)

    eligible_any: set[int] = set().union(*grouping.eligible)
    total_cap = sum(members[i].capacity for i in eligible_any) or 1
    for i, m in enumerate(members):
        got = result.assignments.get(m.member_id)
        if got is None:
            continue
        rows: list[tuple[str, str, str]] = []
        active_tasks = _tasks(got.active, topic_group)
        for g, p in active_tasks:
            group = grouping.groups[g]
            rows.append(
                (
                    "active",
                    f"{label[g]}[{p}]",
                    _why_active(
                        i,
                        g,
                        p,
                        group,
                        members,
                        names,
                        claims.owners[g][p],
                        claims.raw[g][p],
                        prev_standby.get((g, p), set()),
                        acceptable,
                    ),
                )
            )
        for g, p in _tasks(got.standby, topic_group):
            group = grouping.groups[g]
            why = "kept" if i in prev_standby.get((g, p), set()) else "new"
            if claims.owners[g][p] == i:
                why = "new (was active here)"
            lag = _lag(m, group, p)
            rows.append(("standby", f"{label[g]}[{p}]", why + (f", lag {lag[0]}" if lag else "")))
        for g, p in _tasks(got.warmup, topic_group):
            rows.append(("warm-up", f"{label[g]}[{p}]", "restoring before a follow-up rebalance"))
        share = (
            f"share {stats.tasks * m.capacity / total_cap:.2f}"
            if i in eligible_any
            else "eligible for no group"
        )
        tags = " ".join(f"{k}={v}" for k, v in m.tags.items())
        lines.append("")
        lines.append(
            f"{m.member_id}  capacity {m.capacity}  generation {m.generation}"
            + (f"  {tags}" if tags else "")
            + f"  |  {len(active_tasks)} active ({share}), "
            f"{sum(1 for r in rows if r[0] == 'standby')} standby"
        )
        if not rows:
            lines.append("  (nothing)")
        width = max((len(r[1]) for r in rows), default=0)
        for role, task, why in rows:
            lines.append(f"  {role:<8} {task:<{width}}  {why}")
    return "\n".join(lines) + "\n"


def _tasks(parts: TopicPartitions, topic_group: dict[str, Group]) -> list[tuple[int, int]]:
    """(group, task) pairs of a member's topic partitions, in order."""
    out: set[tuple[int, int]] = set()
    for topic, ps in parts.items():
        group = topic_group.get(topic)
        if group is not None:
            out.update((group.index, p) for p in ps)
    return sorted(out)


def _why_active(
    i: int,
    g: int,
    p: int,
    group: Group,
    members: Sequence[MemberState],
    names: Sequence[str],
    prev: int,
    raw: int,
    prev_standby: set[int],
    acceptable: int,
) -> str:
    if prev == i:
        return "kept"
    promoted = " (standby promoted)" if i in prev_standby else ""
    lag = _lag(members[i], group, p)
    if lag is None:
        placed = "balance"
    elif lag[1] and lag[0] <= acceptable:
        placed = f"caught-up state, lag {lag[0]}"
    else:
        placed = f"has state, lag {lag[0]}"
    if prev != NO_CLAIM:
        return f"moved from {names[prev]} -> {placed}{promoted}"
    if raw == TIED:
        cause = "tied claims: equal generation, equally caught up"
    elif raw >= 0:
        cause = f"previous owner {names[raw]} no longer subscribes to all of {group.label}"
    else:
        cause = "no live previous owner"
    return f"orphaned ({cause}) -> {placed}{promoted}"


def _ranges(ps: Sequence[int]) -> str:
    """``0-3,7`` style compaction of sorted partitions."""
    out: list[str] = []
    start = prev = None
    for p in ps:
        if start is None:
            start = prev = p
        elif prev is not None and p == prev + 1:
            prev = p
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = p
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)
