"""What a running worker reports about itself: the metrics snapshot, lag, the status line.

:func:`collect` reads the worker's services into one plain dict (the *snapshot*):
``App.metrics()`` returns it, ``/status.json`` serves it, and the Prometheus and
OpenTelemetry exports are made from it (:mod:`streamjoin.runtime.metrics`). The
:class:`WorkerMonitor` service lists the end offsets of the owned partitions every
few seconds (one request, never per scrape), keeps each partition's input rate,
logs one INFO line of throughput and lag every ``status_log_interval`` seconds, and
runs the HTTP server when a port is configured. With the server, it also keeps the
last minutes of numbers (:mod:`~streamjoin.runtime.ops.history`) and a view of the
whole group (:mod:`~streamjoin.runtime.ops.group_view`, described again after each
rebalance) for the status page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from mode import Service

from streamjoin.config import AppConfig
from streamjoin.context import RuntimeLink
from streamjoin.runtime.group.assignor_adapter import StreamjoinAssignor
from streamjoin.runtime.group.membership import GroupMembership
from streamjoin.runtime.group.rebalance_metrics import RebalanceMetrics
from streamjoin.runtime.member import GroupMember
from streamjoin.runtime.metrics import WorkerCounters, registry_for
from streamjoin.runtime.ops.group_view import group_view
from streamjoin.runtime.ops.history import History, capacity_for, sample_of
from streamjoin.runtime.ops.web import WebServer
from streamjoin.runtime.scheduled import ScheduledWork
from streamjoin.runtime.table_state.global_tables import GlobalTableService
from streamjoin.runtime.table_state.service import StateService
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.task import TaskManager, TaskState
from streamjoin.topology import Topology

if TYPE_CHECKING:
    from streamjoin.runtime.group.group_info import GroupInfo

__all__ = ["MonitoredWorker", "WorkerMonitor", "collect", "status_line"]

log = logging.getLogger("streamjoin.status")

TP = tuple[str, int]

#: what a source partition's task state is called on the status page
_SOURCE_ROLE = {
    TaskState.RUNNING: "active",
    TaskState.RESTORING: "restoring",
    TaskState.CREATED: "restoring",
    TaskState.SUSPENDED: "revoking",
}
#: the status page's group view is described again at least this often (seconds)
_GROUP_REFRESH = 30.0
#: how long one description of the group may take
_DESCRIBE_TIMEOUT = 10.0


class MonitoredWorker(Protocol):
    """The parts of a :class:`~streamjoin.runtime.worker.Worker` a snapshot reads."""

    topology: Topology
    config: AppConfig
    client_id: str
    counters: WorkerCounters
    tasks: TaskManager
    runtime: AgentRuntime | None
    member: GroupMember | None
    membership: GroupMembership | None
    rebalances: RebalanceMetrics
    state_service: StateService | None
    global_tables: GlobalTableService | None
    assignor: StreamjoinAssignor | None
    monitor: WorkerMonitor | None
    scheduled: ScheduledWork | None
    link: RuntimeLink

    def rebalance_metrics(self) -> dict[str, float | int | None]: ...

    def transaction_metrics(self) -> dict[str, int]: ...


def collect(worker: MonitoredWorker) -> dict[str, Any]:
    """The worker's metrics and status as one plain dict (see docs/operations.md)."""
    now, wall = time.monotonic(), time.time()
    counters = worker.counters
    monitor = worker.monitor
    rates = monitor.rates if monitor is not None else {}
    member = worker.member
    membership = worker.membership
    partitions: list[dict[str, Any]] = []
    if member is not None:
        for tp, (end, committed, processed) in member.partition_offsets().items():
            task = worker.tasks.task_for(*tp)
            partitions.append(
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "role": "revoking" if task is None else _SOURCE_ROLE.get(task.state, "-"),
                    "records_in": counters.records_in.get(tp, 0),
                    "rate": rates.get(tp, 0.0),
                    "end_offset": end,
                    "committed_offset": committed,
                    "processed_offset": processed,
                    "lag": _lag(end, committed),
                    "lag_processed": _lag(end, processed),
                }
            )
    rebalance: dict[str, Any] = dict(worker.rebalance_metrics())
    if member is not None:
        metrics = worker.rebalances
        last = metrics.last
        if last is not None and metrics.last_rebalance_at is not None:
            rebalance["last"] = {
                "generation": last.generation,
                "protocol": last.protocol,
                "at": wall - (now - metrics.last_rebalance_at),
                "seconds": last.seconds,
                "assigned": last.assigned,
                "revoked": last.revoked,
                "owned": last.owned,
                "leader": last.leader,
            }
        rebalance["in_progress"] = metrics.in_progress
    join_stats = worker.runtime.join_stats if worker.runtime is not None else {}
    joins = {
        name: {"emitted": stats.emitted, "late": stats.late, "beyond_grace": stats.beyond_grace}
        for name, stats in sorted(join_stats.items())
    }
    changelogs = _changelogs(worker)
    out_records = sum(n for t, n in counters.records_out.items() if t not in changelogs)
    return {
        "worker": {
            "app_id": worker.config.id,
            "client_id": worker.client_id,
            "instance_id": worker.config.group_instance_id,
            "member_id": membership.member_id if membership is not None else None,
            "generation": membership.generation if membership is not None else -1,
            "web_url": monitor.web_url if monitor is not None else None,
            "uptime_seconds": now - monitor.started_at if monitor is not None else 0.0,
        },
        "throughput": {
            "records_in": sum(counters.records_in.values()),
            "records_out": out_records,
            "changelog_records": sum(counters.records_out.values()) - out_records,
            "records_in_per_second": monitor.rate_in if monitor is not None else 0.0,
            "records_out_per_second": monitor.rate_out if monitor is not None else 0.0,
        },
        "partitions": partitions,
        "tables": _table_rows(worker, now),
        "records_out": dict(sorted(counters.records_out.items())),
        "processing_latency": {
            agent: h.snapshot() for agent, h in sorted(counters.processing_latency.items())
        },
        "commit_latency": counters.commit_latency.snapshot(),
        "commits": counters.commits,
        "changelog_flush_records": counters.changelog_flush_records.snapshot(),
        "restored_records": (
            worker.state_service.restored_records if worker.state_service is not None else 0
        ),
        "rebalance": rebalance,
        "transactions": dict(worker.transaction_metrics()),
        "joins": joins,
        "dead_lettered": dict(sorted(counters.dead_lettered.items())),
        "skipped": dict(sorted(counters.skipped.items())),
        "errors": dict(sorted(counters.errors.items())),
        "timers": worker.scheduled.snapshot() if worker.scheduled is not None else {},
        "windows": {
            name: {"closed": w.closed, "late": w.late, "callback_errors": w.callback_errors}
            for name, w in sorted(worker.link.window_stats.items())
        },
        "ttl_expired": dict(sorted(worker.link.ttl_expired.items())),
        "late_writes": dict(sorted(worker.link.late_writes.items())),
        "too_late": dict(sorted(worker.link.too_late.items())),
        "global_tables": _global_table_rows(worker.global_tables),
    }


