"""Runs a started App on Kafka: topics, producer, agents and consumer as one mode service.

Start order: topics (create/verify), producer, agents, consumer. Stop order is
the reverse and loses nothing: stop fetching, let in-flight events finish,
flush sends, commit, leave the group (static members stay), stop the producer.
An agent failure under the ``stop`` policy stops the app; ``App.wait()``
re-raises it so the CLI can exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from mode import Service

from streamjoin.runtime.assignor_adapter import StreamjoinAssignor
from streamjoin.runtime.consumer import KafkaConsumerService
from streamjoin.runtime.producer import KafkaSender
from streamjoin.runtime.streams import AgentRuntime

if TYPE_CHECKING:
    from streamjoin.app import App

log = logging.getLogger("streamjoin.worker")


class KafkaRunner(Service):
    """The running side of one :class:`~streamjoin.app.App` on a Kafka cluster."""

    def __init__(self, app: App, queue_size: int = 1000) -> None:
        super().__init__()
        self.app = app
        self.queue_size = queue_size
        self.sender: KafkaSender | None = None
        self.runtime: AgentRuntime | None = None
        self.consumer: KafkaConsumerService | None = None
        self.assignor: StreamjoinAssignor | None = None
        self.failure: BaseException | None = None
        self._done = asyncio.Event()
        self._stopping = False

    @property
    def assignment(self) -> set[tuple[str, int]]:
        return set() if self.consumer is None else self.consumer.assigned

    async def on_start(self) -> None:
        app = self.app
        await app.prepare_topics()
        self.sender = KafkaSender(
            app.broker,
            client_options=app.client_options,
            producer_options=app.producer_options,
            client_id=app.client_id,
        )
        await self.sender.start()
        app.attach_sender(self.sender)
        self.runtime = app.build_runtime(self.sender, self._on_crash, self.queue_size)
        self.runtime.start()
        if self.runtime.topics:
            self.assignor = StreamjoinAssignor.for_app(app)
            self.consumer = KafkaConsumerService(
                app.broker,
                group_id=app.id,
                client_id=app.client_id,
                runtime=self.runtime,
                sender=self.sender,
                assignor=self.assignor,
                commit_interval=app.commit_interval,
                group_instance_id=app.group_instance_id,
                client_options=app.client_options,
                consumer_options=app.consumer_options,
                on_assignment=self.assignor.record_active,
            )
            await self.consumer.start()
        log.info(
            "app %s started: %d agents on %s",
            app.id,
            len(app.agents),
            ", ".join(sorted(self.runtime.topics)) or "no topics",
        )

    async def on_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            if self.consumer is not None:
                await self.consumer.shutdown()
                await self.consumer.stop()
            elif self.runtime is not None:
                await self.runtime.stop()
            if self.sender is not None:
                await self.sender.stop()
        finally:
            self.app.attach_sender(None)
            self._done.set()

    def _on_crash(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            log.error("stopping app %s after a fatal error: %s", self.app.id, exc)
            asyncio.get_running_loop().create_task(self.app.stop())

    async def wait_stopped(self) -> None:
        await self._done.wait()
        if self.failure is not None:
            raise self.failure
