"""The Worker: the one composition root that runs a Topology with an AppConfig on Kafka.

Every runtime service is built here and nowhere else (``tests/unit/test_layers.py``
checks it): the producer (or the transactional one), the state service and its stores,
the task manager, the agent runtime, the monitor and query service, the timers and app
tasks (``ScheduledWork``: started last, stopped first), and for a worker that
reads topics the group member's parts: the fetcher, the group membership, the timestamp
aligner, the exactly-once transaction, the table flusher and ``TaskProcessing``. They are
wired downhill: a commit runs processing -> flusher (sends, changelogs, stores) -> the
group's offsets (membership); nothing calls back up into the one that built it. Only
the worker's own decisions are callbacks (an assignment applied, tasks revoked, a
table ready, a fatal error). The CLI, embedding (``App.start``) and the Spark jobs all
go through it or through the Topology; the in-memory test driver runs the same task
manager, agent runtime and processing over in-memory transports. Nothing here imports
the App: everything comes in as parameters.

Start order: the state directory (writable, and locked for this process: before
anything joins the group), topics (create/verify), producer, state service, agents,
monitor, then the group member (fetcher, membership). Stop order is the reverse and
loses nothing: stop joining, stop fetching, let in-flight events finish, flush sends,
commit, leave the group (static members stay), stop the producer. An agent failure
under the ``stop`` policy stops the worker; :meth:`Worker.wait_stopped` re-raises it so
the CLI can exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaClient
from mode import Service

from streamjoin.config import AppConfig, reveal
from streamjoin.context import RuntimeLink
from streamjoin.errors import StoreCorrupted, UnknownTopicError
from streamjoin.joins.run_state import JoinStats
from streamjoin.runtime.group.assignor_adapter import StreamjoinAssignor
from streamjoin.runtime.group.group_info import describe_group
from streamjoin.runtime.group.membership import GroupMembership, MembershipSettings
from streamjoin.runtime.group.rebalance_metrics import RebalanceMetrics
from streamjoin.runtime.group.transaction import (
    TransactionalSender,
    WorkerTransaction,
    transactional_id_for,
)
from streamjoin.runtime.member import GroupMember
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.ops.health import HealthProbes
from streamjoin.runtime.ops.monitor import WorkerMonitor, collect
from streamjoin.runtime.ops.query_endpoint import QueryService, advertised_host
from streamjoin.runtime.ops.views import WebViews
from streamjoin.runtime.ops.web import web_tls_contexts
from streamjoin.runtime.scheduled import ScheduledWork
from streamjoin.runtime.table_state.flush import TableFlusher
from streamjoin.runtime.table_state.global_tables import GlobalTableService
from streamjoin.runtime.table_state.service import StateService, TableStores
from streamjoin.runtime.table_state.state_dir import StateDirLock
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.alignment import TimestampAligner
from streamjoin.runtime.tasks.processing import TaskProcessing
from streamjoin.runtime.tasks.punctuation import PunctuationService
from streamjoin.runtime.tasks.task import Task, TaskManager
from streamjoin.runtime.transport.access import check_login
from streamjoin.runtime.transport.client_logs import quiet_retried_offset_lookups
from streamjoin.runtime.transport.consumer import Fetcher, fetch_options
from streamjoin.runtime.transport.liveness import wait_for_broker
from streamjoin.runtime.transport.producer import KafkaSender
from streamjoin.runtime.transport.record_limits import RecordLimits
from streamjoin.runtime.transport.topic_admin import (
    TopicSpec,
    check_replication,
    ensure_topics,
    fetch_partition_counts,
    fetch_topic_limits,
    internal_topics,
)
from streamjoin.state.base import StorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.topology import Topology
from streamjoin.web_views import WebView

log = logging.getLogger("streamjoin.worker")


def client_id_for(config: AppConfig) -> str:
    """``<app id>-<instance id or host>-<pid>``: unique per process, readable in broker logs."""
    return f"{config.id}-{config.group_instance_id or socket.gethostname()}-{os.getpid()}"


def membership_settings(config: AppConfig) -> MembershipSettings:
    """The group membership's settings: the app's, and the group options among its
    consumer options (the Java/aiokafka names: session, heartbeat, rebalance timeouts)."""
    options = config.consumer_options
    changes: dict[str, int] = {}
    for name in ("session_timeout_ms", "heartbeat_interval_ms", "retry_backoff_ms"):
        if name in options:
            changes[name] = int(options[name])
    rebalance = options.get("rebalance_timeout_ms", options.get("max_poll_interval_ms"))
    if rebalance is not None:
        changes["rebalance_timeout_ms"] = int(rebalance)
    return MembershipSettings(
        group_id=config.id,
        group_instance_id=config.group_instance_id,
        cooperative=config.rebalance_protocol == "cooperative",
        probing_rebalance_interval=config.probing_rebalance_interval,
        exactly_once=config.exactly_once,
        **changes,
    )


async def prepare_topics(topology: Topology, config: AppConfig) -> dict[str, int]:
    """Create missing declared topics and verify partition counts; returns every declared
    topic's partition count (what nobody declared is settled here: an existing topic's
    count, else its co-partitioned topics', else the app's ``topic_partitions``)."""
    client = config.client_kwargs()
    names = list(topology.topics)
    existing = await fetch_partition_counts(config.broker, names, **client)
    settled = topology.resolve_partitions(existing, config.topic_partitions)
    topology.check_copartitioning({**settled, **existing})
    specs = [
        TopicSpec(t.name, settled[t.name], t.replication_factor, dict(t.config))
        for t in topology.topics.values()
    ]
    created = await ensure_topics(config.broker, specs, **client)
    if created:
        log.info("created topics: %s", ", ".join(sorted(created)))
    counts = await fetch_partition_counts(config.broker, names, **client)
    topology.check_copartitioning(counts)
    internal = internal_topics(config.id, names, topology.changelog_topics)
    for warning in await check_replication(
        config.broker,
        internal - set(created),
        topology.changelog_topics,
        exactly_once=config.exactly_once,
        **client,
    ):
        log.warning(warning)
    return {**settled, **counts}


async def start_producer(
    topology: Topology, config: AppConfig, link: RuntimeLink, *, create_topics: bool = True
) -> KafkaSender:
    """An app's producer alone, for an app used only to send (``App.producing``): the
    broker reached and the login checked as at a worker's start, the declared topics
    created and checked (``create_topics=False``: each must exist), then ``link`` connected
    to an idempotent producer (under exactly-once too: nothing is consumed, so nothing can
    be processed twice). No state directory, agents, group or web server; the caller stops
    the sender and disconnects the link."""
    client = config.client_kwargs()
    await wait_for_broker(config.broker, config.startup_timeout)
    await check_login(config.broker, **client)
    if create_topics:
        counts = await prepare_topics(topology, config)
    else:
        counts = await fetch_partition_counts(config.broker, list(topology.topics), **client)
        missing = sorted(set(topology.topics) - set(counts))
        if missing:
            raise UnknownTopicError(
                f"no topic {', '.join(map(repr, missing))} on broker {config.broker} "
                "(create it, or let the app's worker create its declared topics)"
            )
    link.settle_partitions(counts)
    limits = RecordLimits(await fetch_topic_limits(config.broker, topology.topics, **client))
    sender = KafkaSender(
        config.broker,
        client_options=client,
        producer_options=reveal(config.producer_options),
        client_id=client_id_for(config),
        limits=limits,
    )
    await sender.start()
    link.connect(sender, WorkerTables(TaskManager(topology), None))
    return sender


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

    def active_task(self, table: str, partition: int) -> Task | None:
        task = self._tasks.table_task(table, partition)
        return task if task is not None and task.running and table in task.tables else None

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
        views: Sequence[WebView] = (),
    ) -> None:
        super().__init__()
        self.topology = topology
        #: the app's web views (``app.page``), served when the web server runs
        self.views = tuple(views)
        self.config = config
        self.link = link or RuntimeLink()
        self.queue_size = queue_size
        self.client_id = client_id_for(config)
        self.tasks = TaskManager(topology)
        self.sender: KafkaSender | None = None
        self.runtime: AgentRuntime | None = None
        #: the group member's parts (a worker that reads topics): the fetcher, the group's
        #: client and membership, and the service running the fetch and commit loops
        self.fetcher: Fetcher | None = None
        self.group_client: AIOKafkaClient | None = None
        self.membership: GroupMembership | None = None
        self.member: GroupMember | None = None
        #: the group membership's rebalance metrics, kept here: read after it stopped, too
        self.rebalances = RebalanceMetrics()
        self.assignor: StreamjoinAssignor | None = None
        self.stores: TableStores | None = None
        self.state_service: StateService | None = None
        #: the local copies of the app's global tables (restored before the agents start)
        self.global_tables: GlobalTableService | None = None
        #: interactive queries (tables only): the routing table and ``GET /tables/...``
        self.queries: QueryService | None = None
        #: the ``host:port`` this worker advertises for queries (``host``, else the web
        #: server's address), once started
        self.advertised_host: str | None = config.host
        self.failure: BaseException | None = None
        #: metrics: what the runtime counts, and the service reporting it (lag, status page)
        self.counters = WorkerCounters()
        self.monitor: WorkerMonitor | None = None
        #: the agents' per-task punctuations (``app.punctuate``), when the app declares any
        self.punctuations: PunctuationService | None = None
        #: the app's timers, crontabs and app tasks (started once the group is joined)
        self.scheduled: ScheduledWork | None = None
        #: held while running when the worker keeps state (tables, or group membership)
        self.state_dir_lock = StateDirLock(config.state_path)
        #: told at once when a fatal error starts stopping the worker
        self._on_failure = on_failure
        self._done = asyncio.Event()
        self._stopping = False
        self._stopper: asyncio.Task[None] | None = None

    @property
    def assignment(self) -> set[tuple[str, int]]:
        return set() if self.member is None else self.member.assigned

    @property
    def finished(self) -> bool:
        """True once the worker stopped (after a stop request or a fatal error)."""
        return self._done.is_set()

    @property
    def join_stats(self) -> dict[str, JoinStats]:
        """Join name -> its counters on this worker (kept for the worker's lifetime)."""
        return {} if self.runtime is None else self.runtime.join_stats

    def rebalance_metrics(self) -> dict[str, float | int | None]:
        """The group membership's rebalance metrics (empty when not in a group)."""
        if self.member is None:
            return {}
        return self.rebalances.snapshot(time.monotonic())

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
        if self.topology.agents or self.topology.tables or self.topology.global_tables:
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
        """After a failed start: stop what did start, in the order of a stop. The web server
        starts before the group is joined, so a later failure must not leave its port open
        (nor the routing task running); nor the producer and the state service's consumer,
        which would be left to the garbage collector ("Unclosed AIOKafkaProducer")."""
        for stop in self._stops(monitor_started=False):
            try:
                await stop()
            except Exception:  # the start's own error is the one to report
                log.warning("stopping after a failed start: %s failed", stop, exc_info=True)

    def _stops(self, *, monitor_started: bool) -> list[Callable[[], Awaitable[Any]]]:
        """What a stop awaits, in order, of what was built: queries, the monitor (its web
        server, if it never started), the group member (see :meth:`_leave_group`), the
        agents (if no group member stops them), the state service, the producer."""
        stops: list[Callable[[], Awaitable[Any]]] = []
        if self.punctuations is not None:
            stops.append(self.punctuations.stop)
        if self.scheduled is not None:
            stops.append(self.scheduled.stop)
        if self.queries is not None:
            stops.append(self.queries.stop)
        if self.monitor is not None:
            if monitor_started:
                stops.append(self.monitor.stop)
            elif self.monitor.web is not None:
                stops.append(self.monitor.web.stop)
        if self.member is not None or self.fetcher is not None or self.group_client is not None:
            stops.append(self._leave_group)
        if self.runtime is not None and self.member is None:
            stops.append(self.runtime.stop)
        if self.global_tables is not None:
            stops.append(self.global_tables.stop)
        if self.state_service is not None:
            stops.append(self.state_service.stop)
        if self.sender is not None:
            stops.append(self.sender.stop)
        return stops

    async def _start_services(self) -> None:
        topology, config = self.topology, self.config
        quiet_retried_offset_lookups()  # aiokafka's "Failed fetch offsets" while leaders move
        # bad certificate files stop the start before the broker is asked anything
        web_tls = web_tls_contexts(config) if config.web_port is not None else None
        await wait_for_broker(config.broker, config.startup_timeout)
        await check_login(config.broker, **config.client_kwargs())  # refused: exit 3 now
        self.link.settle_partitions(await prepare_topics(topology, config))
        limits = RecordLimits(
            await fetch_topic_limits(config.broker, topology.topics, **config.client_kwargs())
        )
        if config.exactly_once and not topology.agents:
            # Transactions commit with the consumed offsets; an app reading nothing never
            # commits one, and its timers' sends would be aborted with it: they go out
            # idempotent instead (nothing is consumed, so nothing can be processed twice).
            log.info(
                "app %s: exactly_once with no agents: sends (timers, app tasks) are "
                "idempotent, not transactional",
                config.id,
            )
        if config.exactly_once and topology.agents:
            self.sender = TransactionalSender(
                config.broker,
                client_options=config.client_kwargs(),
                producer_options=reveal(config.producer_options),
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
                producer_options=reveal(config.producer_options),
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
        if topology.global_tables:
            # restored here, before any agent runs: agents read them from the first event
            self.global_tables = GlobalTableService(
                topology.global_tables,
                partitions=self.link.partitions,
                state_dir=config.state_path,
                rocksdb=config.rocksdb,
                bootstrap_servers=config.broker,
                client_options=config.client_kwargs(),
                read_committed=config.exactly_once,
                on_crash=self._on_crash,
            )
            await self.global_tables.start()
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
        if topology.punctuations:
            self.punctuations = PunctuationService(
                topology.punctuations, self.runtime, self.tasks.live, on_crash=self._on_crash
            )
            self.punctuations.start()
        self.runtime.start()
        # The web server starts before the group is joined: the address it got (port 0
        # picks one) is the query address this worker advertises to the assignor.
        self.monitor = WorkerMonitor(
            self,
            status_log_interval=config.status_log_interval,
            web_host=config.web_host,
            web_port=config.web_port,
            web_tls=web_tls.server if web_tls is not None else None,
            describe=lambda: describe_group(config.broker, config.id, **config.client_kwargs()),
        )
        web = self.monitor.web
        if topology.tables or topology.global_tables:
            self.queries = QueryService(
                topology,
                tables=WorkerTables(self.tasks, self.stores),
                stores=self.stores,
                state_service=self.state_service,
                membership=lambda: self.membership,
                describe=lambda: describe_group(config.broker, config.id, **config.client_kwargs()),
                self_host=config.host,
                token=config.query_token_value(),
                forward_tls=web_tls.forward if web_tls is not None else None,
                global_tables=self.global_tables,
            )
            if web is not None:
                for method, path, handler in self.queries.routes():
                    web.add_route(method, path, handler)
        if web is not None:
            views = WebViews(self.views, queries=self.queries, token=config.query_token_value())
            for method, path, handler in [*HealthProbes(self).routes(), *views.routes()]:
                web.add_route(method, path, handler)
        elif self.views:
            log.warning(
                "app %s declares %d web page(s) but serves no web server (no web_port): "
                "they are not served",
                config.id,
                len(self.views),
            )
        await self.monitor.start()
        if config.host is None and web is not None:
            self.advertised_host = advertised_host(web.host, web.port)
        else:
            self.advertised_host = config.host
        if self.queries is not None:
            self.queries.self_host = self.advertised_host
            self.queries.start(serving=web is not None)
        if self.runtime.topics or topology.runs_on_leader:
            await self._join_group(self.sender, self.runtime)
        if topology.timers or topology.app_tasks:
            self.scheduled = ScheduledWork(
                topology.timers.values(),
                topology.app_tasks.values(),
                is_leader=self._leads,
                on_crash=self._on_crash,
                counters=self.counters,
            )
            self.scheduled.start()
        log.info(
            "app %s started: %d agents on %s",
            config.id,
            len(topology.agents),
            ", ".join(sorted(self.runtime.topics)) or "no topics",
        )

    async def _join_group(self, sender: KafkaSender, runtime: AgentRuntime) -> None:
        """Build the group member's parts (fetcher, membership, aligner, transaction,
        flusher, processing) around ``sender`` and ``runtime``, wire them downhill, and
        join the group."""
        topology, config = self.topology, self.config
        self.assignor = StreamjoinAssignor.for_topology(
            topology,
            config.replace(host=self.advertised_host),
            lag_provider=self.state_service.lags if self.state_service is not None else None,
        )
        settings = membership_settings(config)
        self.fetcher = Fetcher(
            fetch_options(
                config.broker,
                client_id=self.client_id,
                client_options=config.client_kwargs(),
                consumer_options=reveal(config.consumer_options),
                read_committed=config.exactly_once,
            )
        )
        await self.fetcher.start()
        # JoinGroup is held by the broker until the rebalance completes (at most the
        # rebalance timeout): the group client's request timeout must outlast it.
        client_options = config.client_kwargs()
        request_timeout = max(
            int(client_options.get("request_timeout_ms", 40_000)),
            settings.rebalance_timeout_ms + 5_000,
        )
        self.group_client = AIOKafkaClient(
            bootstrap_servers=config.broker,
            client_id=self.client_id,
            **{**client_options, "request_timeout_ms": request_timeout},
        )
        await self.group_client.bootstrap()
        membership = self.membership = GroupMembership(
            self.group_client,
            settings,
            topics=runtime.topics,
            assignor=self.assignor,
            on_fatal=self._on_crash,
            metrics=self.rebalances,
        )
        fetcher, state = self.fetcher, self.state_service
        membership.other_clients = lambda: (
            fetcher.kafka_client(),
            sender.kafka_client(),
            None if state is None else state.kafka_client(),
        )
        transaction = None
        if isinstance(sender, TransactionalSender):
            # Exactly-once: commits are transactions, which the group fences by generation
            # (no heartbeat round trip needed first).
            transaction = WorkerTransaction(
                sender, topology.tables, membership.offsets.commit_in_transaction
            )
        processing = TaskProcessing(
            self.tasks,
            runtime,
            TimestampAligner(
                topology.aligned_groups(),
                max_idle_ms=config.align_max_idle_ms,
                idle_ms=config.align_idle_ms,
                first=topology.ties_first(),
            ),
            flusher=TableFlusher(sender, topology.tables, flush_sends=sender.flush),
            offsets=membership.offsets,
            # at-least-once: one heartbeat right before state is flushed (a member stalled
            # past its session timeout learns it was replaced before it writes changelogs)
            member_ok=membership.check_standing if transaction else membership.heartbeat,
            transaction=transaction,
            on_transaction_aborted=membership.abandon,
            on_commit_stalled=lambda waited, what: _commit_stalled(membership, waited, what),
            commit_stall_after=config.transaction_timeout_ms / 1000,
            commit_give_up_after=COMMIT_GIVE_UP_TIMEOUTS * config.transaction_timeout_ms / 1000,
        )
        self.member = GroupMember(
            self.fetcher,
            processing,
            self.tasks,
            membership.offsets,
            commit_interval=config.commit_seconds,
            counters=self.counters,
            on_fatal=self._on_crash,
            on_assignment=self._assigned,
            on_revoke=self._revoked,
        )
        await self.member.start()
        membership.start(self.member)

    async def _leave_group(self) -> None:
        """Ordered stop of the group member: no more fetching or rebalancing, finish
        in-flight events, flush sends, commit, leave the group (static members stay),
        close the clients."""
        membership, member = self.membership, self.member
        if membership is not None:
            membership.stop_joining()
        if member is not None:
            await member.stop()  # the fetch and commit loops
        if membership is not None:
            await membership.settle(min(10.0, membership.settings.rebalance_timeout_ms / 1000))
            await membership.stop()
        if member is not None:
            await member.processing.stop()  # stops the agents too
        if membership is not None:
            await membership.leave()
            self.membership = None
        if self.fetcher is not None:
            await self.fetcher.stop()
        if self.group_client is not None:
            client, self.group_client = self.group_client, None
            await client.close()

    async def on_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            if self.membership is not None:
                # First: workers stopped together must not join the rebalance the first
                # one's leave starts (see GroupMembership.stop_joining).
                self.membership.stop_joining()
            for stop in self._stops(monitor_started=True):
                await stop()
        finally:
            self.link.disconnect()
            self.state_dir_lock.release()
            self._done.set()

    def _leads(self) -> bool:
        """This worker leads the group now: in it at a generation, and not mid-join."""
        membership = self.membership
        return membership is not None and membership.leader and membership.in_good_standing

    # -- tables

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
        if task is None or self.member is None:
            return
        for topic, p in task.source_partitions:
            self.member.resume(topic, p)

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
        membership = self.membership
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

    async def stopped(self) -> None:
        """Until a stop under way finished, whoever started it: a second ``stop()`` returns
        at once while the first (a fatal error's) still runs, with the state directory
        still locked."""
        if self._stopping:
            await self._done.wait()

    async def wait_stopped(self) -> None:
        await self._done.wait()
        if self.failure is not None:
            raise self.failure


__all__ = ["Worker", "WorkerTables", "client_id_for", "prepare_topics", "start_producer"]


#: a transaction's commit still waiting after this many transaction timeouts is given up
#: and aborted (see ``TaskProcessing._watch_commit``)
COMMIT_GIVE_UP_TIMEOUTS = 3


def _commit_stalled(membership: GroupMembership, waited: float, what: str) -> None:
    """A transaction has been committing for ``waited`` seconds, past the transaction
    timeout, waiting for ``what``: close the worker's connections (see
    ``TaskProcessing._watch_commit``)."""
    closed = membership.drop_all_connections()
    log.warning(
        "the transaction has been committing for %.0fs (longer than its timeout), waiting "
        "for %s: closed the worker's %d connections, in case one went silent; what waited "
        "on them is retried on new ones",
        waited,
        what,
        closed,
    )