def _global_table_rows(service: GlobalTableService | None) -> dict[str, dict[str, Any]]:
    """Each global table's restore progress and lag on this worker."""
    if service is None:
        return {}
    return {
        name: {
            "restored": p.restored,
            "applied": p.applied,
            "restore_total": p.restore_total,
            "restore_seconds": p.restore_seconds,
            "lag": p.lag,
        }
        for name, p in sorted(service.progress.items())
    }


def _changelogs(worker: MonitoredWorker) -> set[str]:
    return {table.changelog.name for table in worker.topology.tables.values()}


def _lag(end: int | None, position: int | None) -> int | None:
    return None if end is None or position is None else max(0, end - position)


def _table_rows(worker: MonitoredWorker, now: float) -> list[dict[str, Any]]:
    """Every table partition held here: active, restoring, standby, warmup or pending."""
    state = worker.state_service
    if state is None:
        return []
    progress = state.progress(now)
    lags = state.lags()
    assignor = worker.assignor
    active = worker.tasks.active_table_partitions()
    rows: list[dict[str, Any]] = []
    for name, table in sorted(worker.topology.tables.items()):
        changelog = table.changelog.name
        roles: dict[int, str] = {}
        if assignor is not None:
            for role, held in (
                ("pending", assignor.pending),
                ("warmup", assignor.warmup),
                ("standby", assignor.standby),
            ):
                for p in held.get(changelog, ()):
                    roles[p] = role
        for p in active.get(name, ()):
            roles[p] = "active" if state.is_ready(name, p) else "restoring"
        for partition, role in sorted(roles.items()):
            found = progress.get((name, partition))
            row: dict[str, Any] = {
                "table": name,
                "changelog": changelog,
                "partition": partition,
                "role": role,
                "store": "rocksdb" if state.stores.on_disk_store(table) else "memory",
                "lag": lags.get(changelog, {}).get(partition),
                "rate": found.rate if found is not None else 0.0,
                "records_left": None,
                "eta_seconds": None,
            }
            if role == "active":
                row["lag"] = 0
            elif role == "restoring" and found is not None and not found.standby:
                row["records_left"] = row["lag"] = found.records_left
                row["eta_seconds"] = found.eta_seconds
            rows.append(row)
    return rows


