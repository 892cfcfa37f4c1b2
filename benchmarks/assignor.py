"""Assignor benchmark: time, moves and userdata size at small, medium and large scale.

Run from the repository root::

    .venv/bin/python -m benchmarks.assignor [--shapes small,medium,large] [--repeat 3] [--json]

For each shape (members x tasks x co-partitioned topics, the last topic of the
group being its changelog, 1 standby replica) and each round -- *fresh* (no
previous assignment), *churn* (the fresh result as previous assignment, then
one member leaves and a new one joins; members report lag 0 for active and a
spread-out lag for standby changelog partitions) and *churn0* (the same, with
lag 0 for standbys too: every standby caught up) -- it times
``streamjoin.assignor.assign`` and the baselines of ``benchmarks.baselines`` in
this process, on the same ``Scenario`` objects. Each assignor's churn rounds
start from its *own* fresh result. Times are CPU time (``time.process_time``),
the median of ``--repeat`` runs, the assignors' runs interleaved; building the
``Scenario`` is timed separately and not included.

*Leader* rows time what the group leader does for our assignor on each churn
round under the cooperative protocol, step by step as
``StreamjoinAssignor.assign_members`` does it (checked against it once per row):
decode every member's subscription userdata (``read_members``), build the
``Scenario`` (``build_scenario``), assign and validate (``compute_assignment``),
withhold the tasks whose owner changes (``withhold_moves``), and encode every
member's assignment (``member_assignment``). Each member's userdata carries what
it claims and owns (its previous actives; changelog partitions are restored, not
owned), its lags, a host and an instance id; encoding it is the members' work
and is not timed.
With ``--plan`` they also time ``plan()`` on the round's scenario document (as
``streamjoin plan`` reads it, after ``json.loads``): parsing alone, and the whole.

``moved`` counts tasks whose previous owner is still a member and whose owner
changed, computed here the same way for every assignor; ``min`` is the least
any balanced assignment can move (equal capacities and subscriptions, so it is
exact). ``ours/x`` is our time divided by that baseline's time. ``valid``
checks one owner per task, co-partitioning and standby != active; ``core
says`` echoes the moves our assignor reports about itself, as a cross-check.

The userdata line encodes, for a 1,000 members x 10,000 tasks group of two
co-partitioned topics plus a changelog, what every member would send after our
fresh assignment (owned actives and standbys, lags for all of them, host,
instance id, tags) and what it receives, and reports bytes per member.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from benchmarks.baselines import BASELINES, range_assign
from streamjoin.assignor.cooperative import withhold_moves
from streamjoin.assignor.model import (
    AssignmentResult,
    AssignorConfig,
    MemberState,
    Scenario,
)
from streamjoin.assignor.plan import plan, scenario_from_json, scenario_to_json
from streamjoin.assignor.protocol import (
    AssignmentUserdata,
    SubscriptionUserdata,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    next_generation,
)
from streamjoin.runtime.group.assignor_adapter import (
    CONSUMER_PROTOCOL_VERSION,
    StreamjoinAssignor,
    Vetted,
    build_scenario,
    compute_assignment,
    member_assignment,
    read_members,
)

AssignFn = Callable[[Scenario], AssignmentResult]


@dataclass(frozen=True)
class Shape:
    name: str
    members: int
    tasks: int
    topics: int  # co-partitioned topics, including the one changelog


SHAPES = {
    "small": Shape("small", 10, 100, 2),
    "medium": Shape("medium", 1_000, 10_000, 2),
    "large": Shape("large", 2_000, 100_000, 10),
}
#: the shape of the userdata size measurement: 2 sources + 1 changelog
USERDATA_SHAPE = Shape("userdata", 1_000, 10_000, 3)
CHANGELOG = "changelog"
STANDBY_REPLICAS = 1


def load_ours() -> AssignFn | None:
    """The assignment core, or None if it cannot be imported (baselines still run)."""
    try:
        from streamjoin.assignor import assign
    except ImportError:
        return None
    return assign


# --------------------------------------------------------------------------- scenarios


def topic_names(shape: Shape) -> list[str]:
    return [f"source-{i:02d}" for i in range(shape.topics - 1)] + [CHANGELOG]


def member_id(i: int) -> str:
    return f"w{i:05d}"


def standby_lag(partition: int) -> int:
    """A deterministic, spread-out standby lag (some above acceptable_recovery_lag)."""
    return (partition * 7_919) % 12_000


def fresh_scenario(shape: Shape) -> Scenario:
    topics = topic_names(shape)
    subscribed = frozenset(topics)
    return Scenario(
        topics={t: shape.tasks for t in topics},
        members=tuple(MemberState(member_id(i), subscribed) for i in range(shape.members)),
        copartition=(tuple(topics),),
        changelog_topics=frozenset([CHANGELOG]),
        config=AssignorConfig(standby_replicas=STANDBY_REPLICAS),
    )


#: churn rounds: name -> whether standbys report lag 0 (else ``standby_lag``)
CHURN_ROUNDS = {"churn": False, "churn0": True}


def churn_scenario(
    shape: Shape, fresh: Scenario, previous: AssignmentResult, caught_up: bool = False
) -> Scenario:
    """``previous`` as owned state; member ``members // 2`` leaves, a new one joins.

    Members report lag 0 for their actives' changelog partitions and, for their
    standbys, lag 0 if ``caught_up`` else the spread-out ``standby_lag``.
    """
    generation = next_generation(m.generation for m in fresh.members)
    leaving = member_id(shape.members // 2)
    members: list[MemberState] = []
    for m in fresh.members:
        if m.member_id == leaving:
            continue
        owned = previous.assignments[m.member_id]
        lag = dict.fromkeys(owned.active.get(CHANGELOG, ()), 0)
        standbys = owned.standby.get(CHANGELOG, ())
        lag.update(
            dict.fromkeys(standbys, 0) if caught_up else {p: standby_lag(p) for p in standbys}
        )
        members.append(
            MemberState(
                m.member_id,
                m.topics,
                generation=generation,
                active=owned.active,
                standby=owned.standby,
                state_lag={CHANGELOG: lag} if lag else {},
            )
        )
    members.append(MemberState(member_id(shape.members), fresh.members[0].topics))
    return Scenario(
        topics=fresh.topics,
        members=tuple(members),
        copartition=fresh.copartition,
        changelog_topics=fresh.changelog_topics,
        config=fresh.config,
    )


# --------------------------------------------------------------------------- measures


def previous_owners(scenario: Scenario, topic: str) -> dict[int, str]:
    """Task (partition of ``topic``) -> member claiming it; the benchmark has no conflicts."""
    return {p: m.member_id for m in scenario.members for p in m.active.get(topic, ())}


def count_moves(scenario: Scenario, result: AssignmentResult, topic: str) -> int:
    before = previous_owners(scenario, topic)
    after = {p: mid for mid, a in result.assignments.items() for p in a.active.get(topic, ())}
    return sum(1 for p, owner in before.items() if after.get(p) != owner)


def min_possible_moves(scenario: Scenario, topic: str, tasks: int) -> int:
    """Fewest moves of any balanced assignment with equal capacities and subscriptions.

    Every member gets floor(tasks / n) or one more; the extra ones go to the
    members that previously owned the most, and each member keeps at most its quota.
    """
    n = len(scenario.members)
    quota, extra = divmod(tasks, n)
    owned = sorted((len(m.active.get(topic, ())) for m in scenario.members), reverse=True)
    return sum(max(0, c - quota - (1 if i < extra else 0)) for i, c in enumerate(owned))


def check_valid(scenario: Scenario, result: AssignmentResult, tasks: int) -> str:
    """'ok' or what is wrong: every task exactly one owner, co-partitioned, standby elsewhere."""
    topics = list(scenario.topics)
    owners: dict[int, str] = {}
    for mid, a in result.assignments.items():
        parts = {t: a.active.get(t, ()) for t in topics}
        if len({tuple(ps) for ps in parts.values()}) > 1:
            return f"{mid}: topics not co-partitioned"
        for p in parts[topics[0]]:
            if p in owners:
                return f"task {p} owned by {owners[p]} and {mid}"
            owners[p] = mid
        for p in a.standby.get(CHANGELOG, ()):
            if p in parts[CHANGELOG]:
                return f"{mid}: standby and active for task {p}"
    if len(owners) != tasks:
        return f"{tasks - len(owners)} tasks unowned"
    return "ok"


def timed(fn: Callable[[], Any], repeat: int) -> tuple[Any, list[float]]:
    """Result of the last run and the CPU time of each run (GC collected before each)."""
    results, times = interleaved({"": fn}, repeat)
    return results[""], times[""]


def interleaved(
    fns: Mapping[str, Callable[[], Any]], repeat: int
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Each function ``repeat`` times, taking turns (so that a busy spell on a shared
    machine hits all of them alike): the last result and the CPU time of each run,
    with the GC collected before each run and left enabled during it."""
    results: dict[str, Any] = {}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            results.pop(name, None)
            gc.collect()
            start = time.process_time()
            results[name] = fn()
            times[name].append(time.process_time() - start)
    return results, times


