"""The Worker: the one composition root that runs a Topology with an AppConfig on Kafka.

It builds the producer, the state service, the task manager, the agent runtime,
the assignor adapter and the consumer, wires them with plain callbacks, and runs
them as one mode service. The CLI, embedding (``App.start``) and the Spark jobs
all go through it or through the Topology; the in-memory test driver runs the
same task manager and agent runtime over in-memory transports. Nothing here
imports the App: everything comes in as parameters.

Start order: the state directory (writable, and locked for this process: before
anything joins the group), topics (create/verify), producer, state service, agents, consumer.
Stop order is the reverse and loses nothing: stop fetching, let in-flight events
finish, flush sends, commit, leave the group (static members stay), stop the
producer. An agent failure under the ``stop`` policy stops the worker;
:meth:`Worker.wait_stopped` re-raises it so the CLI can exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mode import Service

from streamjoin.config import AppConfig
from streamjoin.context import RuntimeLink
from streamjoin.runtime.group.assignor_adapter import StreamjoinAssignor
from streamjoin.runtime.group.group_info import describe_group
from streamjoin.runtime.group.membership import MembershipSettings
from streamjoin.runtime.group.transaction import TransactionalSender, transactional_id_for
from streamjoin.runtime.ops.metrics import WorkerCounters
from streamjoin.runtime.ops.monitor import WorkerMonitor, collect
from streamjoin.runtime.ops.query_endpoint import QueryService, advertised_host
from streamjoin.runtime.table_state.service import StateService, TableStores, flush_partitions
from streamjoin.runtime.table_state.state_dir import StateDirLock
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.task import Task, TaskManager
from streamjoin.runtime.transport.consumer import KafkaConsumerService
from streamjoin.runtime.transport.liveness import wait_for_broker
from streamjoin.runtime.transport.producer import KafkaSender
from streamjoin.runtime.transport.record_limits import RecordLimits
from streamjoin.runtime.transport.topic_admin import (
    TopicSpec,
    ensure_topics,
    fetch_partition_counts,
    fetch_topic_limits,
)
from streamjoin.state.base import StoreCorrupted, StorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.topology import Topology

log = logging.getLogger("streamjoin.worker")


def client_id_for(config: AppConfig) -> str:
    """``<app id>-<instance id or host>-<pid>``: unique per process, readable in broker logs."""
    return f"{config.id}-{config.group_instance_id or socket.gethostname()}-{os.getpid()}"


async def prepare_topics(topology: Topology, config: AppConfig) -> dict[str, int]:
    """Create missing declared topics and verify partition counts; returns the counts."""
    client = config.client_kwargs()
    names = list(topology.topics)
    existing = await fetch_partition_counts(config.broker, names, **client)
    topology.resolve_partitions(existing, config.topic_partitions)
    declared = {t.name: t.partitions or config.topic_partitions for t in topology.topics.values()}
    topology.check_copartitioning({**declared, **existing})
    specs = [
        TopicSpec(
            t.name,
            t.partitions or config.topic_partitions,
            t.replication_factor,
            dict(t.config),
        )
        for t in topology.topics.values()
    ]
    created = await ensure_topics(config.broker, specs, **client)
    if created:
        log.info("created topics: %s", ", ".join(sorted(created)))
    counts = await fetch_partition_counts(config.broker, names, **client)
    topology.check_copartitioning(counts)
    return counts


class WorkerTables:
    """The worker's table partitions as declarations see them (reads outside agents)."""

    def __init__(self, tasks: TaskManager, held: TableStores | None) -> None:
        self._tasks = tasks
        self._held = held

    def active_partition(self, table: str, partition: int) -> TablePartition | None:
        task = self._tasks.table_task(table, partition)
        return task.tables.get(table) if task is not None and task.running else None

    def active_partitions(self, table: str) -> list[int]:
        return self._tasks.table_partitions(table)

    def assigned_partition(self, table: str, partition: int) -> bool:
        """Partition ``partition`` of ``table`` is active here, running or still restoring."""
        return self._tasks.table_task(table, partition) is not None

    def held_partition(self, table: str, partition: int) -> bool:
        return self._held is not None and self._held.get(table, partition) is not None


