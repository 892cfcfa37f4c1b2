"""Broker faults on a 3-broker cluster under running workers, counted record by record.

Each test runs two workers of tests/integration/apps/ledger_join.py side by side, one
exactly-once and one at-least-once (``GUARANTEES``), each on topics of its own with a
producer that keeps writing and remembers what the cluster acknowledged (the ledger's
counting table, and the ad join). Then it injects one fault into the session's cluster
(``min.insync.replicas=2``, every topic and internal topic with 3 replicas):

- the whole cluster down (kill -9 of all three brokers) for 30 s, then started again;
- a rolling restart: each broker in turn stopped (SIGTERM: controlled shutdown) and
  started again, waiting for every replica to be in sync before the next;
- kill -9 of the transaction coordinator of the exactly-once worker's transactional id,
  while its transactions run (a commit every 100 ms); the at-least-once app's id is
  picked so that the same broker is its group coordinator, and another broker leads;
- kill -9 of the active controller, which also leads every input, output and changelog
  partition of both apps (their topics are created with it first in every replica list):
  a controller failover and a leader failover at once.

While a killed broker is still down (or right after the cluster is back) every worker
must commit, within ``RECOVERY_BOUND`` seconds, all the input written before the fault:
the workers recover by themselves, and none may exit. After more traffic both stop, and
the outputs are counted against the input topics read back (see
:func:`tests.integration.support.outcome_of`): no acknowledged input without its output;
exactly-once: no duplicate, per key the counts 1..n, the table (its changelog) exact, every
expected join once; at-least-once: duplicates counted and shown, tables at least right.

The cluster is the session's (``kafka_cluster``): every test restarts what it stopped and
waits until the cluster is healthy before it returns, pass or fail, and deletes its topics.
A controller failover alone, a broker kill that hits neither leaders nor coordinators,
and several faults in a row are the cluster soak's (benchmarks/cluster_soak.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamjoin.local_cluster import LocalKafkaCluster
from tests.integration.ledger_runs import (
    AFTER,
    AT_LEAST_ONCE,
    BEFORE,
    EXACTLY_ONCE,
    GUARANTEES,
    LOGLEVEL,
    PARTITIONS,
    Ledger,
    LedgerRun,
    new_ledger,
)
from tests.integration.support import wait_for_group

#: how long the whole cluster stays down
CLUSTER_DOWN = 30.0


async def create_topics(
    bootstrap: str,
    ledger: Ledger,
    leader: int | None,
    nodes: Sequence[int],
    partitions: int = PARTITIONS,
) -> None:
    """Every topic of the app (changelogs too, before the worker would create them) with
    3 replicas, ``min.insync.replicas=2`` and ``leader`` first in every partition's
    replicas: it leads them all (None: the cluster spreads the leaders)."""
    others = sorted(n for n in nodes if n != leader)
    placement: dict[str, Any] = (
        {"replica_assignments": {p: [leader, *others] for p in range(partitions)}}
        if leader is not None
        else {}
    )
    counts = (-1, -1) if leader is not None else (partitions, 3)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [
                NewTopic(
                    name,
                    *counts,
                    **placement,
                    topic_configs={"min.insync.replicas": "2"}
                    | ({"cleanup.policy": "compact"} if compacted else {}),
                )
                for name, compacted in ledger.topics()
            ]
        )
    finally:
        await admin.close()
    failed = [entry for entry in response.topic_errors if entry[1] != 0]
    assert not failed, failed


@dataclass
class ClusterRun(LedgerRun):
    """A ledger run on the cluster: its leaders, its coordinator, its return to health."""

    cluster: LocalKafkaCluster | None = None
    #: the coordinators' test: the broker coordinating both apps
    coordinator: int | None = None

    @property
    def the_cluster(self) -> LocalKafkaCluster:
        assert self.cluster is not None
        return self.cluster

    async def leaders(self, ledger: Ledger) -> set[int]:
        """The brokers leading the app's partitions."""
        return {
            int(await asyncio.to_thread(self.the_cluster.leader_of, topic, p))
            for topic, _ in ledger.topics()
            for p in range(PARTITIONS)
        }

    async def back_to_health(self) -> None:
        """Start what is down, wait until every replica is in sync (noting how long)."""
        began = time.monotonic()
        await healthy(self.the_cluster)
        self.notes.append(f"cluster healthy again in {time.monotonic() - began:.1f} s")