def run_shape(
    shape: Shape, assignors: Mapping[str, AssignFn], repeat: int, leader: bool, plans: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of every assignor and round, and the leader rows of ours (if ``leader``)."""
    rows: list[dict[str, Any]] = []
    leader_rows: list[dict[str, Any]] = []
    fresh, build_times = timed(lambda: fresh_scenario(shape), 1)
    first_topic = topic_names(shape)[0]
    runs = {name: partial(fn, fresh) for name, fn in assignors.items()}
    fresh_results, times = interleaved(runs, repeat)
    for name in assignors:
        rows.append(
            row(
                shape,
                "fresh",
                name,
                fresh,
                fresh_results[name],
                times[name],
                build_times[0],
                first_topic,
            )
        )
    for round_name, caught_up in CHURN_ROUNDS.items():
        churns: dict[str, Scenario] = {}
        builds: dict[str, float] = {}
        for name in assignors:
            build = partial(churn_scenario, shape, fresh, fresh_results[name], caught_up)
            churns[name], churn_build = timed(build, 1)
            builds[name] = churn_build[0]
        runs = {name: partial(fn, churns[name]) for name, fn in assignors.items()}
        results, times = interleaved(runs, repeat)
        for name in assignors:
            rows.append(
                row(
                    shape,
                    round_name,
                    name,
                    churns[name],
                    results[name],
                    times[name],
                    builds[name],
                    first_topic,
                )
            )
        del results
        if leader and "streamjoin" in churns:
            found = leader_row(shape, round_name, churns["streamjoin"], repeat)
            if plans:
                found.update(plan_times(churns["streamjoin"], repeat))
            leader_rows.append(found)
        del churns
    return rows, leader_rows


# --------------------------------------------------------------------------- leader path


def subscriptions(scenario: Scenario) -> dict[str, ConsumerProtocolMemberMetadata]:
    """What every member of ``scenario`` sends when it joins, by Kafka member id."""
    out = {}
    for m in scenario.members:
        userdata = SubscriptionUserdata(
            generation=m.generation,
            active=m.active,
            standby=m.standby,
            state_lag=m.state_lag,
            host=f"{m.member_id}.streamjoin.internal:6066",
            group_instance_id=m.member_id,
            owned={t: ps for t, ps in m.active.items() if t not in scenario.changelog_topics},
        )
        kafka_id = f"{m.member_id}-6f1c2e0a-3b7d-4c55-9e21-8a4b0c9d7e13"
        out[kafka_id] = ConsumerProtocolMemberMetadata(
            CONSUMER_PROTOCOL_VERSION, sorted(m.topics), encode_subscription(userdata)
        )
    return out


#: the leader's steps, in order, as reported
LEADER_STEPS = ("decode", "scenario", "assign+validate", "withhold", "encode")


def leader_round(
    members: Mapping[str, ConsumerProtocolMemberMetadata], like: Scenario
) -> tuple[dict[str, float], Vetted, dict[str, ConsumerProtocolMemberAssignment]]:
    """The cooperative leader's work for one rebalance, as ``assign_members`` does it
    (minus logging): CPU time per step, the vetted result and every assignment."""
    clock = time.process_time
    start = clock()
    states, kafka_ids, owned = read_members(members)
    decoded = clock()
    scenario = build_scenario(
        states, like.topics, like.copartition, like.changelog_topics, like.config
    )
    built = clock()
    generation = next_generation(s.generation for s in states)
    vetted = compute_assignment(scenario)
    assigned = clock()
    result = withhold_moves(vetted.result, owned, scenario.topics, scenario.copartition)
    withheld = clock()
    changelogs = like.changelog_topics
    out = {
        kafka_id: member_assignment(result, member_id, generation, changelogs)
        for member_id, kafka_id in kafka_ids.items()
    }
    encoded = clock()
    steps = (decoded - start, built - decoded, assigned - built, withheld - assigned)
    return dict(zip(LEADER_STEPS, (*steps, encoded - withheld), strict=True)), vetted, out


def same_as_the_adapter(
    members: Mapping[str, ConsumerProtocolMemberMetadata],
    like: Scenario,
    out: Mapping[str, ConsumerProtocolMemberAssignment],
) -> bool:
    """Does ``StreamjoinAssignor.assign_members`` send what ``leader_round`` computed?"""
    assignor = StreamjoinAssignor(
        copartition=like.copartition, changelog_topics=like.changelog_topics, config=like.config
    )
    sent = assignor.assign_members(like.topics, members, cooperative=True)
    return {k: a.encode() for k, a in sent.items()} == {k: a.encode() for k, a in out.items()}


def leader_row(shape: Shape, round_name: str, scenario: Scenario, repeat: int) -> dict[str, Any]:
    members = subscriptions(scenario)
    _, _, out = leader_round(members, scenario)
    if not same_as_the_adapter(members, scenario, out):
        raise AssertionError("leader_round no longer does what assign_members does")
    del out
    runs: list[dict[str, float]] = []
    vetted = None
    for _ in range(repeat):
        vetted = None
        gc.collect()
        steps, vetted, _ = leader_round(members, scenario)
        runs.append(steps)
    assert vetted is not None
    totals = [sum(r.values()) for r in runs]
    return {
        "shape": shape.name,
        "members": shape.members,
        "tasks": shape.tasks,
        "topics": shape.topics,
        "round": round_name,
        "total_s": round(statistics.median(totals), 5),
        "runs_s": [round(t, 5) for t in totals],
        **{
            f"{step}_s": round(statistics.median(r[step] for r in runs), 5) for step in LEADER_STEPS
        },
        "sent": "fallback" if vetted.fallback else "assignor",
        "violations": [f"{v.code.value}: {v.message}" for v in vetted.violations],
        "subscription_bytes": sum(len(m.user_data) for m in members.values()),
    }


def plan_times(scenario: Scenario, repeat: int) -> dict[str, float]:
    """CPU time of ``plan()`` on the scenario's document: parsing it, and the whole call."""
    doc = json.loads(json.dumps(scenario_to_json(scenario)))
    _, parse = timed(partial(scenario_from_json, doc), repeat)
    _, whole = timed(partial(plan, doc), repeat)
    return {
        "plan_parse_s": round(statistics.median(parse), 5),
        "plan_s": round(statistics.median(whole), 5),
    }


def row(
    shape: Shape,
    round_name: str,
    assignor: str,
    scenario: Scenario,
    result: AssignmentResult,
    times: list[float],
    build_s: float,
    topic: str,
) -> dict[str, Any]:
    reported = result.stats
    return {
        "shape": shape.name,
        "members": shape.members,
        "tasks": shape.tasks,
        "topics": shape.topics,
        "round": round_name,
        "assignor": assignor,
        "build_s": round(build_s, 5),
        "assign_s": round(statistics.median(times), 5),  # CPU time
        "runs_s": [round(t, 5) for t in times],
        "moved": count_moves(scenario, result, topic),
        "min_possible_moves": min_possible_moves(scenario, topic, shape.tasks),
        "reported_moved": reported.moved if reported.moved >= 0 else None,
        "reported_min_possible_moves": reported.min_possible_moves,
        "standby_tasks": sum(
            len(a.standby.get(CHANGELOG, ())) for a in result.assignments.values()
        ),
        "valid": check_valid(scenario, result, shape.tasks),
    }


def userdata_sizes(assign: AssignFn) -> dict[str, Any]:
    """Bytes per member of subscription and assignment userdata after a fresh assignment."""
    shape = USERDATA_SHAPE
    scenario = fresh_scenario(shape)
    result = assign(scenario)
    generation = next_generation(m.generation for m in scenario.members)
    subs, assigns = [], []
    for i, (_, owned) in enumerate(sorted(result.assignments.items())):
        lag = dict.fromkeys(owned.active.get(CHANGELOG, ()), 0)
        lag.update((p, standby_lag(p)) for p in owned.standby.get(CHANGELOG, ()))
        sub = SubscriptionUserdata(
            generation=generation,
            active=owned.active,
            standby=owned.standby,
            state_lag={CHANGELOG: lag},
            capacity=1,
            tags={"zone": f"zone-{i % 3}"},
            host=f"worker-{i:04d}.streamjoin.internal:6066",
            group_instance_id=f"worker-{i:04d}",
        )
        subs.append(encode_subscription(sub))
        assigns.append(
            encode_assignment(
                AssignmentUserdata(generation + 1, owned.standby, result.followup_rebalance)
            )
        )
    start = time.perf_counter()
    for data in subs:
        decode_subscription(data)
    decode_s = time.perf_counter() - start
    # What one member would receive if, as in Faust, every assignment carried every host's
    # full assignment (JSON, zlib-compressed) -- the design this protocol avoids.
    full_table = {
        f"worker-{i:04d}.streamjoin.internal:6066": {
            "active": {t: list(ps) for t, ps in owned.active.items()},
            "standby": {t: list(ps) for t, ps in owned.standby.items()},
        }
        for i, (_, owned) in enumerate(sorted(result.assignments.items()))
    }
    full_table_bytes = len(zlib.compress(json.dumps(full_table).encode()))
    sub_sizes = sorted(len(s) for s in subs)
    assign_sizes = sorted(len(a) for a in assigns)
    return {
        "shape": f"{shape.members}x{shape.tasks}x{shape.topics} (2 sources + changelog, 1 standby)",
        "assignor": getattr(assign, "__name__", "?"),
        "subscription_bytes_mean": round(statistics.mean(sub_sizes), 1),
        "subscription_bytes_max": sub_sizes[-1],
        "assignment_bytes_mean": round(statistics.mean(assign_sizes), 1),
        "assignment_bytes_max": assign_sizes[-1],
        "group_total_bytes": sum(sub_sizes) + sum(assign_sizes),
        "full_routing_table_bytes_per_member": full_table_bytes,
        "leader_decode_all_s": round(decode_s, 4),
    }


# --------------------------------------------------------------------------- output


def print_table(rows: list[dict[str, Any]]) -> None:
    ours = {(r["shape"], r["round"]): r["assign_s"] for r in rows if r["assignor"] == "streamjoin"}
    columns = ("shape", "round", "assignor", "build ms", "assign ms", "moved", "min", "ours/x")
    header = "{:<28} {:<6} {:<12} {:>9} {:>10} {:>7} {:>7} {:>7}  valid  core says".format(*columns)
    print(header)
    print("-" * len(header))
    for r in rows:
        mine = ours.get((r["shape"], r["round"]))
        ratio = ""
        if mine is not None and r["assignor"] != "streamjoin" and r["assign_s"] > 0:
            ratio = f"{mine / r['assign_s']:.2f}"
        cells = (
            f"{r['shape']} {r['members']}x{r['tasks']}x{r['topics']}",
            r["round"],
            r["assignor"],
            f"{r['build_s'] * 1e3:.1f}",
            f"{r['assign_s'] * 1e3:.1f}",
            r["moved"],
            r["min_possible_moves"],
            ratio,
        )
        says = ""
        if r["reported_moved"] is not None:
            says = f"moved {r['reported_moved']}, min {r['reported_min_possible_moves']}"
        line = "{:<28} {:<6} {:<12} {:>9} {:>10} {:>7} {:>7} {:>7}  ".format(*cells)
        print(f"{line}{r['valid']:<5}  {says}".rstrip())


def print_leader_table(rows: list[dict[str, Any]]) -> None:
    columns = ("leader (ours)", "round", *(f"{s} ms" for s in LEADER_STEPS), "total ms")
    header = "{:<28} {:<6} {:>10} {:>11} {:>18} {:>12} {:>10} {:>10}  sent".format(*columns)
    print(header)
    print("-" * len(header))
    for r in rows:
        cells = (
            f"{r['shape']} {r['members']}x{r['tasks']}x{r['topics']}",
            r["round"],
            *(f"{r[f'{s}_s'] * 1e3:.1f}" for s in LEADER_STEPS),
            f"{r['total_s'] * 1e3:.1f}",
        )
        line = "{:<28} {:<6} {:>10} {:>11} {:>18} {:>12} {:>10} {:>10}  ".format(*cells)
        sent = r["sent"] + (f", {len(r['violations'])} violation(s)" if r["violations"] else "")
        print(line + sent)
    for r in rows:
        if "plan_s" in r:
            print(
                f"plan() on {r['shape']} {r['round']}: parsing {r['plan_parse_s'] * 1e3:.1f} ms,"
                f" whole call {r['plan_s'] * 1e3:.1f} ms"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,medium,large", help="comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--no-userdata", action="store_true", help="skip the userdata size measurement"
    )
    parser.add_argument("--no-leader", action="store_true", help="skip the leader's protocol path")
    parser.add_argument("--plan", action="store_true", help="also time plan() on the churn rounds")
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or args.repeat < 1:
        parser.error(f"unknown shapes {unknown} (choose from {sorted(SHAPES)}) or bad --repeat")

    ours = load_ours()
    assignors: dict[str, AssignFn] = {}
    notes = []
    if ours is None:
        notes.append("streamjoin.assignor.assign is not available yet: baselines only")
    else:
        assignors["streamjoin"] = ours
    assignors.update(BASELINES)

    rows: list[dict[str, Any]] = []
    leader_rows: list[dict[str, Any]] = []
    for name in names:
        shape_rows, shape_leader = run_shape(
            SHAPES[name], assignors, args.repeat, leader=not args.no_leader, plans=args.plan
        )
        rows.extend(shape_rows)
        leader_rows.extend(shape_leader)
        if not args.json:
            print(f"... {name} done", file=sys.stderr)
    userdata = None
    if not args.no_userdata:
        userdata = userdata_sizes(ours if ours is not None else range_assign)
        if ours is None:
            notes.append("userdata measured on the range baseline's assignment")
    report = {
        "python": platform.python_implementation() + " " + platform.python_version(),
        "machine": platform.machine(),
        "repeat": args.repeat,
        "rows": rows,
        "leader": leader_rows,
        "userdata": userdata,
        "notes": notes,
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0
    print(f"{report['python']} on {report['machine']}, CPU time, median of {args.repeat} run(s)\n")
    print_table(rows)
    if leader_rows:
        print()
        print_leader_table(leader_rows)
    if userdata is not None:
        u = userdata
        print(
            f"\nuserdata at {u['shape']}: subscription {u['subscription_bytes_mean']} B/member"
            f" (max {u['subscription_bytes_max']}), assignment {u['assignment_bytes_mean']}"
            f" B/member (max {u['assignment_bytes_max']}), whole group {u['group_total_bytes']} B;"
            f" leader decodes all subscriptions in {u['leader_decode_all_s']} s"
        )
        print(
            "(for comparison, a full host->assignment table sent to every member would be"
            f" {u['full_routing_table_bytes_per_member']} B/member, zlib-compressed JSON)"
        )
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
