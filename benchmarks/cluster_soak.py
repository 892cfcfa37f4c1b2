"""The cluster soak: random broker and worker faults for a long while, every record counted.

    .venv/bin/python -m benchmarks.cluster_soak --minutes 30 --seed 1

A local 3-broker cluster (``min.insync.replicas=2``, every topic with 3 replicas), three
workers of tests/integration/apps/ledger_join.py (a counting table and an ad join; one
commit is one transaction under exactly-once, the default ``--guarantee``) and a
producer that writes all the time and remembers what the cluster acknowledged. At random
intervals (``--every`` seconds on average, drawn from the ``--seed``) one fault:

- ``broker-kill``: kill -9 of a random broker, started again 5-30 s later;
- ``rolling-restart``: every broker in turn stopped (SIGTERM) and started, waiting for
  in-sync replicas between them;
- ``controller-kill``: kill -9 of the active controller, started again 5-20 s later;
- ``cluster-down``: kill -9 of every broker, all started again 30-90 s later;
- ``worker-kill``: kill -9 of a random worker, started again (same instance id and state
  directory) 1-5 s later.

Each fault ends (what it stopped is running again, and the cluster healthy) before the
next interval starts. At the end traffic stops, the group commits what is left, and a
``read_committed`` reader counts: records in and out, missing and duplicated outputs (of
the ledger and of the join), tables that do not hold the true counts, workers that exited
on their own (restarted, and listed), and the longest stall: the longest time the group's
committed offsets did not move while input was waiting for them. Exit status 1 unless
nothing was missing and, under exactly-once, nothing duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.integration.ledger_runs import (
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    Ledger,
    join_check,
    new_ledger,
)
from tests.integration.support import outcome_of, wait_all_committed, wait_for_group
from tests.integration.test_cluster_faults import create_topics

PARTITIONS = 6
WORKERS = ("w1", "w2", "w3")
KINDS = ("broker-kill", "rolling-restart", "controller-kill", "cluster-down", "worker-kill")
#: how often each kind is drawn
WEIGHTS = (3, 1, 2, 1, 3)


def say(message: str) -> None:
    print(f"[cluster-soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Fault:
    at: float  #: seconds since the traffic started
    kind: str
    target: str
    seconds: float = 0.0  #: how long it lasted (down to running and healthy again)

    def __str__(self) -> str:
        return f"{self.at:7.1f}s {self.kind:<16} {self.target:<20} {self.seconds:5.1f}s"


@dataclass
class Stalls:
    """The group's committed offsets against the input's end, sampled every second: the
    longest time the committed offsets did not move while input was waiting."""

    bootstrap: str
    group: str
    topics: list[str]
    partitions: int
    started: float = field(default_factory=time.monotonic)
    longest: float = 0.0
    longest_at: float = 0.0
    #: every stall of 5 s or more: (seconds since the start, how long)
    stalls: list[tuple[float, float]] = field(default_factory=list)
    samples: int = 0
    failed_samples: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        tps = [TopicPartition(t, p) for t in self.topics for p in range(self.partitions)]
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            request_timeout_ms=5_000,
        )
        await consumer.start()
        committed_before = -1
        moved_at = time.monotonic()
        try:
            while not self._stop.is_set():
                sample: tuple[int, int] | None
                try:
                    sample = await asyncio.wait_for(self._sample(consumer, tps), 10)
                except Exception:
                    self.failed_samples += 1
                    sample = None
                now = time.monotonic()
                if sample is not None:
                    ends, committed = sample
                    self.samples += 1
                    if committed != committed_before or committed >= ends:
                        self._moved(moved_at, now)
                        committed_before = committed
                        moved_at = now
                self._stalled(moved_at, now)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), 10)

    def _stalled(self, since: float, now: float) -> None:
        """No progress from ``since`` until ``now`` (so far)."""
        if now - since > self.longest:
            self.longest = now - since
            self.longest_at = since - self.started

    def _moved(self, since: float, now: float) -> None:
        """Progress at ``now``, the first since ``since``: a stall ends."""
        self._stalled(since, now)
        if now - since >= 5.0:
            self.stalls.append((since - self.started, now - since))

    async def _sample(
        self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]
    ) -> tuple[int, int]:
        ends = await consumer.end_offsets(tps)
        committed = [await consumer.committed(tp) or 0 for tp in tps]
        return sum(ends.values()), sum(committed)

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Soak:
    cluster: Any
    ledger: Ledger
    rng: random.Random
    started: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)

    @property
    def workers(self) -> Any:
        return self.ledger.workers

    def now(self) -> float:
        return time.monotonic() - self.started

    async def healthy(self) -> None:
        down = [node for node in self.cluster.nodes.values() if not node.running]
        await asyncio.gather(*(asyncio.to_thread(node.start) for node in down))
        await asyncio.to_thread(self.cluster.wait_until_healthy, 300)

    async def pause(self, seconds: float) -> None:
        """Sleep, restarting any worker that exited on its own (and noting it)."""
        deadline = time.monotonic() + seconds
        while True:
            for name, proc in list(self.workers.procs.items()):
                code = proc.poll()
                if code is not None:
                    last = self.workers.log_of(name).strip().splitlines()[-1:] or [""]
                    self.exits.append(f"{self.now():.1f}s {name} exited {code}: {last[0][:300]}")
                    say(f"worker {name} exited {code} on its own: {last[0][:300]}")
                    self.workers.procs.pop(name)
                    self.workers.start(name)
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    async def broker_kill(self) -> str:
        node = self.rng.choice(sorted(self.cluster.nodes))
        await asyncio.to_thread(self.cluster.nodes[node].kill)
        await self.pause(self.rng.uniform(5, 30))
        await self.healthy()
        return f"broker {node}"

    async def controller_kill(self) -> str:
        node = int(await asyncio.to_thread(self.cluster.active_controller))
        await asyncio.to_thread(self.cluster.nodes[node].kill)
        await self.pause(self.rng.uniform(5, 20))
        await self.healthy()
        return f"controller {node}"

    async def rolling_restart(self) -> str:
        for node in sorted(self.cluster.nodes):
            await asyncio.to_thread(self.cluster.nodes[node].stop)
            await asyncio.to_thread(self.cluster.nodes[node].start)
            await asyncio.to_thread(self.cluster.wait_until_healthy, 300)
            await self.pause(0)
        return "every broker"

    async def cluster_down(self) -> str:
        down = self.rng.uniform(30, 90)
        nodes = list(self.cluster.nodes.values())
        await asyncio.gather(*(asyncio.to_thread(node.kill) for node in nodes))
        await self.pause(down)
        await self.healthy()
        return f"all brokers, {down:.0f}s"

    async def worker_kill(self) -> str:
        name = self.rng.choice(WORKERS)
        self.workers.stop(name, signal.SIGKILL)
        await asyncio.sleep(self.rng.uniform(1, 5))
        self.workers.start(name)
        return f"worker {name}"

    async def inject(self, kind: str) -> None:
        actions: dict[str, Callable[[], Awaitable[str]]] = {
            "broker-kill": self.broker_kill,
            "rolling-restart": self.rolling_restart,
            "controller-kill": self.controller_kill,
            "cluster-down": self.cluster_down,
            "worker-kill": self.worker_kill,
        }
        at = self.now()
        say(f"fault: {kind}")
        target = await actions[kind]()
        fault = Fault(at, kind, target, self.now() - at)
        self.faults.append(fault)
        say(f"fault over: {fault}")

    async def faults_for(self, seconds: float, every: float) -> None:
        deadline = self.started + seconds
        while True:
            wait = self.rng.uniform(0.5, 1.5) * every
            if time.monotonic() + wait >= deadline:
                await self.pause(max(0.0, deadline - time.monotonic()))
                return
            await self.pause(wait)
            await self.inject(self.rng.choices(KINDS, WEIGHTS)[0])


async def soak(cluster: Any, args: argparse.Namespace, workdir: Path) -> bool:
    run_id = uuid.uuid4().hex[:8]
    counter = itertools.count()

    def unique_topic(prefix: str = "t") -> str:
        return f"cluster-soak-{run_id}-{prefix}-{next(counter)}"

    bootstrap = cluster.bootstrap_servers
    ledger = new_ledger(bootstrap, unique_topic, workdir, args.guarantee, PARTITIONS)
    await create_topics(bootstrap, ledger, None, sorted(cluster.nodes), PARTITIONS)
    workers = ledger.workers
    for name in WORKERS:
        workers.start(name, extra=["--startup-timeout", "300"])
    try:
        await wait_for_group(
            bootstrap,
            ledger.app_id,
            lambda i: len(i.members) == len(WORKERS) and all(m.active for m in i.members),
            workers,
            timeout=120,
        )
        soak = Soak(cluster, ledger, random.Random(args.seed))
        stalls = Stalls(bootstrap, ledger.app_id, ledger.inputs(), PARTITIONS, soak.started)
        producing = asyncio.create_task(ledger.traffic.run(args.rate, args.rate // 2))
        watching = asyncio.create_task(stalls.run())
        say(f"{args.minutes:g} minutes of faults, one every ~{args.every:g}s (seed {args.seed})")
        try:
            await soak.faults_for(args.minutes * 60, args.every)
        finally:
            ledger.traffic.stop()
            await producing
        traffic_seconds = soak.now()
        await soak.healthy()
        await soak.pause(0)
        drain_started = time.monotonic()
        await wait_all_committed(
            bootstrap, workers, None, 600, partitions=PARTITIONS, topics=ledger.inputs()
        )
        drain = time.monotonic() - drain_started
        stalls.stop()
        await watching
        outcome = await outcome_of(bootstrap, ledger.env, ledger.traffic, PARTITIONS)
        joins = await join_check(bootstrap, ledger, PARTITIONS)
        codes = workers.stop_all()
    finally:
        workers.close()
    exact = (
        not outcome.missing
        and outcome.acked_not_in_topic == 0
        and outcome.unknown == 0
        and joins.missing == 0
        and joins.unexpected == 0
    )
    if args.guarantee == EXACTLY_ONCE:
        exact = exact and not (
            outcome.duplicates
            or joins.duplicates
            or outcome.broken_sequences
            or outcome.table_wrong
        )
    lines = [
        f"cluster soak, {args.guarantee}, seed {args.seed}: {traffic_seconds / 60:.1f} min of "
        f"traffic, {len(soak.faults)} faults, then {drain:.1f}s to commit the rest",
        "faults (start, kind, target, seconds until running and healthy again):",
        *(f"  {fault}" for fault in soak.faults),
        f"records in: {outcome.inputs} ledger events ({outcome.acked} acknowledged, "
        f"{len(ledger.traffic.failed)} sends failed), {joins.expected} auctions with both "
        "sides",
        f"ledger: {outcome}",
        f"join: {joins}",
        f"longest stall: {stalls.longest:.1f}s (from {stalls.longest_at:.0f}s; "
        f"{stalls.samples} samples, {stalls.failed_samples} while the cluster did not answer); "
        "stalls of 5 s or more (start, seconds): "
        + (", ".join(f"{at:.0f}s {took:.1f}" for at, took in stalls.stalls) or "none"),
        f"workers that exited on their own: {soak.exits or 'none'}; exit codes at the end: {codes}",
        f"result: {'EXACT' if exact else 'NOT EXACT'}",
    ]
    print("\n".join(lines), flush=True)
    return exact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="of faults and traffic")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, default=45.0, help="mean seconds between faults")
    parser.add_argument("--rate", type=int, default=100, help="ledger events per second")
    parser.add_argument("--guarantee", choices=(EXACTLY_ONCE, AT_LEAST_ONCE), default=EXACTLY_ONCE)
    parser.add_argument("--heap", default="512m", help="of each broker")
    args = parser.parse_args(argv)
    # (this process's own clients, the producer and the offsets watcher, retry by themselves)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    from streamjoin.local_cluster import LocalKafkaCluster

    with (
        tempfile.TemporaryDirectory(prefix="streamjoin-cluster-soak-") as tmp,
        LocalKafkaCluster(brokers=3, heap=args.heap, progress=say) as cluster,
    ):
        exact = asyncio.run(soak(cluster, args, Path(tmp)))
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
