"""A big group on one machine: workers join one at a time; how long until every task runs?

Run from the repository root::

    .venv/bin/python -m benchmarks.group_scale [--workers 30] [--partitions 60]
        [--protocol cooperative] [--heartbeat-ms MS] [--quiet S] [--tree PATH]
        [--bootstrap 127.0.0.1:PORT] [--json]

Workers of ``benchmarks/group_scale_app.py`` (one counting table, ``--partitions``
partitions, 10 events per partition produced first so every changelog has a little state;
the App's defaults otherwise) are started one after the other, each once the group has
settled after the one before (and, with ``--quiet S``, stayed settled S seconds more: a
join into a group that rebalanced less than 10 s ago is heard of sooner: members heartbeat
more often for a while after a rebalance, ``QUICK_HEARTBEAT_WINDOW`` in
``streamjoin/runtime/group/membership.py``). For each join:

* **from spawn s**: from the new process's spawn to the group settled;
* **from join s**: from the moment the new worker's status server first answers (it
  starts right before the worker joins the group) to the group settled;
* **settled** means: every worker's ``/status.json`` answers, no worker is rebalancing, all
  are at one generation, every source partition is active on exactly one worker, and no
  table partition is restoring, pending or warming up; held for ``--hold`` seconds (a later
  rebalance in that time restarts the wait). Polled every 0.2 s: up to 0.2 s late, more
  when workers answer slowly on a busy machine;
* **logs s**: the same from the workers' logs, free of the polling's delay: from the new
  worker's ``status page ... on`` line to the last ``rebalance done: generation G`` line of
  any worker (G: the generation the group settled at) or ``restored`` line of the new
  worker, whichever is later (the moment every task runs, short of starting its agent);
* **rounds**: rebalances of the group for this join (generations);
* **metadata / assignment bytes**: each member's subscription metadata and assignment as
  the group coordinator holds them (DescribeGroups), after the join: the largest and the
  sum over members (the sum is about what the leader receives in its JoinGroup response);
* at the end, **RSS** of every idle worker (``VmRSS``), median and largest.

``--tree PATH`` runs the workers from another source tree (a checkout of older code).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import json
import os
import platform
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.broker import broker
from benchmarks.harness import wait_leaders
from benchmarks.worker_processes import (
    ROOT,
    WatchedWorker,
    group_settled,
    kill_all,
    log_tail,
    median,
    spawn_worker,
    stop_worker,
)

APP_SPEC = "benchmarks.group_scale_app:app"
POLL_S = 0.2
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] ")


def log(message: str) -> None:
    print(f"[group-scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Join:
    workers: int
    status: str = "ok"
    from_spawn_s: float | None = None
    from_join_s: float | None = None
    logs_s: float | None = None
    rounds: int | None = None
    generation: int | None = None
    max_metadata_bytes: int | None = None
    sum_metadata_bytes: int | None = None
    max_assignment_bytes: int | None = None
    sum_assignment_bytes: int | None = None


@dataclass
class Setup:
    bootstrap: str
    tree: Path
    app_id: str
    topic: str
    partitions: int
    workdir: Path
    env: dict[str, str]
    hold: float
    timeout: float
    quiet: float = 0.0


# --------------------------------------------------------------------------- pure


def log_time(line: str) -> float | None:
    """The Unix time a worker's log line was written (its logging format), or None."""
    found = _LOG_TIME.match(line)
    if found is None:
        return None
    return dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def settle_from_logs(
    newcomer: Sequence[str], everyone: Sequence[Sequence[str]], generation: int
) -> float | None:
    """Seconds from the new worker's status server starting (right before it joins) to the
    last worker completing the rebalance of ``generation``, or to the new worker's last
    restore, whichever is later; None when the logs do not show both ends."""
    started = next((log_time(x) for x in newcomer if "status page and metrics on" in x), None)
    done = f"rebalance done: generation {generation} "
    ends = [log_time(x) for lines in everyone for x in lines if done in x]
    ends += [log_time(x) for x in newcomer if "] INFO streamjoin.state: restored " in x]
    found = [t for t in ends if t is not None]
    if started is None or not found:
        return None
    return max(found) - started


# --------------------------------------------------------------------------- polling

#: one thread per worker: a poll asks every worker at once (the default pool has 6 threads)
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64)


