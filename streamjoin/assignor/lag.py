"""Which members hold local state for a task, and how far behind it is (pure).

A task's lag on a member is the sum of the lags it reports for the group's
changelog partitions p. A member that reports every changelog partition of the
task with a total at most ``acceptable_recovery_lag`` is *caught up* (tier 0);
one that reports at least one is a *state holder* (tier 1); others have no
state for it. Groups without changelog topics are stateless: nobody holds state.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from streamjoin.assignor.grouping import Group
from streamjoin.assignor.model import MemberState

CAUGHT_UP = 0
HAS_STATE = 1

#: (tier, lag, member index): sorts best holder first, ties by member id
Holder = tuple[int, int, int]


def state_holders(
    group: Group,
    members: Sequence[MemberState],
    candidates: Iterable[int],
    partitions: Collection[int],
    acceptable_recovery_lag: int,
) -> dict[int, list[Holder]]:
    """For each of ``partitions`` that someone holds state for: its holders, best first.

    Cost is bounded by the lag entries the candidates report for those
    partitions (set intersections, no member x task loop).
    """
    if not group.changelogs or not partitions:
        return {}
    wanted = partitions if isinstance(partitions, (set, frozenset)) else set(partitions)
    needed = len(group.changelogs)
    acc: dict[int, dict[int, list[int]]] = {}
    for i in candidates:
        reported = members[i].state_lag
        if not reported:
            continue
        for topic in group.changelogs:
            lags = reported.get(topic)
            if not lags:
                continue
            for p in lags.keys() & wanted:
                per_member = acc.setdefault(p, {})
                entry = per_member.get(i)
                if entry is None:
                    per_member[i] = [lags[p], 1]
                else:
                    entry[0] += lags[p]
                    entry[1] += 1
    out: dict[int, list[Holder]] = {}
    for p, per_member in acc.items():
        out[p] = sorted(
            (
                CAUGHT_UP if cnt == needed and lag <= acceptable_recovery_lag else HAS_STATE,
                lag,
                i,
            )
            for i, (lag, cnt) in per_member.items()
        )
    return out


def task_lag(
    member: MemberState, group: Group, p: int, acceptable_recovery_lag: int
) -> tuple[int, int] | None:
    """(tier, lag) of ``member`` for task p of ``group``, or None when it holds no state.

    For one-off questions ("would m restore less than for that other task?"),
    where building the ``state_holders`` index would cost more than it saves.
    """
    reported = member.state_lag
    if not reported or not group.changelogs:
        return None
    lag = cnt = 0
    for topic in group.changelogs:
        lags = reported.get(topic)
        if lags is not None and p in lags:
            lag += lags[p]
            cnt += 1
    if not cnt:
        return None
    caught_up = cnt == len(group.changelogs) and lag <= acceptable_recovery_lag
    return (CAUGHT_UP if caught_up else HAS_STATE, lag)
