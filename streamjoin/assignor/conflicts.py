"""Who owned each task before this rebalance (pure): claims and their conflicts.

A member *claims* task p of a group when its reported ``active`` set contains
partition p of any of the group's topics. Counting any topic (rather than all
of them) keeps a claim alive while a topic is being added to a join, and a
partial claim still means the member holds that task's state.

Several members may claim one task (a zombie that missed a rebalance, a restart
reporting stale state). A claim backed by caught-up local state (the claimant
reports every changelog partition of the task, lag at most
``acceptable_recovery_lag``) beats one that is not; among claims equally caught
up, the highest ``generation`` wins; equal highest ones cancel out, so nobody
counts as the previous owner (rule 2). Caught-up state ranks first because of
full restarts: the first worker back takes every task at a new generation and
starts restoring the ones it never held, and its newer claims must not beat the
returning owners that still hold those tasks' state. When the newer claimant is
caught up too (a promoted standby, a finished restore), it keeps the task.
A winner that is no longer eligible for the group (it dropped one of its topics)
loses the claim: the task is orphaned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamjoin.assignor.grouping import Group, Grouping
from streamjoin.assignor.lag import CAUGHT_UP, task_lag
from streamjoin.assignor.model import MemberState

#: markers in :attr:`Claims.raw`
NO_CLAIM = -1
TIED = -2


@dataclass(frozen=True)
class Claims:
    """Conflict-resolved previous ownership, per group and task.

    ``owners[g][p]`` is the index of the previous owner (an eligible member) or -1.
    ``raw[g][p]`` keeps why a task has none: the winner even if ineligible,
    :data:`NO_CLAIM` or :data:`TIED`.
    """

    owners: tuple[list[int], ...]
    raw: tuple[list[int], ...]
    contested: int
    ties: int
    ineligible: int


def claimed_partitions(member: MemberState, group: Group) -> set[int]:
    """Task numbers ``member`` claims in ``group`` (any of its topics counts)."""
    out: set[int] = set()
    active = member.active
    last = None
    for topic in group.topics:
        parts = active.get(topic)
        if parts and parts is not last:  # co-partitioned topics often share one tuple
            out.update(parts)
            last = parts
    if out and max(out) >= group.tasks:
        out = {p for p in out if p < group.tasks}
    return out


def claim_rank(
    member: MemberState, group: Group, p: int, acceptable_recovery_lag: int
) -> tuple[bool, int]:
    """How strong ``member``'s claim on task p is: (caught up, generation); larger wins."""
    found = task_lag(member, group, p, acceptable_recovery_lag) if group.changelogs else None
    return (found is not None and found[0] == CAUGHT_UP, member.generation)


def resolve_claims(
    grouping: Grouping, members: Sequence[MemberState], acceptable_recovery_lag: int
) -> Claims:
    """Apply rule 2 to every task; independent of member order.

    Lags are looked at only for contested tasks: an uncontested claim wins whatever
    its state.
    """
    owners: list[list[int]] = []
    raws: list[list[int]] = []
    contested: set[tuple[int, int]] = set()
    ties = ineligible = 0
    for group, eligible in zip(grouping.groups, grouping.eligible, strict=True):
        n = group.tasks
        owner = [NO_CLAIM] * n
        #: the best claim so far per task; None until the task is contested
        best: list[tuple[bool, int] | None] = [None] * n
        if not eligible or not n:
            owners.append(owner)
            raws.append(list(owner))
            continue
        for i, member in enumerate(members):
            claimed = claimed_partitions(member, group)
            if not claimed:
                continue
            for p in claimed:
                o = owner[p]
                if o == NO_CLAIM:
                    owner[p] = i
                    continue
                contested.add((group.index, p))
                held = best[p]
                if held is None:  # o is the only claimant so far, never TIED
                    held = claim_rank(members[o], group, p, acceptable_recovery_lag)
                mine = claim_rank(member, group, p, acceptable_recovery_lag)
                if mine > held:
                    owner[p] = i
                    best[p] = mine
                else:
                    best[p] = held
                    if mine == held:
                        owner[p] = TIED
        raw = owner
        eligible_set = set(eligible)
        winners = set(raw)
        winners.discard(NO_CLAIM)
        winners.discard(TIED)
        if TIED in raw or not winners <= eligible_set:
            ok = eligible_set
            owner = [o if o in ok else NO_CLAIM for o in raw]
            ties += raw.count(TIED)
            ineligible += sum(1 for o in raw if o >= 0 and o not in ok)
        else:
            owner = list(raw)
        owners.append(owner)
        raws.append(raw)
    return Claims(
        owners=tuple(owners),
        raw=tuple(raws),
        contested=len(contested),
        ties=ties,
        ineligible=ineligible,
    )
