"""Standby replica placement (pure).

For each task of a group with changelog topics, ``min(standby_replicas,
eligible - 1)`` standbys on distinct eligible members other than the active. In
priority order:

1. *Tag spread* (KIP-708): for each tag key, the active and its standbys cover
   as many distinct values as the eligible members offer (up to replicas + 1).
   A candidate is accepted only if, for every key, the remaining picks can still
   reach that target. Keys are checked independently; when two keys cannot be
   satisfied together the pick falls back to the least loaded candidate.
2. *Balance*: per group, each eligible member hosts ``floor`` or ``ceil`` of
   ``standbys / eligible``; the ``+1`` slots go to whoever takes them first,
   and previous holders take first. Where the "not the active, not twice" rule
   makes that impossible, a repair pass moves standbys until no standby can move
   from o to m with ``load_o >= load_m + 2``.
3. *Stickiness and state*: previous standby holders, the previous active owner
   and members reporting local state keep or get the replica, smallest lag first.

Cost: a least-loaded heap per distinct tag combination (the ``ConstrainedPrioritySet``
idea of Kafka Streams), so each pick is ``O(Z log M)`` for ``Z`` tag combinations;
no loop over members x tasks.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import compress, repeat
from operator import ne

from streamjoin.assignor.conflicts import NO_CLAIM, Claims
from streamjoin.assignor.grouping import Group, Grouping
from streamjoin.assignor.model import AssignorConfig, MemberState
from streamjoin.errors import InternalError

#: rank of a previous standby holder that reports no lag: after every reported lag
_UNKNOWN_LAG = 1 << 62


def standby_count(config: AssignorConfig, eligible: int) -> int:
    """Standbys per task: the configured replicas, capped at eligible members minus one."""
    return max(0, min(config.standby_replicas, eligible - 1))


def claimed_standbys(member: MemberState, group: Group) -> set[int]:
    """Tasks of ``group`` whose changelog partitions ``member`` hosted as a standby."""
    out: set[int] = set()
    for topic in group.changelogs:
        parts = member.standby.get(topic)
        if parts:
            out.update(parts)
    if out and max(out) >= group.tasks:
        out = {p for p in out if p < group.tasks}
    return out


class TagRule:
    """Per-key distinct-value targets of one group (KIP-708 style spread)."""

    def __init__(self, members: Sequence[MemberState], eligible: Sequence[int], k: int) -> None:
        keys = sorted({key for i in eligible for key in members[i].tags})
        self.keys = keys
        self.values: dict[int, tuple[str | None, ...]] = {
            i: tuple(members[i].tags.get(key) for key in keys) for i in eligible
        }
        distinct = [len({self.values[i][j] for i in eligible}) for j in range(len(keys))]
        self.target = [min(k + 1, d) for d in distinct]
        self.k = k
        #: tag rule is a no-op when no key offers more than one value
        self.active = any(d > 1 for d in distinct)

    def ok(self, values: tuple[str | None, ...], active: int, chosen: list[int]) -> bool:
        """Can the task still reach the spread target if a member with ``values`` is picked?"""
        remaining = self.k - len(chosen) - 1
        for j, target in enumerate(self.target):
            used = {self.values[active][j], values[j]}
            used.update(self.values[c][j] for c in chosen)
            if len(used) + remaining < target:
                return False
        return True

    def spread(self, active: int, chosen: Sequence[int]) -> list[int]:
        """Distinct values per key covered by the active and ``chosen``."""
        return [
            len({self.values[active][j]} | {self.values[c][j] for c in chosen})
            for j in range(len(self.keys))
        ]


def assign_standbys(
    grouping: Grouping,
    members: Sequence[MemberState],
    claims: Claims,
    owners: Sequence[Sequence[int]],
    config: AssignorConfig,
) -> list[list[list[int]] | None]:
    """Per group (None if stateless or no replicas): per task, its standby members."""
    out: list[list[list[int]] | None] = []
    global_load = [0] * len(members)
    for group, eligible in zip(grouping.groups, grouping.eligible, strict=True):
        k = standby_count(config, len(eligible))
        if not group.changelogs or not k or not group.tasks:
            out.append(None)
            continue
        out.append(
            _assign_group(
                group,
                eligible,
                members,
                claims.owners[group.index],
                owners[group.index],
                k,
                config,
                global_load,
            )
        )
    return out


def _assign_group(
    group: Group,
    eligible: Sequence[int],
    members: Sequence[MemberState],
    prev_active: Sequence[int],
    active: Sequence[int],
    k: int,
    config: AssignorConfig,
    global_load: list[int],
) -> list[list[int]]:
    n = group.tasks
    lo, extra = divmod(k * n, len(eligible))
    load = [0] * len(members)
    tags = TagRule(members, eligible, k)
    single, several = _state_candidates(group, eligible, members, prev_active, active)

    # Keep phase: state holders first, in task order, smallest lag first, within balance
    # (floor for everyone, the `extra` +1 slots to whoever fills them first) and tag spread.
    # Unless balance or tags get in the way, each task keeps its best k (counted in bulk).
    check_tags = tags.active
    kept = None if check_tags else _keep_unconstrained(single, several, k, lo, extra)
    if kept is not None:
        counts, over = kept
        chosen = [[] if i is None else [i] for i in map(single.get, range(n))]
        for p, ranked in several.items():
            chosen[p].extend(i for _, i in ranked[:k])
        for i, c in counts.items():
            load[i] = c
            global_load[i] += c
        extra -= over
    else:
        chosen = [[] for _ in range(n)]
    in_order = sorted(single.keys() | several.keys()) if kept is None else []
    for p in in_order:
        ranked = several.get(p) or [(0, single[p])]  # alone, its lag does not matter
        if len(ranked) > 1:
            ranked.sort()
        a = active[p]
        mine = chosen[p]
        for _, i in ranked:
            li = load[i]
            if i == a or li > lo or (li == lo and not extra):
                continue
            if check_tags and not tags.ok(tags.values[i], a, mine):
                continue
            if li == lo:
                extra -= 1
            load[i] = li + 1
            global_load[i] += 1
            mine.append(i)
            if len(mine) == k:
                break
    hi_slots = [extra]

    def has_room(i: int) -> bool:
        return load[i] < lo or (load[i] == lo and hi_slots[0] > 0)

    def take(i: int, p: int) -> None:
        if load[i] == lo:
            hi_slots[0] -= 1
        load[i] += 1
        global_load[i] += 1
        chosen[p].append(i)

    # Fill phase: least loaded (this group, then overall, then id) per tag combination.
    by_values: dict[tuple[str | None, ...], list[tuple[int, int, int]]] = {}
    for i in eligible:
        by_values.setdefault(tags.values[i], []).append((load[i], global_load[i], i))
    buckets = [(v, by_values[v]) for v in sorted(by_values, key=_tag_sort_key)]
    bucket_of: dict[int, list[tuple[int, int, int]]] = {}
    for _, heap in buckets:
        heapq.heapify(heap)
        for entry in heap:
            bucket_of[entry[2]] = heap
    plain = buckets[0][1] if len(buckets) == 1 else None
    # only the tasks still short of k standbys, in task order
    for p in compress(range(n), map(k.__gt__, map(len, chosen))):
        mine = chosen[p]
        a = active[p]
        while len(mine) < k:
            if plain is not None:
                i = _pick_plain(plain, a, mine)
            else:
                i = _pick_tagged(buckets, a, mine, tags, has_room)
            take(i, p)
            heapq.heappush(bucket_of[i], (load[i], global_load[i], i))

    _repair(eligible, active, chosen, load, global_load, tags)
    return chosen


#: per task, its state candidates: the member where there is one, (lag, member) where several
_Candidates = tuple[dict[int, int], dict[int, list[tuple[int, int]]]]


def _state_candidates(
    group: Group,
    eligible: Sequence[int],
    members: Sequence[MemberState],
    prev_active: Sequence[int],
    active: Sequence[int],
) -> _Candidates:
    """Per task, (lag, member) of members other than its active that likely hold its state.

    Previous standby holders, members reporting a lag, and the previous active
    owner when it loses the active (lag 0 unless reported). A holder that reports
    no lag ranks after every reported lag. The task's active is left out (it
    cannot be its own standby). Tasks with a single candidate, the usual case,
    are kept apart from those with several, and their lag is looked up only once
    a second candidate turns up, so that each member's candidates are merged
    with a few dict and set operations instead of a loop per task.
    """
    n = group.tasks
    single: dict[int, int] = {}
    several: dict[int, list[tuple[int, int]]] = {}
    changelogs = group.changelogs
    for i in eligible:
        m = members[i]
        keys = claimed_standbys(m, group)
        reported = [m.state_lag[t] for t in changelogs if t in m.state_lag]
        if not reported and not keys:
            continue
        for lags in reported:
            keys.update(lags.keys())
        if keys and max(keys) >= n:
            keys = {p for p in keys if p < n}
        not_active = compress(keys, map(ne, map(active.__getitem__, keys), repeat(i)))
        entries = dict.fromkeys(not_active, i)
        if several:
            for p in entries.keys() & several.keys():
                del entries[p]
                several[p].append((_candidate_lag(m, changelogs, p), i))
        for p in entries.keys() & single.keys():
            del entries[p]
            j = single.pop(p)
            several[p] = [
                (_candidate_lag(members[j], changelogs, p), j),
                (_candidate_lag(m, changelogs, p), i),
            ]
        single.update(entries)
    eligible_set = set(eligible)
    for p in compress(range(n), map(ne, prev_active, active)):
        o = prev_active[p]
        if o == NO_CLAIM or o not in eligible_set:
            continue
        got = several.get(p)
        if got is not None:
            if all(j != o for _, j in got):
                got.append((0, o))
            continue
        one = single.get(p)
        if one is None:
            single[p] = o
        elif one != o:
            del single[p]
            several[p] = [(_candidate_lag(members[one], changelogs, p), one), (0, o)]
    return single, several


def _candidate_lag(member: MemberState, changelogs: Sequence[str], p: int) -> int:
    """Task p's lag on a candidate: the sum of what it reports, else unknown."""
    reported = member.state_lag
    parts = [reported[t][p] for t in changelogs if t in reported and p in reported[t]]
    return sum(parts) if parts else _UNKNOWN_LAG