class Worker(Service):
    """Runs one :class:`Topology` with one :class:`AppConfig` on a Kafka cluster."""

    def __init__(
        self,
        topology: Topology,
        config: AppConfig,
        *,
        link: RuntimeLink | None = None,
        queue_size: int = 1000,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__()
        self.topology = topology
        self.config = config
        self.link = link or RuntimeLink()
        self.queue_size = queue_size
        self.client_id = client_id_for(config)
        self.tasks = TaskManager(topology)
        self.sender: KafkaSender | None = None
        self.runtime: AgentRuntime | None = None
        self.consumer: KafkaConsumerService | None = None
        self.assignor: StreamjoinAssignor | None = None
        self.stores: TableStores | None = None
        self.state_service: StateService | None = None
        #: interactive queries (tables only): the routing table and ``GET /tables/...``
        self.queries: QueryService | None = None
        #: the ``host:port`` this worker advertises for queries (``host``, else the web
        #: server's address), once started
        self.advertised_host: str | None = config.host
        self.failure: BaseException | None = None
        #: metrics: what the runtime counts, and the service reporting it (lag, status page)
        self.counters = WorkerCounters()
        self.monitor: WorkerMonitor | None = None
        #: held while running when the worker keeps state (tables, or group membership)
        self.state_dir_lock = StateDirLock(config.state_path)
        #: told at once when a fatal error starts stopping the worker
        self._on_failure = on_failure
        self._done = asyncio.Event()
        self._stopping = False
        self._stopper: asyncio.Task[None] | None = None

    @property
    def assignment(self) -> set[tuple[str, int]]:
        return set() if self.consumer is None else self.consumer.assigned

    @property
    def finished(self) -> bool:
        """True once the worker stopped (after a stop request or a fatal error)."""
        return self._done.is_set()

    @property
    def shared_values(self) -> dict[str, Any]:
        """Values agents keep for the worker's lifetime (join counters)."""
        return {} if self.runtime is None else self.runtime.shared_values

    def rebalance_metrics(self) -> dict[str, float | int | None]:
        """The group membership's rebalance metrics (empty when not in a group)."""
        if self.consumer is None:
            return {}
        return self.consumer.rebalance_metrics.snapshot(time.monotonic())

    def transaction_metrics(self) -> dict[str, int]:
        """Exactly-once: transactions committed and aborted (empty under at-least-once)."""
        sender = self.sender
        if not isinstance(sender, TransactionalSender):
            return {}
        return {"transactions-committed": sender.commits, "transactions-aborted": sender.aborts}

    def metrics(self) -> dict[str, Any]:
        """Metrics and status as a plain dict (:func:`streamjoin.runtime.ops.monitor.collect`)."""
        return collect(self)

    @property
    def web_url(self) -> str | None:
        return self.monitor.web_url if self.monitor is not None else None

    async def on_start(self) -> None:
        if self.topology.agents or self.topology.tables:
            # before the group: a second worker on this directory must fail here, not
            # after it took partitions whose stores the first one holds open
            self.state_dir_lock.acquire()
        try:
            await self._start_services()
        except BaseException:
            await self._stop_started()
            self.state_dir_lock.release()
            raise

    async def _stop_started(self) -> None:
        """After a failed start: stop what did start, latest first. The web server starts
        before the group is joined, so a later failure must not leave its port open (nor
        the routing task running); nor the producer and the state service's consumer,
        which would be left to the garbage collector ("Unclosed AIOKafkaProducer")."""
        stops: list[Callable[[], Awaitable[Any]]] = []
        if self.queries is not None:
            stops.append(self.queries.stop)
        if self.monitor is not None and self.monitor.web is not None:
            stops.append(self.monitor.web.stop)
        if self.runtime is not None:
            stops.append(self.runtime.stop)
        if self.state_service is not None:
            stops.append(self.state_service.stop)
        if self.sender is not None:
            stops.append(self.sender.stop)
        for stop in stops:
            try:
                await stop()
            except Exception:  # the start's own error is the one to report
                log.warning("stopping after a failed start: %s failed", stop, exc_info=True)

    async def _start_services(self) -> None:
        topology, config = self.topology, self.config
        await wait_for_broker(config.broker, config.startup_timeout)
        await prepare_topics(topology, config)
        limits = RecordLimits(
            await fetch_topic_limits(config.broker, topology.topics, **config.client_kwargs())
        )
        if config.exactly_once:
            self.sender = TransactionalSender(
                config.broker,
                client_options=config.client_kwargs(),
                producer_options=config.producer_options,
                client_id=self.client_id,
                transactional_id=transactional_id_for(config.id, config.group_instance_id),
                transaction_timeout_ms=config.transaction_timeout_ms,
                group_id=config.id,
                limits=limits,
            )
        else:
            self.sender = KafkaSender(
                config.broker,
                client_options=config.client_kwargs(),
                producer_options=config.producer_options,
                client_id=self.client_id,
                limits=limits,
            )
        self.sender.counters = self.counters
        await self.sender.start()
        if topology.tables:
            self.stores = TableStores(topology.tables, config.state_path, config.rocksdb)
            self.state_service = StateService(
                self.stores,
                bootstrap_servers=config.broker,
                client_options=config.client_kwargs(),
                read_committed=config.exactly_once,
                on_ready=self._table_ready,
                on_crash=self._on_crash,
            )
            await self.state_service.start()
        self.link.connect(self.sender, WorkerTables(self.tasks, self.stores))
        self.runtime = AgentRuntime(
            topology.agents.values(),
            self.sender,
            on_crash=self._on_crash,
            on_store_corrupted=self._store_corrupted,
            queue_size=self.queue_size,
            transactional=config.exactly_once,
            counters=self.counters,
        )
        self.runtime.start()
        # The web server starts before the group is joined: the address it got (port 0
        # picks one) is the query address this worker advertises to the assignor.
        self.monitor = WorkerMonitor(
            self,
            status_log_interval=config.status_log_interval,
            web_host=config.web_host,
            web_port=config.web_port,
        )
        web = self.monitor.web
        if topology.tables:
            self.queries = QueryService(
                topology,
                tables=WorkerTables(self.tasks, self.stores),
                stores=self.stores,
                state_service=self.state_service,
                membership=lambda: None if self.consumer is None else self.consumer.membership,
                describe=lambda: describe_group(config.broker, config.id, **config.client_kwargs()),
                self_host=config.host,
                token=config.query_token_value(),
            )
            if web is not None:
                for method, path, handler in self.queries.routes():
                    web.add_route(method, path, handler)
        await self.monitor.start()
        if config.host is None and web is not None:
            self.advertised_host = advertised_host(web.host, web.port)
        else:
            self.advertised_host = config.host
        if self.queries is not None:
            self.queries.self_host = self.advertised_host
            self.queries.start(serving=web is not None)
        if self.runtime.topics:
            self.assignor = StreamjoinAssignor.for_topology(
                topology,
                config.replace(host=self.advertised_host),
                lag_provider=self.state_service.lags if self.state_service is not None else None,
            )
            self.consumer = KafkaConsumerService(
                config.broker,
                client_id=self.client_id,
                runtime=self.runtime,
                tasks=self.tasks,
                sender=self.sender,
                assignor=self.assignor,
                membership=MembershipSettings(
                    group_id=config.id,
                    group_instance_id=config.group_instance_id,
                    cooperative=config.rebalance_protocol == "cooperative",
                    probing_rebalance_interval=config.probing_rebalance_interval,
                    exactly_once=config.exactly_once,
                ),
                commit_interval=config.commit_seconds,
                client_options=config.client_kwargs(),
                consumer_options=config.consumer_options,
                on_fatal=self._on_crash,
                on_assignment=self._assigned,
                on_revoke=self._revoked,
                flush_tables=self._flush_tables if self.stores is not None else None,
                tables=topology.tables,
                aligned_groups=topology.aligned_groups(),
                align_idle_ms=config.align_idle_ms,
                align_max_idle_ms=config.align_max_idle_ms,
                align_first=topology.ties_first(),
                counters=self.counters,
            )
            await self.consumer.start()
        log.info(
            "app %s started: %d agents on %s",
            config.id,
            len(topology.agents),
            ", ".join(sorted(self.runtime.topics)) or "no topics",
        )

    async def on_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            if self.consumer is not None:
                # First: workers stopped together must not join the rebalance the first
                # one's leave starts (see GroupMembership.stop_joining).
                self.consumer.stop_joining()
            if self.queries is not None:
                await self.queries.stop()
            if self.monitor is not None:
                await self.monitor.stop()
            if self.consumer is not None:
                await self.consumer.shutdown()
                await self.consumer.stop()
            elif self.runtime is not None:
                await self.runtime.stop()
            if self.state_service is not None:
                await self.state_service.stop()
            if self.sender is not None:
                await self.sender.stop()
        finally:
            self.link.disconnect()
            self.state_dir_lock.release()
            self._done.set()

    # -- tables

    async def _flush_tables(self, tasks: list[Task]) -> None:
        sender = self.sender
        if sender is None:
            return
        states = [state for task in tasks for state in task.tables.values()]
        await flush_partitions(states, self.topology.tables, sender, before_changelog=sender.flush)

    def _assigned(self, assigned: set[tuple[str, int]]) -> None:
        if self._stopping:
            return  # a rebalance that completed while stopping: nothing new starts
        self.tasks.assign(assigned)
        if self.queries is not None:
            self.queries.assignment_changed()
        if self.state_service is None or self.assignor is None:
            return
        active = self.tasks.active_table_partitions()
        # standbys, warmups and tasks pending for this worker are all kept warm here
        warm = self.assignor.restore_targets()
        standby: dict[str, set[int]] = {}
        for table in self.topology.tables.values():
            standby[table.name] = set(warm.get(table.changelog.name, ()))
        self.state_service.set_assignment(active, standby)

    def _revoked(self, tasks: list[Task]) -> None:
        """Revoked (or lost) tasks' table partitions are no longer active here."""
        if self.state_service is not None:
            self.state_service.revoke(
                (table, task.partition) for task in tasks for table in task.group.tables
            )

    def _table_ready(self, table: str, partition: int, store: StorePartition) -> None:
        task = self.tasks.table_ready(table, partition, TablePartition(table, partition, store))
        if task is None or self.consumer is None:
            return
        for topic, p in task.source_partitions:
            self.consumer.resume(topic, p)

    def _store_corrupted(self, task: Task, exc: StoreCorrupted) -> None:
        """A read found a store corrupted (a block checksum mismatch in a store that opened
        fine): rebuild it from its changelog, as a corrupt store found at open is.

        The task stops taking records now; then every partition is given up as lost and
        the worker rejoins (the path an aborted transaction takes: nothing is committed
        past the last commit, unflushed writes are dropped). When the partitions come
        back, the state service wipes the store before restoring it, and the task starts
        again from the committed offsets."""
        self.tasks.suspend([task])
        key = None if self.stores is None else self.stores.key_of(exc.path)
        membership = None if self.consumer is None else self.consumer.membership
        if key is None or self.state_service is None or membership is None:
            self._on_crash(exc)
            return
        if self.state_service.is_corrupted(*key):
            return  # already being rebuilt (another event of the task hit it too)
        log.warning(
            "store %s[%d] of task %s is corrupted (%s); giving its partitions up to rebuild "
            "it from the changelog",
            key[0],
            key[1],
            task.name,
            exc.cause,
        )
        self.state_service.mark_corrupted(*key)
        membership.abandon(f"store {key[0]}[{key[1]}] corrupted")

    def _on_crash(self, exc: BaseException) -> None:
        self.counters.error("fatal")
        if self.failure is None:
            self.failure = exc
            # A warning: the error itself is raised again by wait_stopped() (App.wait()), and
            # whoever waits reports it (the worker process as its one error line).
            log.warning(
                "stopping app %s after a fatal error: %s: %s",
                self.config.id,
                type(exc).__name__,
                exc,
            )
            self._stopper = asyncio.get_running_loop().create_task(self.stop())
            if self._on_failure is not None:
                self._on_failure(exc)

    async def wait_stopped(self) -> None:
        await self._done.wait()
        if self.failure is not None:
            raise self.failure


__all__ = ["Worker", "WorkerTables", "client_id_for", "prepare_topics"]