def status_line(snapshot: Mapping[str, Any], seconds: float, records: tuple[int, int]) -> str:
    """The periodic INFO line: throughput over the last ``seconds`` (``records``: in, out
    in that time), total lag, partitions by role."""
    lags = [row["lag"] for row in snapshot["partitions"] if row["lag"] is not None]

    def by_role(rows: list[Mapping[str, Any]]) -> str:
        roles: dict[str, int] = {}
        for row in rows:
            roles[row["role"]] = roles.get(row["role"], 0) + 1
        return ", ".join(f"{n} {role}" for role, n in sorted(roles.items())) or "none"

    seconds = max(seconds, 1e-6)
    line = (
        f"status: in {records[0] / seconds:.1f} records/s, out {records[1] / seconds:.1f} "
        f"records/s over {seconds:.0f}s; lag {sum(lags)} records on {len(lags)} partitions; "
        f"source partitions: {by_role(snapshot['partitions'])}"
    )
    if snapshot["tables"]:
        line += f"; table partitions: {by_role(snapshot['tables'])}"
    return line


def _settled(view: Mapping[str, Any] | None) -> bool:
    """Whether a group view shows a stable group whose live members share one epoch."""
    if view is None or view.get("error") or view.get("state") != "Stable":
        return False
    return len({m["generation"] for m in view["members"] if m["alive"]}) == 1