@contextlib.asynccontextmanager
async def cluster_run(
    cluster: LocalKafkaCluster,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    *,
    leader: int | None,
) -> AsyncIterator[ClusterRun]:
    """Start one worker per guarantee on topics led by ``leader``; at the end (pass or
    fail) stop them and bring the cluster back to health.

    ``leader=None``: the coordinators' test. The broker coordinating the exactly-once
    worker's transactions becomes :attr:`ClusterRun.coordinator`, the at-least-once app's
    id is picked so that it coordinates that group too, and another broker leads."""
    bootstrap = cluster.bootstrap_servers
    nodes = sorted(cluster.nodes)
    ledgers = [
        new_ledger(bootstrap, unique_topic, tmp_path / guarantee, guarantee)
        for guarantee in GUARANTEES
    ]
    run = ClusterRun(bootstrap, ledgers, cluster=cluster)
    began = time.monotonic()
    if leader is None:
        for ledger in ledgers:
            if ledger.guarantee == EXACTLY_ONCE:
                run.coordinator = await coordinator(cluster, "transaction", ledger.transactional_id)
        for ledger in ledgers:
            if ledger.guarantee == AT_LEAST_ONCE and run.coordinator is not None:
                for _ in range(50):
                    if await coordinator(cluster, "group", ledger.app_id) == run.coordinator:
                        break
                    ledger.env["SJT_APP_ID"] = unique_topic("ledger")
        leader = other_than(cluster, *([] if run.coordinator is None else [run.coordinator]))
    try:
        for ledger in ledgers:
            await create_topics(bootstrap, ledger, leader, nodes)
            ledger.workers.start("w", extra=["--loglevel", LOGLEVEL])
        for ledger in ledgers:
            await wait_for_group(
                bootstrap, ledger.app_id, lambda i: len(i.members) == 1, ledger.workers, 90
            )
            assert await run.leaders(ledger) == {leader}, await run.leaders(ledger)
        run.notes.append(f"workers up in {time.monotonic() - began:.1f} s")
        yield run
    finally:
        for ledger in ledgers:
            ledger.traffic.stop()
            if ledger.producing is not None and not ledger.producing.done():
                ledger.producing.cancel()
            ledger.workers.close()
        await healthy(cluster)
        await delete_topics(bootstrap, [t for ledger in ledgers for t, _ in ledger.topics()])


async def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """(The next tests' broker restarts recover fewer partitions.)"""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(topics)
    finally:
        await admin.close()


async def coordinator(
    cluster: LocalKafkaCluster, kind: Literal["group", "transaction"], key: str
) -> int:
    return int(await asyncio.to_thread(cluster.coordinator, kind, key))


async def healthy(cluster: LocalKafkaCluster) -> None:
    """Start every broker that is down (all at once: a quorum needs two), then wait until
    every replica is in sync."""
    down = [node for node in cluster.nodes.values() if not node.running]
    await asyncio.gather(*(asyncio.to_thread(node.start) for node in down))
    await asyncio.to_thread(cluster.wait_until_healthy, 120)


async def kill(cluster: LocalKafkaCluster, node_id: int) -> None:
    await asyncio.to_thread(cluster.nodes[node_id].kill)


def other_than(cluster: LocalKafkaCluster, *nodes: int) -> int:
    return next(n for n in sorted(cluster.nodes) if n not in nodes)


# --------------------------------------------------------------------------- the faults
# (the whole-cluster test first: a cluster restarts faster with fewer partitions)


async def test_the_whole_cluster_down_for_30_s(
    kafka_cluster: LocalKafkaCluster, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    cluster = kafka_cluster
    nodes = sorted(cluster.nodes)
    async with cluster_run(cluster, unique_topic, tmp_path, leader=nodes[0]) as run:
        await run.traffic_for(BEFORE)
        run.fault_begins()
        await asyncio.gather(*(kill(cluster, node) for node in nodes))
        await run.traffic_for(CLUSTER_DOWN)
        await run.back_to_health()
        await run.recovers(f"the whole cluster down for {CLUSTER_DOWN:.0f} s")
        await run.traffic_for(AFTER)
        await run.check()


async def test_rolling_restart_of_every_broker(
    kafka_cluster: LocalKafkaCluster, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    cluster = kafka_cluster
    nodes = sorted(cluster.nodes)
    async with cluster_run(cluster, unique_topic, tmp_path, leader=nodes[0]) as run:
        await run.traffic_for(BEFORE)
        run.fault_begins()
        for node in nodes:
            began = time.monotonic()
            await asyncio.to_thread(cluster.nodes[node].stop)
            await asyncio.to_thread(cluster.nodes[node].start)
            await asyncio.to_thread(cluster.wait_until_healthy, 120)
            run.notes.append(f"broker {node} restarted in {time.monotonic() - began:.1f} s")
        await run.recovers("the rolling restart")
        await run.traffic_for(AFTER)
        await run.check()


async def test_kill_9_of_the_transaction_coordinator(
    kafka_cluster: LocalKafkaCluster, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The exactly-once worker's transaction coordinator dies mid-transaction (it commits
    every 100 ms while traffic flows), and with it the at-least-once worker's group
    coordinator; another broker leads the apps' partitions."""
    cluster = kafka_cluster
    async with cluster_run(cluster, unique_topic, tmp_path, leader=None) as run:
        target = run.coordinator
        assert target is not None
        await run.traffic_for(BEFORE)
        run.fault_begins()
        await kill(cluster, target)
        await run.recovers(f"kill -9 of broker {target}, the coordinator")
        await run.back_to_health()
        await run.traffic_for(AFTER)
        await run.check()


async def test_kill_9_of_the_active_controller_leading_every_partition(
    kafka_cluster: LocalKafkaCluster, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """One kill, two failovers: the partitions' new leaders are elected by the controller
    that takes over from the dead one."""
    cluster = kafka_cluster
    controller = int(await asyncio.to_thread(cluster.active_controller))
    async with cluster_run(cluster, unique_topic, tmp_path, leader=controller) as run:
        await run.traffic_for(BEFORE)
        assert int(await asyncio.to_thread(cluster.active_controller)) == controller
        run.fault_begins()
        await kill(cluster, controller)
        what = f"kill -9 of broker {controller}, the active controller and every leader"
        await run.recovers(what)
        successor = int(await asyncio.to_thread(cluster.active_controller))
        assert successor != controller, successor
        await run.back_to_health()
        await run.traffic_for(AFTER)
        await run.check()
