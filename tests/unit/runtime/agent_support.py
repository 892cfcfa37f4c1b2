"""What the agent runtime's unit tests share: one running task, and a sender whose
acknowledgements the test settles by hand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from streamjoin import App
from streamjoin.context import OutgoingRecord
from streamjoin.errors import RecordRejected
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.task import Task, TaskManager
from streamjoin.runtime.worker import WorkerTables


def one_task(app: App, topic: str, partition: int = 0) -> tuple[TaskManager, Task]:
    """A task manager holding the running task of ``topic[partition]``."""
    manager = TaskManager(app.topology())
    manager.assign([(topic, partition)])
    task = manager.task_for(topic, partition)
    assert task is not None and task.running
    return manager, task


class ManualSender:
    """Sends whose acknowledgements the test releases by hand: ``futures[i]`` is the i-th
    send's, ``sent[i]`` its ``(topic, value)``."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[Any]] = []
        self.sent: list[tuple[str, bytes | None]] = []

    async def send(self, record: OutgoingRecord) -> asyncio.Future[Any]:
        topic, _, value, _, _, _ = record
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        self.sent.append((topic, value))
        return future

    def send_now(self, record: OutgoingRecord) -> None:
        return None  # every send goes through send(), which the test settles by hand

    def settle_all(
        self, refuse: Callable[[str, bytes | None], bool] = lambda topic, value: False
    ) -> None:
        """Acknowledge every unsettled send, except those ``refuse`` says the broker
        refuses (:class:`RecordRejected`)."""
        for (topic, value), future in zip(self.sent, self.futures, strict=True):
            if future.done():
                continue
            if refuse(topic, value):
                future.set_exception(RecordRejected(f"refused {value!r}", topic=topic))
            else:
                future.set_result(None)

    async def partition_count(self, topic: str) -> int:
        return 1


@contextlib.asynccontextmanager
async def running(
    app: App, sender: Any, topic: str, on_crash: Callable[[BaseException], None]
) -> AsyncIterator[tuple[AgentRuntime, TaskManager, Task]]:
    """The app's agents running over ``sender`` with the task of ``topic[0]`` assigned (the
    app's topics and tables reach them); stopped on exit."""
    runtime = AgentRuntime(app.agents.values(), sender, on_crash=on_crash)
    manager, task = one_task(app, topic)
    app.runtime_link.connect(sender, WorkerTables(manager, None))
    runtime.start()
    try:
        yield runtime, manager, task
    finally:
        await runtime.stop(timeout=1)
        app.runtime_link.disconnect()
