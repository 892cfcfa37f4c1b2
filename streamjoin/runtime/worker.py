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
from streamjoin.runtime.state import StateService, TableStores
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
        self.stores: TableStores | None = None
        self.state_service: StateService | None = None
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
        if app.tables:
            self.stores = TableStores(app.tables, app.state_dir)
            self.state_service = StateService(
                self.stores,
                bootstrap_servers=app.broker,
                client_options=app.client_options,
                on_ready=self._table_ready,
                on_crash=self._on_crash,
            )
            await self.state_service.start()
        self.runtime = app.build_runtime(self.sender, self._on_crash, self.queue_size)
        self.runtime.start()
        if self.runtime.topics:
            self.assignor = StreamjoinAssignor.for_app(
                app,
                lag_provider=self.state_service.lags if self.state_service is not None else None,
            )
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
                on_assignment=self._assigned,
                on_revoke=self.state_service.revoke_all if self.state_service is not None else None,
                before_commit=self._flush_tables if self.stores is not None else None,
                blocked=self._blocked if self.stores is not None else None,
                aligned_groups=app.aligned_groups(),
                align_idle_ms=app.align_idle_ms,
                align_max_idle_ms=app.align_max_idle_ms,
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
            if self.state_service is not None:
                await self.state_service.stop()
            if self.sender is not None:
                await self.sender.stop()
        finally:
            self.app.attach_sender(None)
            self._done.set()

    # -- tables

    async def _flush_tables(self) -> None:
        if self.stores is not None and self.sender is not None:
            await self.stores.flush(self.sender, before_changelog=self.sender.flush)

    def _blocked(self, topic: str, partition: int) -> bool:
        """True while a table co-partitioned with ``topic`` is restoring ``partition``."""
        return any(
            topic in t.writers and partition not in t.ready for t in self.app.tables.values()
        )

    def _assigned(self, assigned: set[tuple[str, int]]) -> None:
        if self.assignor is not None:
            self.assignor.record_active(assigned)
        if self.state_service is None or self.assignor is None:
            return
        active: dict[str, set[int]] = {}
        standby: dict[str, set[int]] = {}
        for table in self.app.tables.values():
            active[table.name] = {p for t, p in assigned if t in table.writers}
            standby[table.name] = set(self.assignor.standby.get(table.changelog.name, ()))
        self.state_service.set_assignment(active, standby)

    def _table_ready(self, table: str, partition: int) -> None:
        if self.consumer is None:
            return
        for topic in self.app.tables[table].writers:
            if not self._blocked(topic, partition):
                self.consumer.resume(topic, partition)

    def _on_crash(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            log.error("stopping app %s after a fatal error: %s", self.app.id, exc)
            asyncio.get_running_loop().create_task(self.app.stop())

    async def wait_stopped(self) -> None:
        await self._done.wait()
        if self.failure is not None:
            raise self.failure