def _keep_unconstrained(
    single: Mapping[int, int],
    several: Mapping[int, list[tuple[int, int]]],
    k: int,
    lo: int,
    extra: int,
) -> tuple[Counter[int], int] | None:
    """Picks per member if every task could keep its best ``k`` candidates, else None.

    When no member would get more than ``lo + 1`` and at most ``extra`` would get
    ``lo + 1``, the keep phase never refuses a candidate for balance, so (without
    tags) its result is each task's best ``k``: counted here in bulk instead of
    task by task. Sorts ``several`` in place. Returns the counts and how many
    members use a ``+1`` slot.
    """
    counts: Counter[int] = Counter(single.values())
    for ranked in several.values():
        ranked.sort()
        counts.update(i for _, i in ranked[:k])
    if not counts:
        return counts, 0
    if max(counts.values()) > lo + 1:
        return None
    over = sum(1 for c in counts.values() if c > lo)
    return (counts, over) if over <= extra else None


def _tag_sort_key(values: tuple[str | None, ...]) -> tuple[tuple[int, str], ...]:
    return tuple((0, "") if v is None else (1, v) for v in values)


def _pick_plain(heap: list[tuple[int, int, int]], a: int, mine: list[int]) -> int:
    """Least loaded member that is neither the active nor already a standby of the task.

    Room needs no check: the heap top has the lowest load, so if it has no room
    nobody has, and balance then yields to the distinctness rule.
    """
    aside = []
    while heap[0][2] == a or heap[0][2] in mine:
        aside.append(heapq.heappop(heap))
    i = heapq.heappop(heap)[2]
    for entry in aside:
        heapq.heappush(heap, entry)
    return i


