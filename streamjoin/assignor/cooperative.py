"""Incremental cooperative rebalancing (KIP-429), the leader's half (pure).

The assignor computes where every task *should* be. Under the cooperative
protocol members keep processing what they own while the group rebalances, so
the leader must never hand a task to a new owner while another member still
processes it: :func:`withhold_moves` removes every such task from its new
owner's assignment and lists it there as ``pending`` instead. The current owner
finds the task missing from its own assignment, revokes it (flush, commit,
close) and rejoins at once; the follow-up rebalance, in which nobody owns the
task any more, gives it to the new owner. Its pending entry lets the new owner
claim the task in that follow-up (so the assignor picks the same target again)
and restore its state meanwhile like a standby.

A task moves as a whole: it is withheld when *any* of its topic partitions is
owned by another member. What a member owns is what it reported in the
``owned`` field of its subscription (what that process consumes right now),
never what it merely claims from an earlier process.

The member's half -- which partitions were revoked and added -- is
:func:`partition_changes`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from streamjoin.assignor.grouping import merge_copartition
from streamjoin.assignor.model import (
    AssignmentResult,
    MemberAssignment,
    TopicPartitions,
    normalize_topic_partitions,
)

__all__ = ["PartitionChanges", "partition_changes", "withhold_moves"]

TP = tuple[str, int]


def withhold_moves(
    result: AssignmentResult,
    owned: Mapping[str, TopicPartitions],
    topics: Mapping[str, int],
    copartition: Iterable[Iterable[str]] = (),
) -> AssignmentResult:
    """``result`` with every task whose owner changes withheld from its new owner.

    ``owned`` maps assignor member ids to what they process now; ``topics`` and
    ``copartition`` are the scenario's, so tasks are whole co-partition groups.
    The number of withheld tasks is added to the stats as ``withheld``.

    The leader runs this on every rebalance, with up to every partition owned: it
    works on sets of task numbers per co-partition group (a member's partitions of
    a group's topics, usually one shared tuple), not on single topic partitions.
    """
    if not any(any(tps.values()) for tps in owned.values()):
        return _with_withheld(result, result.assignments, 0)
    group_of = {t: g for g in merge_copartition(topics, copartition) for t in g}
    mine = {member_id: _tasks(tps, group_of) for member_id, tps in owned.items()}
    #: per group, every owned task, and those owned by more than one member
    anyone: dict[Group, set[int]] = {}
    shared: dict[Group, set[int]] = {}
    for per_group in mine.values():
        for group, ps in per_group.items():
            seen = anyone.setdefault(group, set())
            both = seen & ps
            if both:
                shared.setdefault(group, set()).update(both)
            seen |= ps
    assignments: dict[str, MemberAssignment] = {}
    withheld = 0
    for member_id, assignment in result.assignments.items():
        own = mine.get(member_id, {})
        held: set[tuple[Group, int]] = set()
        for group, ps in _tasks(assignment.active, group_of).items():
            elsewhere = ps & anyone.get(group, _NONE)
            if elsewhere:
                # owned by someone, less what only this member owns
                only_mine = own.get(group, _NONE) - shared.get(group, _NONE)
                held.update((group, p) for p in elsewhere - only_mine)
        if not held:
            assignments[member_id] = assignment
            continue
        withheld += len(held)
        active: dict[str, list[int]] = {}
        pending: dict[str, list[int]] = {t: list(ps) for t, ps in assignment.pending.items()}
        for topic, partitions in assignment.active.items():
            group = group_of.get(topic, (topic,))
            for p in partitions:
                (pending if (group, p) in held else active).setdefault(topic, []).append(p)
        assignments[member_id] = dataclasses.replace(
            assignment,
            active=normalize_topic_partitions(active),
            pending=normalize_topic_partitions(pending),
        )
    return _with_withheld(result, assignments, withheld)


#: a co-partition group, as its sorted topics
Group = tuple[str, ...]
_NONE: frozenset[int] = frozenset()


def _tasks(tps: TopicPartitions, group_of: Mapping[str, Group]) -> dict[Group, set[int]]:
    """Task numbers per group in a topic map (a topic outside every group is its own)."""
    out: dict[Group, set[int]] = {}
    last: dict[Group, tuple[int, ...]] = {}  # co-partitioned topics often share one tuple
    for topic, partitions in tps.items():
        if not partitions:
            continue
        group = group_of.get(topic, (topic,))
        got = out.get(group)
        if got is None:
            out[group] = set(partitions)
        elif partitions is not last[group]:
            got.update(partitions)
        last[group] = partitions
    return out


def _with_withheld(
    result: AssignmentResult, assignments: Mapping[str, MemberAssignment], withheld: int
) -> AssignmentResult:
    stats = dataclasses.replace(result.stats, extra={**result.stats.extra, "withheld": withheld})
    return dataclasses.replace(result, assignments=dict(assignments), stats=stats)


@dataclasses.dataclass(frozen=True)
class PartitionChanges:
    """What a member does with a new assignment: revoke some partitions, add others."""

    revoked: frozenset[TP]
    added: frozenset[TP]
    kept: frozenset[TP]


def partition_changes(owned: Iterable[TP], assigned: Iterable[TP]) -> PartitionChanges:
    """The difference between what a member owns and what it was just assigned."""
    before, after = frozenset(owned), frozenset(assigned)
    return PartitionChanges(revoked=before - after, added=after - before, kept=before & after)
