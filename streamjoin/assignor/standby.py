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
3. *Spread per owner* (:mod:`streamjoin.assignor.spread`): the standbys of one
   member's tasks go round-robin over the other eligible members (counts
   differ by at most one), so that any one member's failure can be taken over
   by caught-up copies while staying balanced. Placement in task order can
   leave an owner clustered; a local search then moves or swaps standbys
   (never breaking balance or tag spread) until no owner is.
4. *Stickiness and state*: previous standby holders, the previous active owner
   and members reporting local state keep or get the replica, smallest lag
   first, as long as that keeps the owner's spread (a sticky standby that
   clusters yields: it would cost a restore after a failure, this costs one now).

Cost: a least-loaded heap per distinct tag combination (the
``ConstrainedPrioritySet`` idea of Kafka Streams); a pick scans each heap only
past the owner's own recent picks, so it is about ``O(Z log M)`` for ``Z`` tag
combinations; no loop over members x tasks.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import ne

from streamjoin.assignor.conflicts import NO_CLAIM, Claims
from streamjoin.assignor.grouping import Group, Grouping
from streamjoin.assignor.model import AssignorConfig, MemberState
from streamjoin.assignor.spread import Spread
from streamjoin.errors import InternalError

#: rank of a previous standby holder that reports no lag: after every reported lag
_UNKNOWN_LAG = 1 << 62

#: candidate cycles tried per step of the spread search before it gives up on an owner
_CYCLE_BUDGET = 20_000