def _pick_tagged(
    buckets: list[tuple[tuple[str | None, ...], list[tuple[int, int, int]]]],
    a: int,
    mine: list[int],
    tags: TagRule,
    has_room: Callable[[int], bool],
) -> int:
    """Best bucket top: tag spread kept and room left, then spread only, then room only."""
    best: tuple[int, tuple[int, int, int]] | None = None
    best_heap: list[tuple[int, int, int]] | None = None
    aside: list[tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]] = []
    for values, heap in buckets:
        popped = []
        while heap and (heap[0][2] == a or heap[0][2] in mine):
            popped.append(heapq.heappop(heap))
        if popped:
            aside.append((heap, popped))
        if not heap:
            continue
        top = heap[0]
        spread_ok = tags.ok(values, a, mine)
        room = has_room(top[2])
        tier = 0 if spread_ok and room else 1 if spread_ok else 2 if room else 3
        if best is None or (tier, top) < best:
            best = (tier, top)
            best_heap = heap
    if best is None or best_heap is None:
        raise InternalError("no standby candidate although standbys < eligible members")
    heapq.heappop(best_heap)
    for heap, popped in aside:
        for entry in popped:
            heapq.heappush(heap, entry)
    return best[1][2]


def _repair(
    eligible: Sequence[int],
    active: Sequence[int],
    chosen: list[list[int]],
    load: list[int],
    global_load: list[int],
    tags: TagRule,
) -> None:
    """Move standbys from o to m while ``load_o >= load_m + 2`` and the move is allowed."""
    loads = [load[i] for i in eligible]
    if max(loads) - min(loads) < 2:
        return
    tasks_of: dict[int, list[int]] = {i: [] for i in eligible}
    for p, mine in enumerate(chosen):
        for i in mine:
            tasks_of[i].append(p)
    while True:
        order = sorted(eligible, key=lambda i: (load[i], i))
        move = _find_move(order, active, chosen, load, tasks_of, tags)
        if move is None:
            return
        p, o, m = move
        mine = chosen[p]
        mine[mine.index(o)] = m
        tasks_of[o].remove(p)
        tasks_of[m].append(p)
        load[o] -= 1
        global_load[o] -= 1
        load[m] += 1
        global_load[m] += 1


def _find_move(
    order: Sequence[int],
    active: Sequence[int],
    chosen: list[list[int]],
    load: list[int],
    tasks_of: dict[int, list[int]],
    tags: TagRule,
) -> tuple[int, int, int] | None:
    for m in order:
        for o in reversed(order):
            if load[o] < load[m] + 2:
                break
            for p in tasks_of[o]:
                if standby_move_allowed(p, o, m, active, chosen, tags):
                    return p, o, m
    return None


def standby_move_allowed(
    p: int,
    o: int,
    m: int,
    active: Sequence[int],
    chosen: Sequence[Sequence[int]],
    tags: TagRule,
) -> bool:
    """May task p's standby move from o to m without breaking distinctness or tag spread?"""
    mine = chosen[p]
    if active[p] == m or m in mine:
        return False
    if not tags.active:
        return True
    after = [m if c == o else c for c in mine]
    before_spread = tags.spread(active[p], mine)
    after_spread = tags.spread(active[p], after)
    return all(x >= y for x, y in zip(after_spread, before_spread, strict=True))