async def poll(workers: Sequence[WatchedWorker]) -> list[dict[str, Any] | None]:
    loop = asyncio.get_running_loop()
    return list(
        await asyncio.gather(*(loop.run_in_executor(_POOL, w.status, 2.0) for w in workers))
    )


async def wait_settled(
    setup: Setup, workers: Sequence[WatchedWorker], newcomer: WatchedWorker | None
) -> tuple[float, float | None, int] | None:
    """(settled at, the newcomer's status first answered at, generation) in monotonic time;
    None on a timeout or a dead worker."""
    wanted = {(setup.topic, p) for p in range(setup.partitions)}
    deadline = time.monotonic() + setup.timeout
    answered: float | None = None
    settled_at: float | None = None
    settled_generation: int | None = None
    while time.monotonic() < deadline:
        if any(not w.alive() for w in workers):
            return None
        polled_at = time.monotonic()
        statuses = await poll(workers)
        if newcomer is not None and answered is None and statuses[-1] is not None:
            answered = polled_at
        if group_settled(statuses, wanted):
            generation = statuses[0]["worker"]["generation"]  # type: ignore[index]
            if settled_at is None or generation != settled_generation:
                settled_at, settled_generation = polled_at, generation
            elif time.monotonic() - settled_at >= setup.hold:
                return settled_at, answered, generation
        else:
            settled_at = None
        await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - polled_at)))
    return None


async def member_sizes(setup: Setup) -> tuple[list[int], list[int]]:
    """Each member's metadata and assignment bytes, as the coordinator holds them."""
    from streamjoin.runtime.group.group_info import describe_group_raw

    group = await describe_group_raw(setup.bootstrap, setup.app_id)
    members = group["members"]
    return (
        [len(m["member_metadata"] or b"") for m in members],
        [len(m["member_assignment"] or b"") for m in members],
    )


async def run_group(setup: Setup, count: int) -> tuple[list[Join], list[WatchedWorker]]:
    workers: list[WatchedWorker] = []
    joins: list[Join] = []
    generation = 0
    try:
        for i in range(1, count + 1):
            if i > 1 and setup.quiet:
                # (a member heartbeats more often for a while after a rebalance: a join
                # into a group quiet for longer hears of the join at the normal interval)
                await asyncio.sleep(setup.quiet)
            state_dir = setup.workdir / f"state-{i}"
            worker = spawn_worker(
                f"w{i}",
                setup.tree,
                APP_SPEC,
                setup.env,
                state_dir,
                setup.workdir / f"worker-{i}.log",
                ["--instance-id", f"w{i}"] if setup.env.get("BENCH_STATIC") else [],
            )
            workers.append(worker)
            join = Join(workers=i)
            settled = await wait_settled(setup, workers, worker)
            if settled is None:
                join.status = "failed"
                joins.append(join)
                dead = next((w for w in workers if not w.alive()), worker)
                log(f"join {i}: did not settle; {dead.name}'s log:\n{log_tail(dead.log)}")
                break
            settled_at, answered, new_generation = settled
            join.from_spawn_s = settled_at - worker.spawned
            join.from_join_s = None if answered is None else settled_at - answered
            join.logs_s = settle_from_logs(
                _lines(worker), [_lines(w) for w in workers], new_generation
            )
            join.rounds = new_generation - generation
            join.generation = generation = new_generation
            metadata, assignment = await member_sizes(setup)
            join.max_metadata_bytes = max(metadata, default=0)
            join.sum_metadata_bytes = sum(metadata)
            join.max_assignment_bytes = max(assignment, default=0)
            join.sum_assignment_bytes = sum(assignment)
            joins.append(join)
            log(
                f"join {i}: settled {join.from_spawn_s:.2f}s after spawn, "
                f"{join.from_join_s or 0:.2f}s after its status answered ({join.logs_s or 0:.2f}s "
                "in the logs), "
                f"{join.rounds} rebalance(s), generation {generation}; metadata max "
                f"{join.max_metadata_bytes} B, assignment max {join.max_assignment_bytes} B"
            )
        for w in workers:
            w.sample()
    except BaseException:
        kill_all(workers)
        raise
    return joins, workers


def _lines(worker: WatchedWorker) -> list[str]:
    return worker.log.read_text(errors="replace").splitlines() if worker.log.exists() else []