#: (load in the group, load overall, turn, member); see _entry
Entry = tuple[int, int, int, int]
Bucket = tuple[tuple[str | None, ...], list[Entry]]  # tag values, heap


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
    replicas = [
        standby_count(config, len(eligible)) if group.changelogs and group.tasks else 0
        for group, eligible in zip(grouping.groups, grouping.eligible, strict=True)
    ]
    spread = Spread(owners, replicas)
    for group, eligible, k in zip(grouping.groups, grouping.eligible, replicas, strict=True):
        if not k:
            out.append(None)
            continue
        spread.begin_group(eligible, len(members))
        out.append(
            _assign_group(
                group,
                eligible,
                members,
                claims.owners[group.index],
                owners[group.index],
                k,
                global_load,
                spread,
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
    global_load: list[int],
    spread: Spread,
) -> list[list[int]]:
    n = group.tasks
    lo, extra = divmod(k * n, len(eligible))
    load = [0] * len(members)
    tags = TagRule(members, eligible, k)
    single, several = _state_candidates(group, eligible, members, prev_active, active)

    # Keep phase: state holders first, in task order, smallest lag first, within balance
    # (floor for everyone, the `extra` +1 slots to whoever fills them first), tag spread
    # and the owner's spread. Unless balance, tags or the owners' spread get in the way,
    # each task keeps its best k (counted in bulk).
    check_tags = tags.active
    kept = None if check_tags else _keep_unconstrained(single, several, k, lo, extra)
    if kept is not None and not spread.keep_all(_picks_by_owner(single, several, k, active)):
        kept = None
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
    keep = spread.keep
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
            if not keep(a, i):
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

    add = spread.add

    def take(i: int, p: int) -> Entry:
        """Place the pick; the member's new heap entry (see _entry)."""
        li = load[i]
        if li == lo:
            hi_slots[0] -= 1
        load[i] = li + 1
        global_load[i] += 1
        add(active[p], i)
        chosen[p].append(i)
        return _entry(i, load, global_load, turn)

    # Fill phase: one heap per tag combination (least loaded in this group, then
    # overall, then by turn, see _entry); see _pick for the order across heaps.
    turn = {i: t for t, i in enumerate(eligible)}
    by_values: dict[tuple[str | None, ...], list[Entry]] = {}
    for i in eligible:
        by_values.setdefault(tags.values[i], []).append(_entry(i, load, global_load, turn))
    buckets = [(v, by_values[v]) for v in sorted(by_values, key=_tag_sort_key)]
    bucket_of: dict[int, list[Entry]] = {}
    for _, heap in buckets:
        heapq.heapify(heap)
        for entry in heap:
            bucket_of[entry[3]] = heap
    plain = buckets[0][1] if len(buckets) == 1 and not tags.active else None
    # only the tasks still short of k standbys, in task order
    for p in compress(range(n), map(k.__gt__, map(len, chosen))):
        mine = chosen[p]
        a = active[p]
        while len(mine) < k:
            if plain is not None:
                i = _pick_plain(plain, a, mine, has_room, spread)
            else:
                i = _pick(buckets, a, mine, tags, has_room, spread)
            heapq.heappush(bucket_of[i], take(i, p))

    _repair(eligible, active, chosen, load, global_load, tags, spread)
    _improve_spread(eligible, active, chosen, load, global_load, tags, spread)
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


def _picks_by_owner(
    single: Mapping[int, int],
    several: Mapping[int, list[tuple[int, int]]],
    k: int,
    active: Sequence[int],
) -> dict[int, dict[int, int]]:
    """Each task's best ``k`` candidates (``several`` sorted), counted per active owner."""
    out: dict[int, dict[int, int]] = {}
    for p, i in single.items():
        a = active[p]
        got = out.get(a)
        if got is None:
            out[a] = {i: 1}
        else:
            got[i] = got.get(i, 0) + 1
    for p, ranked in several.items():
        got = out.setdefault(active[p], {})
        for _, i in ranked[:k]:
            got[i] = got.get(i, 0) + 1
    return out


def _tag_sort_key(values: tuple[str | None, ...]) -> tuple[tuple[int, str], ...]:
    return tuple((0, "") if v is None else (1, v) for v in values)


#: how far the turns rotate per unit of load (see _entry)
_TURN_STRIDE = 3


def _entry(i: int, load: Sequence[int], global_load: Sequence[int], turn: dict[int, int]) -> Entry:
    """Heap entry of member i: least loaded first; among equals, in turns that rotate with
    the load, so that the owners placed in one round of picks get other members in the
    next round. By member id alone, each owner would get the same neighbours every round
    and a pick would pass over them; a stride of 3 keeps the +-1 of skipping a task's own
    active clear of the members an owner got in earlier rounds."""
    return (load[i], global_load[i], (turn[i] - _TURN_STRIDE * load[i]) % len(turn), i)


def _pick_plain(
    heap: list[Entry], a: int, mine: list[int], has_room: Callable[[int], bool], spread: Spread
) -> int:
    """``_pick`` with one heap and no tags (the common case), without building keys.

    Usually the first member that is not the active or a standby of the task is at
    a's lowest level and taken at once; room is looked at only once members were
    passed over (those have room: nobody before them lacked it).
    """
    level, counts = spread.view(a)
    skipped: list[Entry] = []
    passed: list[Entry] = []
    best: Entry | None = None
    while heap:
        entry = heap[0]
        j = entry[3]
        if j == a or j in mine:
            skipped.append(heapq.heappop(heap))
            continue
        c = counts.get(j, 0)
        if c <= level:
            if not passed or has_room(j):
                best = heapq.heappop(heap)
            break  # else one passed over (with room) is better
        if not has_room(j):
            if not passed:  # nobody has room
                best = heapq.heappop(heap)
            break
        passed.append(heapq.heappop(heap))
    if best is None and passed:
        best = min(passed, key=lambda e: counts.get(e[3], 0))  # the first of the fewest
        passed.remove(best)
    if best is None:
        raise InternalError("no standby candidate although standbys < eligible members")
    for entry in skipped:
        heapq.heappush(heap, entry)
    for entry in passed:
        heapq.heappush(heap, entry)
    return best[3]


def _pick(
    buckets: list[Bucket],
    a: int,
    mine: list[int],
    tags: TagRule,
    has_room: Callable[[int], bool],
    spread: Spread,
) -> int:
    """The member for one more standby of a task of owner ``a`` (not a, not in ``mine``).

    Order: tag spread kept and room left (balance), tag spread only, room only;
    then fewest of a's standbys already (spread); then least loaded in the
    group, overall, id. A heap is scanned in load order only until a member at
    a's lowest level (nothing later in it can do better) or one without room
    (nothing later has room); what it passes are a's own recent picks.
    """
    level, counts = spread.view(a)
    best: tuple[int, int, Entry] | None = None
    best_heap: list[Entry] | None = None
    aside: list[tuple[list[Entry], list[Entry]]] = []
    for values, heap in buckets:
        spread_ok = tags.ok(values, a, mine) if tags.active else True
        popped: list[Entry] = []
        while heap:
            entry = heap[0]
            j = entry[3]
            if j == a or j in mine:
                popped.append(heapq.heappop(heap))
                continue
            room = has_room(j)
            c = counts.get(j, 0)
            tier = (0 if room else 1) if spread_ok else (2 if room else 3)
            key = (tier, c, entry)
            if best is None or key < best:
                best = key
                best_heap = heap
            if c <= level or not room:
                break
            popped.append(heapq.heappop(heap))
        if popped:
            aside.append((heap, popped))
    if best is None or best_heap is None:
        raise InternalError("no standby candidate although standbys < eligible members")
    chosen = best[2]
    if best_heap and best_heap[0] == chosen:
        heapq.heappop(best_heap)
    else:
        next(popped for heap, popped in aside if heap is best_heap).remove(chosen)
    for heap, popped in aside:
        for entry in popped:
            heapq.heappush(heap, entry)
    return chosen[3]


def _repair(
    eligible: Sequence[int],
    active: Sequence[int],
    chosen: list[list[int]],
    load: list[int],
    global_load: list[int],
    tags: TagRule,
    spread: Spread,
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
        move = _find_move(order, active, chosen, load, tasks_of, tags, spread)
        if move is None:
            return
        p, o, m = move
        mine = chosen[p]
        mine[mine.index(o)] = m
        spread.remove(active[p], o)
        spread.add(active[p], m)
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
    spread: Spread,
) -> tuple[int, int, int] | None:
    """The first (m, o) pair with an allowed move; of its tasks, the one best for spread."""
    for m in order:
        for o in reversed(order):
            if load[o] < load[m] + 2:
                break
            allowed = [
                p for p in tasks_of[o] if standby_move_allowed(p, o, m, active, chosen, tags)
            ]
            if allowed:
                p = min(
                    allowed,
                    key=lambda p: spread.count(active[p], m) - spread.count(active[p], o),
                )
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


def _improve_spread(
    eligible: Sequence[int],
    active: Sequence[int],
    chosen: list[list[int]],
    load: list[int],
    global_load: list[int],
    tags: TagRule,
    spread: Spread,
) -> None:
    """Move or swap standbys while some owner has 2 more standbys on one member than another.

    Greedy placement in task order can leave an owner's last standby with only one
    member that has room (the one already holding its others). Every step here
    lowers the sum over owners and holders of ``c[a][j]**2`` by at least 2, keeps
    every load within its range (a move goes from a fuller member to a less full
    one; a swap exchanges two standbys of different owners) and never worsens tag
    spread, so it ends. Only owners whose spread is broken are looked at, and only
    when the group's loads differ by at most one: where the repair had to stop
    short of that, moving standbys around could make one movable again.
    """
    loads = [load[i] for i in eligible]
    if max(loads) - min(loads) > 1:
        return
    owners = set(active)
    owners.discard(NO_CLAIM)
    pending = [a for a in sorted(owners) if spread.top(a) - spread.level(a) >= 2]
    if not pending:
        return
    tasks_by_owner: dict[int, list[int]] = {}
    for p, a in enumerate(active):
        if chosen[p]:
            tasks_by_owner.setdefault(a, []).append(p)
    tasks_of: dict[int, set[int]] = {i: set() for i in eligible}
    for p, mine in enumerate(chosen):
        for i in mine:
            tasks_of[i].add(p)

    def move(p: int, o: int, m: int) -> None:
        mine = chosen[p]
        mine[mine.index(o)] = m
        tasks_of[o].discard(p)
        tasks_of[m].add(p)
        load[o] -= 1
        global_load[o] -= 1
        load[m] += 1
        global_load[m] += 1
        spread.remove(active[p], o)
        spread.add(active[p], m)

    def gain(moves: Sequence[tuple[int, int, int]]) -> int:
        """Change of the sum of ``c[owner][j]**2`` if each (owner, from, to) moves one."""
        delta: dict[tuple[int, int], int] = {}
        for b, frm, to in moves:
            delta[(b, frm)] = delta.get((b, frm), 0) - 1
            delta[(b, to)] = delta.get((b, to), 0) + 1
        return sum(
            (spread.count(b, j) + d) ** 2 - spread.count(b, j) ** 2 for (b, j), d in delta.items()
        )

    def improve(a: int) -> list[int]:
        """One step for owner a: the owners it changed (empty if stuck).

        A move (o fuller than m), else a swap with another owner's standby on m,
        else a cycle o -> m -> x -> o through two other standbys (within a budget).
        """
        counts = {j: spread.count(a, j) for j in eligible if j != a}
        high = max(counts.values())
        lows = sorted((j for j, c in counts.items() if c <= high - 2), key=lambda j: (counts[j], j))
        highs = sorted(j for j, c in counts.items() if c == high)

        def steps() -> Iterator[tuple[int, int, int]]:
            for o in highs:
                for p in tasks_by_owner[a]:
                    if o in chosen[p]:
                        for m in lows:
                            if standby_move_allowed(p, o, m, active, chosen, tags):
                                yield p, o, m

        for p, o, m in steps():
            if load[o] > load[m]:
                move(p, o, m)
                return [a]
        for p, o, m in steps():
            for q in sorted(tasks_of[m]):
                b = active[q]
                if b == a or not standby_move_allowed(q, m, o, active, chosen, tags):
                    continue
                if gain([(a, o, m), (b, m, o)]) < 0:
                    move(p, o, m)
                    move(q, m, o)
                    return [a, b]
        budget = _CYCLE_BUDGET
        for p, o, m in steps():
            for q in sorted(tasks_of[m]):
                for x in eligible:
                    if x in (o, m) or not standby_move_allowed(q, m, x, active, chosen, tags):
                        continue
                    for r in sorted(tasks_of[x]):
                        budget -= 1
                        if budget < 0:
                            return []
                        if r in (p, q) or not standby_move_allowed(r, x, o, active, chosen, tags):
                            continue
                        b, c = active[q], active[r]
                        if gain([(a, o, m), (b, m, x), (c, x, o)]) < 0:
                            move(p, o, m)
                            move(q, m, x)
                            move(r, x, o)
                            return [a, b, c]
        return []

    while pending:
        a = pending.pop()
        if spread.top(a) - spread.level(a) < 2:
            continue
        changed = improve(a)
        for b in changed:
            if b not in pending:
                pending.append(b)