class WorkerMonitor(Service):
    """End offsets every few seconds, input rates, the status line and the HTTP server."""

    def __init__(
        self,
        worker: MonitoredWorker,
        *,
        refresh_interval: float = 5.0,
        status_log_interval: float | None = 30.0,
        web_host: str = "127.0.0.1",
        web_port: int | None = None,
        web_tls: ssl.SSLContext | None = None,
        describe: Callable[[], Awaitable[GroupInfo]] | None = None,
    ) -> None:
        super().__init__()
        self._worker = worker
        self._refresh_interval = refresh_interval
        self._status_log_interval = status_log_interval or None
        self._describe = describe
        self.started_at = time.monotonic()
        #: the status page's charts: a sample per refresh, the last ten minutes
        self.history = History(capacity_for(self._interval()))
        self._history_base: tuple[float, dict[str, Any]] | None = None
        #: the status page's view of the whole group (None until described)
        self.group: dict[str, Any] | None = None
        self._topic_groups = {
            topic: "+".join(g.sources or g.tables or g.topics)
            for g in worker.topology.task_groups()
            for topic in g.topics
        }
        #: records in per second of each owned partition, over the last refresh interval
        self.rates: dict[TP, float] = {}
        self.rate_in = 0.0
        self.rate_out = 0.0
        self._sampled: tuple[float, dict[TP, int], int] | None = None
        self._logged: tuple[float, int, int] | None = None
        self.registry = registry_for(self.snapshot)
        self.web: WebServer | None = None
        if web_port is not None:
            self.web = WebServer(
                self.page_snapshot, self.registry, host=web_host, port=web_port, tls=web_tls
            )

    def snapshot(self) -> dict[str, Any]:
        return collect(self._worker)

    def page_snapshot(self) -> dict[str, Any]:
        """The snapshot with the group view and the history: what ``/`` and
        ``/status.json`` show."""
        return {**collect(self._worker), "group": self.group, "history": self.history.rows()}

    def _interval(self) -> float:
        """How often the refresh loop runs."""
        if self._status_log_interval is None:
            return self._refresh_interval
        return min(self._refresh_interval, self._status_log_interval)

    def _record_history(self, now: float) -> None:
        snapshot = self.snapshot()
        previous = self._history_base
        seconds = now - previous[0] if previous is not None else 0.0
        base = previous[1] if previous is not None else None
        self.history.add(sample_of(snapshot, base, seconds, time.time()))
        self._history_base = (
            now,
            {k: snapshot[k] for k in ("commit_latency", "restored_records")},
        )

    @property
    def web_url(self) -> str | None:
        return self.web.url if self.web is not None else None

    async def on_start(self) -> None:
        self.started_at = time.monotonic()
        self._sample(self.started_at)
        self._logged = (self.started_at, *self._totals())
        if self.web is not None:
            await self.web.start()
            log.info("status page and metrics on %s", self.web.url)

    async def on_stop(self) -> None:
        if self.web is not None:
            await self.web.stop()

    def _totals(self) -> tuple[int, int]:
        counters = self._worker.counters
        changelogs = _changelogs(self._worker)
        out = sum(n for topic, n in counters.records_out.items() if topic not in changelogs)
        return sum(counters.records_in.values()), out

    def _sample(self, now: float) -> None:
        records_in = dict(self._worker.counters.records_in)
        records_out = self._totals()[1]
        if self._sampled is not None:
            then, before, out_before = self._sampled
            elapsed = max(now - then, 1e-6)
            self.rates = {tp: (n - before.get(tp, 0)) / elapsed for tp, n in records_in.items()}
            self.rate_in = float(sum(self.rates.values()))
            self.rate_out = (records_out - out_before) / elapsed
        self._sampled = (now, records_in, records_out)

    @Service.task
    async def _refresh(self) -> None:
        interval = self._interval()
        while not self.should_stop:
            await self.sleep(interval)
            member = self._worker.member
            if member is not None:
                await member.refresh_end_offsets()
            now = time.monotonic()
            self._sample(now)
            self._log_status(now)
            if self.web is not None:
                self._record_history(now)

    @Service.task
    async def _watch_group(self) -> None:
        """Describe the group for the status page after each rebalance, every refresh
        while it is in flux, and every ``_GROUP_REFRESH`` seconds anyway."""
        if self.web is None or self._describe is None:
            return
        described: tuple[int, float] | None = None  # (generation, monotonic time)
        while not self.should_stop:
            membership = self._worker.membership
            generation = membership.generation if membership is not None else -1
            now = time.monotonic()
            if generation >= 0 and (
                described is None
                or described[0] != generation
                or now - described[1] >= _GROUP_REFRESH
                or not _settled(self.group)
            ):
                member_id = membership.member_id if membership is not None else None
                await self._describe_group(member_id)
                described = (generation, now)
            await self.sleep(self._interval())

    async def _describe_group(self, member_id: str | None) -> None:
        assert self._describe is not None
        try:
            info = await asyncio.wait_for(self._describe(), _DESCRIBE_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the broker's hiccup: the page says so, shows the last view
            log.debug("describing the group for the status page failed: %r", exc)
            if self.group is not None:
                self.group = {**self.group, "error": str(exc) or type(exc).__name__}
            return
        counts: dict[str, int] = {}
        for topic, label in self._topic_groups.items():
            count = self._worker.link.partitions.get(topic, 0)
            counts[label] = max(counts.get(label, 0), count)
        self.group = group_view(
            dataclasses.asdict(info),
            self._topic_groups,
            self_member=member_id,
            now=time.time(),
            previous=self.group,
            partitions=counts,
        )

    def _log_status(self, now: float) -> None:
        every = self._status_log_interval
        if every is None or self._logged is None or now - self._logged[0] < every:
            return
        then, in_before, out_before = self._logged
        records_in, records_out = self._totals()
        log.info(
            status_line(
                self.snapshot(), now - then, (records_in - in_before, records_out - out_before)
            )
        )
        self._logged = (now, records_in, records_out)