def table(joins: Sequence[Join]) -> str:
    lines = [
        "| workers | from spawn s | from join s | logs s | rounds | metadata B max / sum "
        "| assignment B max / sum |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for j in joins:
        lines.append(
            f"| {j.workers} | {num(j.from_spawn_s)} | {num(j.from_join_s)} | {num(j.logs_s)} "
            f"| {j.rounds} "
            f"| {j.max_metadata_bytes} / {j.sum_metadata_bytes} "
            f"| {j.max_assignment_bytes} / {j.sum_assignment_bytes} |"
        )
    return "\n".join(lines)


async def produce_some(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, b"x", key=f"k{p}-{i}".encode(), partition=p)
            for p in range(partitions)
            for i in range(per_partition)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=60)
    parser.add_argument("--protocol", default="cooperative", choices=["cooperative", "eager"])
    parser.add_argument("--standbys", type=int, default=0)
    parser.add_argument("--heartbeat-ms", type=int, default=None, help="default: the App's")
    parser.add_argument("--static", action="store_true", help="static members (instance ids)")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds settled to count")
    parser.add_argument(
        "--quiet", type=float, default=0.0, help="seconds to wait after a join before the next"
    )
    parser.add_argument("--tree", default=str(ROOT), help="source tree the workers run")
    parser.add_argument("--bootstrap", default=None, help="a loopback broker (default: own)")
    parser.add_argument("--broker-heap", default="512m")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per join, at most")
    parser.add_argument("--workdir", default=None, help="keep logs here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.partitions < args.workers:
        parser.error("--workers must be >= 1 and --partitions >= --workers")
    tree = Path(args.tree).resolve()
    if not (tree / "streamjoin" / "__init__.py").exists():
        parser.error(f"--tree {tree}: no streamjoin package there")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="group-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"worker tree {tree}; logs in {workdir}")
    joins: list[Join] = []
    rss: list[float] = []
    peak: list[float] = []

    async def run() -> None:
        with broker(args.bootstrap, log, heap=args.broker_heap) as bootstrap:
            uid = uuid.uuid4().hex[:6]
            setup = Setup(
                bootstrap=bootstrap,
                tree=tree,
                app_id=f"gs-{uid}",
                topic=f"gs-{uid}-events",
                partitions=args.partitions,
                workdir=workdir,
                env={
                    "BENCH_APP_ID": f"gs-{uid}",
                    "BENCH_INPUT": f"gs-{uid}-events",
                    "BENCH_PROTOCOL": args.protocol,
                    "BENCH_STANDBYS": str(args.standbys),
                    "STREAMJOIN_BROKER": f"kafka://{bootstrap}",
                    **({"BENCH_HEARTBEAT_MS": str(args.heartbeat_ms)} if args.heartbeat_ms else {}),
                    **({"BENCH_STATIC": "1"} if args.static else {}),
                },
                hold=args.hold,
                timeout=args.timeout,
                quiet=args.quiet,
            )
            from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

            await ensure_topics(bootstrap, [TopicSpec(setup.topic, args.partitions)])
            await wait_leaders(bootstrap, [setup.topic], args.partitions)
            await produce_some(bootstrap, setup.topic, args.partitions, 10)
            found, workers = await run_group(setup, args.workers)
            joins.extend(found)
            rss.extend(w.rss_now_mb for w in workers if w.alive())
            peak.extend(w.peak_rss_mb for w in workers if w.alive())
            await asyncio.gather(*(stop_worker(w, 60) for w in workers))
            kill_all(workers)

    asyncio.run(run())
    report = {
        "tree": str(tree),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "protocol": args.protocol,
        "partitions": args.partitions,
        "heartbeat_ms": args.heartbeat_ms,
        "quiet": args.quiet,
        "joins": [asdict(j) for j in joins],
        "idle_rss_mb": {"median": median(rss), "max": max(rss, default=None)},
        "peak_rss_mb": {"median": median(peak), "max": max(peak, default=None)},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(table(joins))
        print(
            f"\nidle worker RSS: median {report['idle_rss_mb']['median'] or 0:.0f} MB, "
            f"max {report['idle_rss_mb']['max'] or 0:.0f} MB (peak: median "
            f"{report['peak_rss_mb']['median'] or 0:.0f} MB)"
        )
    return 0 if joins and all(j.status == "ok" for j in joins) else 1


if __name__ == "__main__":
    raise SystemExit(main())
