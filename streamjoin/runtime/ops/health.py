"""Health probes: ``GET /health/live`` and ``GET /health/ready`` (docs/web.md).

Live: the process and its event loop answer (the handler running is the proof), so a
probe that gets no answer in time means the loop is stuck. Ready: the worker is in its
group at a generation, not rebalancing, no task planned for it is still held by another
member (the first step of a cooperative move), every task assigned here has its tables
restored, its global tables are restored, and no fatal error is stopping it (nor a stop request).
:func:`readiness` decides from a :class:`WorkerHealth` (plain facts, read from the worker
by :func:`health_of`), so the rules are tested without a worker. Neither route asks for
the query token: probes carry no secret, and the answers hold none (a fatal error is
named by its type only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from streamjoin.runtime.ops.web import Handler
from streamjoin.runtime.tasks.task import TaskState

if TYPE_CHECKING:
    from streamjoin.runtime.group.assignor_adapter import StreamjoinAssignor
    from streamjoin.runtime.group.membership import GroupMembership
    from streamjoin.runtime.table_state.global_tables import GlobalTableService
    from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
    from streamjoin.runtime.tasks.task import TaskManager
    from streamjoin.topology import Topology

__all__ = ["HealthProbes", "HealthSource", "WorkerHealth", "health_of", "readiness"]

LIVE_PATH = "/health/live"
READY_PATH = "/health/ready"
_RESTORING = (TaskState.CREATED, TaskState.RESTORING)


@dataclass(frozen=True)
class WorkerHealth:
    """What readiness is decided from."""

    #: the type name of the error stopping the worker, if one is
    failure: str | None = None
    #: a stop was asked (or a fatal error started one)
    stopping: bool = False
    #: the worker reads topics (or runs leader-only work): it must be in its group
    group_member: bool = False
    #: its generation in the group (-1: not in it)
    generation: int = -1
    rebalancing: bool = False
    #: source partitions the group's plan gives this worker, still held by their owner
    pending: Sequence[tuple[str, int]] = ()
    #: table -> partitions of tasks assigned here whose table is still restoring
    restoring: Mapping[str, Sequence[int]] = field(default_factory=dict)
    #: global tables not restored yet
    global_restoring: Sequence[str] = ()
    active_tasks: int = 0
    restoring_tasks: int = 0


def readiness(health: WorkerHealth) -> list[str]:
    """Why the worker is not ready, in words (empty: ready)."""
    reasons = []
    if health.failure is not None:
        reasons.append(f"a fatal error ({health.failure}) is stopping the worker")
    elif health.stopping:
        reasons.append("the worker is stopping")
    if health.group_member:
        if health.generation < 0:
            reasons.append("not in the group yet (joining)")
        elif health.rebalancing:
            reasons.append(f"the group is rebalancing (generation {health.generation})")
    if health.pending:
        moving = ", ".join(f"{topic}[{partition}]" for topic, partition in sorted(health.pending))
        reasons.append(f"waiting for {moving} to be handed over by their owner")
    for table, partitions in sorted(health.restoring.items()):
        if partitions:
            numbers = ", ".join(str(p) for p in sorted(partitions))
            reasons.append(f"table {table!r} is restoring partition(s) {numbers}")
    reasons.extend(
        f"global table {name!r} is restoring" for name in sorted(health.global_restoring)
    )
    return reasons


def readiness_body(health: WorkerHealth, reasons: Sequence[str]) -> dict[str, Any]:
    """The JSON answer of ``/health/ready``."""
    return {
        "ready": not reasons,
        "reasons": list(reasons),
        "generation": health.generation,
        "active_tasks": health.active_tasks,
        "restoring_tasks": health.restoring_tasks,
    }


class HealthSource(Protocol):
    """The parts of a :class:`~streamjoin.runtime.worker.Worker` readiness reads."""

    topology: Topology
    tasks: TaskManager
    runtime: AgentRuntime | None
    membership: GroupMembership | None
    assignor: StreamjoinAssignor | None
    global_tables: GlobalTableService | None
    failure: BaseException | None

    @property
    def should_stop(self) -> bool: ...


def health_of(worker: HealthSource) -> WorkerHealth:
    """The facts of ``worker`` now."""
    restoring: dict[str, list[int]] = {}
    active = waiting = 0
    for task in worker.tasks.live():
        if task.state in _RESTORING:
            waiting += 1
            for table in task.restoring:
                restoring.setdefault(table, []).append(task.partition)
        elif task.state is TaskState.RUNNING:
            active += 1
    service = worker.global_tables
    progress = {} if service is None else service.progress
    global_restoring = [
        name
        for name in worker.topology.global_tables
        if (found := progress.get(name)) is None or not found.restored
    ]
    runtime = worker.runtime
    membership = worker.membership
    changelogs = worker.topology.changelog_topics
    assignor = worker.assignor
    pending = [
        (topic, partition)
        for topic, partitions in ({} if assignor is None else assignor.pending).items()
        if topic not in changelogs
        for partition in partitions
    ]
    return WorkerHealth(
        failure=None if worker.failure is None else type(worker.failure).__name__,
        stopping=worker.should_stop,
        group_member=bool(runtime is not None and runtime.topics) or worker.topology.runs_on_leader,
        generation=-1 if membership is None else membership.generation,
        rebalancing=membership is not None and membership.rebalancing,
        pending=pending,
        restoring=restoring,
        global_restoring=global_restoring,
        active_tasks=active,
        restoring_tasks=waiting,
    )


class HealthProbes:
    """The two probe routes of one worker."""

    def __init__(self, worker: HealthSource) -> None:
        self._worker = worker

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", LIVE_PATH, self.live), ("GET", READY_PATH, self.ready)]

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(text='{"live": true}', content_type="application/json")

    async def ready(self, request: web.Request) -> web.Response:
        health = health_of(self._worker)
        reasons = readiness(health)
        return web.Response(
            status=503 if reasons else 200,
            text=json.dumps(readiness_body(health, reasons)),
            content_type="application/json",
        )
