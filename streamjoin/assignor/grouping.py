"""Co-partition groups and their tasks (pure).

A *group* is a set of topics whose partition p must always be owned by the same
member (declared via ``copartition``); a topic declared in no group forms a group
of its own. Declared groups that share a topic are merged, because
co-partitioning is transitive. A *task* is (group, partition p) for p below the
smallest partition count of the group's topics (KIP-315): the extra partitions of
larger topics are reported as unassigned with a warning instead of silently
breaking the join.

A member is *eligible* for a group when it subscribes to all of the group's
topics; a member subscribing to only some of them gets none of them (warned).
A member subscribing to a topic missing from the cluster metadata is warned
about, not rejected: in the runtime that happens while a topic is being created.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from streamjoin.assignor.model import MemberState
from streamjoin.errors import InvalidScenarioError

#: how many member ids a warning lists before saying "and N more"
_WARN_LIST = 5


@dataclass(frozen=True)
class Group:
    """One co-partition group: ``tasks`` partitions, each owned as a whole."""

    index: int
    topics: tuple[str, ...]
    changelogs: tuple[str, ...]
    tasks: int

    @property
    def name(self) -> str:
        """Short, stable label: the smallest topic name."""
        return self.topics[0]

    @property
    def label(self) -> str:
        return "{" + ", ".join(self.topics) + "}"


@dataclass(frozen=True)
class Grouping:
    """Groups in canonical order, which members may own each, and what stays unassigned."""

    groups: tuple[Group, ...]
    #: per group, indices (into the sorted member list) of eligible members, ascending
    eligible: tuple[tuple[int, ...], ...]
    unassigned: dict[str, tuple[int, ...]]
    warnings: tuple[str, ...]

    @property
    def total_tasks(self) -> int:
        return sum(g.tasks for g, e in zip(self.groups, self.eligible, strict=True) if e)


def _names(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_WARN_LIST])
    more = len(ids) - _WARN_LIST
    return shown + (f" and {more} more" if more > 0 else "")


def merge_copartition(
    topics: Mapping[str, int], copartition: Iterable[Iterable[str]]
) -> list[tuple[str, ...]]:
    """Declared groups merged where they overlap, plus one group per undeclared topic.

    Returned sorted (each group's topics sorted, groups by first topic) so the
    result does not depend on declaration order.
    """
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        root = t
        while parent[root] != root:
            root = parent[root]
        while parent[t] != root:
            parent[t], t = root, parent[t]
        return root

    for topic in topics:
        parent[topic] = topic
    for i, declared in enumerate(copartition):
        members = list(declared)
        if not members:
            raise InvalidScenarioError(f"copartition[{i}] is empty")
        for t in members:
            if t not in parent:
                raise InvalidScenarioError(
                    f"copartition[{i}] names unknown topic {t!r} (not in topics)"
                )
        first = find(members[0])
        for t in members[1:]:
            other = find(t)
            if other != first:
                lo, hi = sorted((first, other))
                parent[hi] = lo
                first = lo
    by_root: dict[str, list[str]] = {}
    for topic in topics:
        by_root.setdefault(find(topic), []).append(topic)
    return sorted(tuple(sorted(ts)) for ts in by_root.values())


def build_grouping(
    topics: Mapping[str, int],
    copartition: Iterable[Iterable[str]],
    changelog_topics: Iterable[str],
    members: Sequence[MemberState],
) -> Grouping:
    """Groups, tasks, eligibility and the unassigned leftovers for ``members`` (sorted by id)."""
    for topic, count in topics.items():
        if count < 0:
            raise InvalidScenarioError(f"topic {topic!r} has a negative partition count {count}")
    changelogs = frozenset(changelog_topics)
    unknown = sorted(changelogs - topics.keys())
    if unknown:
        raise InvalidScenarioError(f"changelog topic {unknown[0]!r} is not in topics")
    warnings: list[str] = []
    unassigned: dict[str, tuple[int, ...]] = {}
    groups: list[Group] = []
    eligible: list[tuple[int, ...]] = []
    for index, group_topics in enumerate(merge_copartition(topics, copartition)):
        counts = {t: topics[t] for t in group_topics}
        n = min(counts.values())
        group = Group(
            index=index,
            topics=group_topics,
            changelogs=tuple(t for t in group_topics if t in changelogs),
            tasks=n,
        )
        if any(c != n for c in counts.values()):
            detail = ", ".join(f"{t}={c}" for t, c in counts.items())
            warnings.append(
                f"co-partition group {group.label} has different partition counts ({detail}): "
                f"only partitions 0-{n - 1} are assigned, the rest are unassigned"
                if n
                else f"co-partition group {group.label} has a topic with no partitions "
                f"({detail}): nothing in it is assigned"
            )
            for t, c in counts.items():
                if c > n:
                    unassigned[t] = tuple(range(n, c))
        needed = frozenset(group_topics)
        who = tuple(i for i, m in enumerate(members) if needed <= m.topics)
        partial = [
            m.member_id
            for m in members
            if not needed <= m.topics and not needed.isdisjoint(m.topics)
        ]
        if partial and len(group_topics) > 1:
            warnings.append(
                f"member(s) {_names(partial)} subscribe to only part of co-partition group "
                f"{group.label} and get none of it"
            )
        if not who and n:
            warnings.append(
                f"no member subscribes to all of {group.label}: its {n} task(s) are unassigned"
            )
            for t in group_topics:
                unassigned[t] = tuple(range(topics[t]))
        groups.append(group)
        eligible.append(who)
    known = topics.keys()
    strangers: dict[str, list[str]] = {}
    for m in members:
        for t in sorted(m.topics - known):
            strangers.setdefault(t, []).append(m.member_id)
    for t in sorted(strangers):
        warnings.append(
            f"member(s) {_names(strangers[t])} subscribe to unknown topic {t!r}: ignored"
        )
    return Grouping(
        groups=tuple(groups),
        eligible=tuple(eligible),
        unassigned=dict(sorted(unassigned.items())),
        warnings=tuple(warnings),
    )
