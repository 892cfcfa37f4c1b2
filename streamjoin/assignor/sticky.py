"""Active task placement: balanced first, then sticky, then state-aware (pure).

Two paths, chosen by the subscriptions:

*Equal subscriptions* (every group with tasks has the same eligible members):
quota arithmetic, as in Kafka's ``UniformHomogeneousAssignmentBuilder``. Member
i's share is ``T * cap_i / C``; everyone gets the floor, and the ``R`` leftover
+1 quotas go first to members whose previous task count exceeds their floor
(each such +1 saves exactly one move); the others are spent while placing, where
caught-up state is, and what is left goes to members holding caught-up state for
orphaned tasks, then by member id. Phase 1 places orphans *and* the tasks of
over-quota members by the receivers' state (so what a member sheds is what
someone else can take over without a restore, its own stale tasks first, and a
returning owner's own tasks first), then moves caught-up orphans along chains
until as many as possible have a caught-up owner (:mod:`streamjoin.assignor.matching`);
phase 2 revokes what is still over quota by spread and fills the rest
round-robin. The result reaches
``min_possible_moves = sum(max(0, prev_i - quota_i))``, which is a lower bound
for every floor/ceil assignment, so it is exact.

*Unequal subscriptions*: keep every valid previous owner, place orphans on the
least loaded eligible member (capacity-weighted), then move tasks while some
task could go from o to an eligible m with ``(n_o-1)/c_o >= (n_m+1)/c_m``
(KIP-54's balance, weighted), worst overload first across groups, then group
by group. Every such move lowers ``sum(n_i**2 / c_i)``, so the loop ends, and
it ends exactly when the balance condition holds. Moves prefer the cheapest
task in moves, then the one the taker holds the best state for.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamjoin.assignor.conflicts import NO_CLAIM, Claims, claimed_partitions
from streamjoin.assignor.grouping import Group, Grouping
from streamjoin.assignor.lag import CAUGHT_UP, HAS_STATE, Holder, state_holders, task_lag
from streamjoin.assignor.matching import Rooms, augment, caught_up_lookup
from streamjoin.assignor.model import AssignorConfig, MemberState
from streamjoin.errors import InternalError

UNASSIGNED = -1


@dataclass
class ActivePlan:
    """New active owner per group and task (``-1`` where the group has no eligible member)."""

    owners: list[list[int]]
    #: exact minimum number of moves among balanced assignments, or None (unequal subscriptions)
    min_possible_moves: int | None
    #: (group, task) -> member that should warm up its state (high-availability mode)
    warmups: dict[tuple[int, int], int] = field(default_factory=dict)
    #: per member, its quota (equal subscriptions only); for explain and stats
    quotas: dict[int, int] | None = None


def assign_actives(
    grouping: Grouping,
    members: Sequence[MemberState],
    claims: Claims,
    config: AssignorConfig,
) -> ActivePlan:
    """Place every assignable task on exactly one eligible member."""
    live = [
        g.index for g, e in zip(grouping.groups, grouping.eligible, strict=True) if e and g.tasks
    ]
    live_set = set(live)
    owners = [
        list(claims.owners[g.index]) if g.index in live_set else [UNASSIGNED] * g.tasks
        for g in grouping.groups
    ]
    eligible_sets = {grouping.eligible[g] for g in live}
    if len(eligible_sets) <= 1:
        plan = _assign_equal(grouping, members, claims, config, live, owners)
    else:
        plan = _assign_unequal(grouping, members, claims, config, live, owners)
    if config.high_availability:
        _hold_for_warmup(grouping, members, claims, config, live, plan)
    return plan


# --------------------------------------------------------------------------- equal subscriptions


def _assign_equal(
    grouping: Grouping,
    members: Sequence[MemberState],
    claims: Claims,
    config: AssignorConfig,
    live: list[int],
    owners: list[list[int]],
) -> ActivePlan:
    if not live:
        return ActivePlan(owners=owners, min_possible_moves=0, quotas={})
    eligible = grouping.eligible[live[0]]
    groups = grouping.groups
    total = sum(groups[g].tasks for g in live)
    cap = {i: members[i].capacity for i in eligible}
    cap_sum = sum(cap.values())

    prev: Counter[int] = Counter()
    for g in live:
        prev.update(owners[g])
    prev.pop(UNASSIGNED, None)

    # State holders of orphaned tasks: they steer the leftover +1 quotas and phase 2.
    orphans = {g: [p for p, o in enumerate(owners[g]) if o == UNASSIGNED] for g in live}
    holders: dict[int, dict[int, list[Holder]]] = {
        g: state_holders(
            groups[g], members, eligible, set(orphans[g]), config.acceptable_recovery_lag
        )
        for g in live
    }
    caught_up_orphans: Counter[int] = Counter()
    for per_task in holders.values():
        for hs in per_task.values():
            caught_up_orphans.update(i for tier, _, i in hs if tier == CAUGHT_UP)

    quota = {i: total * cap[i] // cap_sum for i in eligible}
    extra = total - sum(quota.values())
    fractional = [i for i in eligible if (total * cap[i]) % cap_sum] if extra else []
    fractional.sort(key=lambda i: (prev[i] <= quota[i], -caught_up_orphans[i], i))
    spare = []
    for i in fractional:
        if extra and prev[i] > quota[i]:  # a +1 here saves a move
            quota[i] += 1
            extra -= 1
        else:
            spare.append(i)
    # The other +1 quotas are spent where caught-up state is while placing (matching.py).
    min_moves = sum(max(0, prev[i] - quota[i]) for i in eligible)

    # Phase 1: who gives up how many, who has how much room.
    shed = {i: prev[i] - quota[i] for i in eligible if prev[i] > quota[i]}
    room = {i: max(0, quota[i] - prev[i]) for i in eligible}
    rooms = Rooms(room, spare, extra)

    # Phase 2: one state-first pass over orphans *and* the tasks of over-quota members.
    # A shed task goes where its state is; the exact number of moves is unaffected
    # because every over-quota member still gives up exactly shed[i] tasks.
    receivers = [i for i in eligible if rooms.can_take(i)]
    reclaims = _Reclaims(grouping.groups, members)
    offers = [
        (tier, 0, reclaims.rank(i, g, p), 0, lag, g, p, i)
        for g in live
        for p, hs in holders[g].items()
        for tier, lag, i in hs
        if rooms.can_take(i)
    ]
    if shed and receivers:
        offers.extend(
            _shed_offers(grouping, members, config, live, owners, shed, receivers, reclaims)
        )
    offers.sort()
    placed: dict[int, list[tuple[int, int]]] = {}  # caught-up orphans each member took
    for tier, *_, g, p, i in offers:
        if not rooms.can_take(i):
            continue
        o = owners[g][p]
        if o != UNASSIGNED:
            if shed.get(o, 0) <= 0:
                continue  # already placed, or its owner is done shedding
            shed[o] -= 1
        elif tier == CAUGHT_UP:
            placed.setdefault(i, []).append((g, p))
        owners[g][p] = i
        rooms.take(i)
    if placed or rooms.plus:
        unplaced = ((g, p) for g in live for p in sorted(holders[g]) if owners[g][p] == UNASSIGNED)
        augment(
            unplaced,
            owners,
            caught_up_lookup(holders, CAUGHT_UP),
            placed,
            rooms,
            lambda i, t: reclaims.rank(i, *t),
        )
    for i in spare:  # +1 quotas nobody's state needed, in the order above
        if rooms.budget and i in rooms.spare:
            rooms.grant(i)
    for i in rooms.plus:
        quota[i] += 1

    # What over-quota members still have to give up goes by spread (no receiver holds
    # state for it, or the receivers that do are full).
    rest = {i: n for i, n in shed.items() if n > 0}
    if rest:
        _revoke(live, owners, rest, cap, cap_sum)
    pool = {g: [p for p, o in enumerate(owners[g]) if o == UNASSIGNED] for g in live}

    # Then round-robin over members with room: consecutive tasks of a group land on
    # different members, and the biggest rooms fill first.
    order = sorted((i for i in eligible if room[i] > 0), key=lambda i: (-room[i], i))
    slots: list[int] = []
    depth = 0
    while order:
        slots.extend(order)
        depth += 1
        while order and room[order[-1]] <= depth:
            order.pop()
    it = iter(slots)
    for g in live:
        own = owners[g]
        for p in pool[g]:
            own[p] = next(it)
    return ActivePlan(owners=owners, min_possible_moves=min_moves, quotas=quota)


def _shed_offers(
    grouping: Grouping,
    members: Sequence[MemberState],
    config: AssignorConfig,
    live: list[int],
    owners: list[list[int]],
    shed: dict[int, int],
    receivers: list[int],
    reclaims: _Reclaims,
) -> list[Offer]:
    """Offers for over-quota members' tasks a receiver has state for.

    Only the receivers' own lag reports are visited (``state_holders`` intersects
    them with the sheddable tasks), so the cost follows what receivers report,
    not members x tasks; the owner's own lag is looked up once per offered task.
    """
    acceptable = config.acceptable_recovery_lag
    out: list[Offer] = []
    for g in live:
        group = grouping.groups[g]
        if not group.changelogs:
            continue
        own = owners[g]
        sheddable = {p for p, o in enumerate(own) if o in shed}
        if not sheddable:
            continue
        found = state_holders(group, members, receivers, sheddable, acceptable)
        for p, hs in found.items():
            kept = task_lag(members[own[p]], group, p, acceptable)
            keeps = kept is not None and kept[0] == CAUGHT_UP
            stale = -kept[1] if keeps and kept is not None else 0
            out.extend(
                (tier, int(keeps), reclaims.rank(i, g, p), stale, lag, g, p, i)
                for tier, lag, i in hs
            )
    return out


#: (receiver tier, owner caught up, receiver did not claim it, minus the owner's lag when
#: caught up, receiver's lag, group, task, receiver): sorts the best placement first. An
#: owner keeps first the tasks it is caught up on, and of those the freshest.
Offer = tuple[int, int, int, int, int, int, int, int]


class _Reclaims:
    """Did a receiver claim a task it lost in the conflict (a returning previous owner)?"""

    def __init__(self, groups: Sequence[Group], members: Sequence[MemberState]) -> None:
        self.groups = groups
        self.members = members
        self._claimed: dict[tuple[int, int], set[int]] = {}

    def rank(self, i: int, g: int, p: int) -> int:
        """0 when member i claims task p of group g, else 1 (sorts returning owners first)."""
        claimed = self._claimed.get((i, g))
        if claimed is None:
            claimed = claimed_partitions(self.members[i], self.groups[g])
            self._claimed[(i, g)] = claimed
        return 0 if p in claimed else 1


def _revoke(
    live: list[int],
    owners: list[list[int]],
    over: dict[int, int],
    cap: dict[int, int],
    cap_sum: int,
) -> None:
    """Take ``over[i]`` tasks away from each over-quota member i (highest partitions first)."""
    held: dict[int, dict[int, list[int]]] = {i: {} for i in over}
    for g in live:
        for p, o in enumerate(owners[g]):
            if o in held:
                held[o].setdefault(g, []).append(p)
    sizes = {g: len(owners[g]) for g in live}
    for i, count in over.items():
        per_group = held[i]
        heap = [(-(len(ps) - sizes[g] * cap[i] / cap_sum), g) for g, ps in per_group.items()]
        heapq.heapify(heap)
        for _ in range(count):
            excess, g = heapq.heappop(heap)
            p = per_group[g].pop()
            owners[g][p] = UNASSIGNED
            if per_group[g]:
                heapq.heappush(heap, (excess + 1.0, g))


# ------------------------------------------------------------------------- unequal subscriptions


def _assign_unequal(
    grouping: Grouping,
    members: Sequence[MemberState],
    claims: Claims,
    config: AssignorConfig,
    live: list[int],
    owners: list[list[int]],
) -> ActivePlan:
    groups = grouping.groups
    cap = [m.capacity for m in members]
    count = [0] * len(members)
    for g in live:
        for i, c in Counter(owners[g]).items():
            if i != UNASSIGNED:
                count[i] += c
    # Groups with the fewest eligible members first: they have the least freedom.
    order = sorted(live, key=lambda g: (len(grouping.eligible[g]), g))

    for g in order:
        own = owners[g]
        orphans = [p for p, o in enumerate(own) if o == UNASSIGNED]
        if not orphans:
            continue
        eligible = grouping.eligible[g]
        holders = state_holders(
            groups[g], members, eligible, set(orphans), config.acceptable_recovery_lag
        )
        heap = [((count[i] + 1) / cap[i], i, count[i]) for i in eligible]
        heapq.heapify(heap)
        for p in orphans:
            while heap[0][2] != count[heap[0][1]]:
                heapq.heappop(heap)
            low = heap[0][1]
            chosen = low
            for _, _, h in holders.get(p, ()):
                # a state holder is fine when it would not be movable to the least loaded
                if count[h] * cap[low] < (count[low] + 1) * cap[h]:
                    chosen = h
                    break
            own[p] = chosen
            count[chosen] += 1
            heapq.heappush(heap, ((count[chosen] + 1) / cap[chosen], chosen, count[chosen]))

    donate = _Donation(groups, members, claims.owners, config.acceptable_recovery_lag)
    _relieve_worst_first(grouping, live, owners, count, cap, donate)
    moved = True
    while moved:
        moved = False
        for g in order:
            eligible = grouping.eligible[g]
            moved |= _balance_group(g, eligible, owners[g], count, cap, donate)
    return ActivePlan(owners=owners, min_possible_moves=None)


class _Donation:
    """Which task a donor gives a taker: the cheapest in moves, then the best for state.

    Cost: the taker's own previous task undoes a move (-1); a task the donor did
    not previously own costs nothing (0); the donor's previous task costs one
    move (+1). Among equal costs, the task the taker holds the best state for
    (caught up, smallest lag; then any state), then the highest partition.
    """

    def __init__(
        self,
        groups: Sequence[Group],
        members: Sequence[MemberState],
        prev: Sequence[Sequence[int]],
        acceptable_recovery_lag: int,
    ) -> None:
        self.groups = groups
        self.members = members
        self.prev = prev
        self.acceptable = acceptable_recovery_lag

    def pick(self, g: int, mine: list[int], o: int, m: int) -> tuple[int, int]:
        """(cost, index in ``mine``) of the task o should give m in group g."""
        prev = self.prev[g]
        group = self.groups[g]
        taker = self.members[m]
        stateful = bool(group.changelogs and taker.state_lag)
        best: tuple[int, int, int, int] | None = None
        for k in range(len(mine) - 1, -1, -1):
            owner = prev[mine[k]]
            if owner == m:
                return -1, k
            cost = 1 if owner == o else 0
            if best is not None and best[0] < cost:
                continue
            tier, lag = _NO_STATE
            if stateful:
                found = task_lag(taker, group, mine[k], self.acceptable)
                if found is not None:
                    tier, lag = found
            key = (cost, tier, lag, -k)
            if best is None or key < best:
                best = key
        if best is None:
            raise InternalError("a donor has no task to give")  # callers never pass an empty list
        return best[0], -best[3]


#: sorts after every real (tier, lag)
_NO_STATE = (HAS_STATE + 1, 0)


def _relieve_worst_first(
    grouping: Grouping,
    live: list[int],
    owners: list[list[int]],
    count: list[int],
    cap: list[int],
    donate: _Donation,
) -> None:
    """Relieve the most overloaded member first, across all groups.

    Balancing group by group can move a task towards a member that a heavier
    member (in another group) then needs as well, costing an extra move. Here
    the member with the highest ``(n-1)/c`` gives one task to a member it may
    move it to (KIP-54's condition), the cheapest donation first, then the least
    loaded taker. Stops at the first donor nothing can be moved from; the
    per-group passes that follow finish the job, so balance never depends on
    this heuristic. Per move: the donor's groups and a heap push per group.
    """
    held: dict[int, dict[int, list[int]]] = {}
    member_groups: dict[int, list[int]] = {}
    takers: dict[int, list[tuple[float, int, int]]] = {}
    for g in live:
        for p, o in enumerate(owners[g]):
            held.setdefault(o, {}).setdefault(g, []).append(p)
        heap = []
        for i in grouping.eligible[g]:
            member_groups.setdefault(i, []).append(g)
            heap.append(((count[i] + 1) / cap[i], i, count[i]))
        heapq.heapify(heap)
        takers[g] = heap
    donors = [(-(count[o] - 1) / cap[o], o, count[o]) for o in held]
    heapq.heapify(donors)
    while donors:
        _, o, n = donors[0]
        if n != count[o]:
            heapq.heappop(donors)
            continue
        best: tuple[int, float, int, int, int] | None = None
        for g, mine in held[o].items():
            if not mine:
                continue
            heap = takers[g]
            while heap[0][2] != count[heap[0][1]]:
                heapq.heappop(heap)
            key, m, _ = heap[0]
            if m == o or (count[o] - 1) * cap[m] < (count[m] + 1) * cap[o]:
                continue
            cost, k = donate.pick(g, mine, o, m)
            option = (cost, key, m, g, k)
            if best is None or option < best:
                best = option
        if best is None:
            return
        _, _, m, g, k = best
        p = held[o][g].pop(k)
        owners[g][p] = m
        held.setdefault(m, {}).setdefault(g, []).append(p)
        count[o] -= 1
        count[m] += 1
        for i in (o, m):
            heapq.heappush(donors, (-(count[i] - 1) / cap[i], i, count[i]))
            entry = ((count[i] + 1) / cap[i], i, count[i])
            for h in member_groups[i]:
                heapq.heappush(takers[h], entry)


def _balance_group(
    g: int,
    eligible: Sequence[int],
    own: list[int],
    count: list[int],
    cap: list[int],
    donate: _Donation,
) -> bool:
    """Move tasks of one group while KIP-54's weighted condition is violated; True if any moved."""
    tasks: dict[int, list[int]] = {}
    for p, o in enumerate(own):
        tasks.setdefault(o, []).append(p)
    donors = [(-(count[o] - 1) / cap[o], o, count[o]) for o in tasks]
    takers = [((count[m] + 1) / cap[m], m, count[m]) for m in eligible]
    heapq.heapify(donors)
    heapq.heapify(takers)
    any_moved = False
    while donors and takers:
        while donors and donors[0][2] != count[donors[0][1]]:
            heapq.heappop(donors)
        while takers[0][2] != count[takers[0][1]]:
            heapq.heappop(takers)
        if not donors:
            break
        o = donors[0][1]
        m = takers[0][1]
        if o == m or (count[o] - 1) * cap[m] < (count[m] + 1) * cap[o]:
            break
        mine = tasks[o]
        _, pick = donate.pick(g, mine, o, m)
        p = mine.pop(pick)
        own[p] = m
        tasks.setdefault(m, []).append(p)
        count[o] -= 1
        count[m] += 1
        any_moved = True
        heapq.heappop(donors)
        if mine:
            heapq.heappush(donors, (-(count[o] - 1) / cap[o], o, count[o]))
        heapq.heappush(donors, (-(count[m] - 1) / cap[m], m, count[m]))
        heapq.heappush(takers, ((count[o] + 1) / cap[o], o, count[o]))
        heapq.heappush(takers, ((count[m] + 1) / cap[m], m, count[m]))
    return any_moved


# ------------------------------------------------------------------------ high availability


def _hold_for_warmup(
    grouping: Grouping,
    members: Sequence[MemberState],
    claims: Claims,
    config: AssignorConfig,
    live: list[int],
    plan: ActivePlan,
) -> None:
    """KIP-441: keep a task on a caught-up member while its balanced target warms up.

    Only for stateful groups, only when the balanced target is not caught up and
    another member is (the previous owner, else the best caught-up holder), and at
    most ``max_warmup_replicas`` at once. The caller then asks for a follow-up rebalance.
    """
    budget = config.max_warmup_replicas
    for g in live:
        group = grouping.groups[g]
        if not group.changelogs or budget <= 0:
            continue
        own = plan.owners[g]
        prev = claims.owners[g]
        changed = [p for p in range(group.tasks) if own[p] != prev[p]]
        if not changed:
            continue
        holders = state_holders(
            group, members, grouping.eligible[g], set(changed), config.acceptable_recovery_lag
        )
        for p in changed:
            if budget <= 0:
                break
            target = own[p]
            hs = holders.get(p, [])
            if any(i == target and tier == CAUGHT_UP for tier, _, i in hs):
                continue
            keeper = prev[p]
            if keeper == NO_CLAIM:
                keeper = next((i for tier, _, i in hs if tier == CAUGHT_UP), NO_CLAIM)
            if keeper == NO_CLAIM:
                continue
            own[p] = keeper
            plan.warmups[(g, p)] = target
            budget -= 1
