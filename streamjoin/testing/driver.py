"""An in-memory test driver: run an app's agents without Kafka, feed events, collect sends.

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="ad-1", value={"user": "u1"})
        await driver.drain()
        assert [e.value for e in driver.records("click-counts")] == [...]

Records are encoded and decoded with the topics' codecs, keyed records land on
``murmur2(key) % partitions`` as on Kafka, records sent to a topic that an
agent reads are delivered to it (agents can be chained), and offsets are
tracked exactly as in the worker, so at-least-once behaviour can be tested.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from streamjoin.errors import ConfigurationError, InternalError, LifecycleError, UnknownTopicError
from streamjoin.events import Event, RawRecord
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.state import TableStores
from streamjoin.runtime.streams import AgentRuntime

if TYPE_CHECKING:
    from streamjoin.app import App


@dataclass(frozen=True)
class RecordMetadata:
    """What the in-memory 'broker' answers for a send (mirrors aiokafka's)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class TestDriver:
    """Runs ``app``'s agents over in-memory partitions."""

    __test__ = False  # not a pytest test class

    def __init__(self, app: App, *, default_partitions: int | None = None) -> None:
        self.app = app
        self.default_partitions = default_partitions or app.topic_partitions
        self._logs: dict[str, dict[int, list[RawRecord]]] = {}
        self.runtime: AgentRuntime | None = None
        self.stores: TableStores | None = None
        self.failure: BaseException | None = None

    # -- Sender protocol

    async def partition_count(self, topic: str) -> int:
        declared = self.app.topics.get(topic)
        return (declared.partitions if declared else None) or self.default_partitions

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None,
        headers: Sequence[tuple[str, bytes]],
        timestamp_ms: int | None,
    ) -> asyncio.Future[Any]:
        count = await self.partition_count(topic)
        if partition is None:
            partition = 0 if key is None else partition_for_key(key, count)
        if not 0 <= partition < count:
            raise ConfigurationError(
                f"{topic!r} has {count} partitions; partition {partition} is invalid"
            )
        log = self._logs.setdefault(topic, {}).setdefault(partition, [])
        timestamp = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        raw = RawRecord(topic, partition, len(log), timestamp, key, value, tuple(headers))
        log.append(raw)
        if self.runtime is not None and topic in self.runtime.topics:
            await self.runtime.dispatch(raw, self.runtime.epoch)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(RecordMetadata(topic, partition, raw.offset, timestamp))
        return future

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        last: RecordMetadata | None = None
        for key, value in records:
            future = await self.send(
                topic, key, value, partition=partition, headers=(), timestamp_ms=None
            )
            last = future.result()
        if last is None:
            raise InternalError("send_many needs at least one record")
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        done.set_result(last.offset)
        return done

    # -- user API

    async def put(
        self,
        topic: str,
        *,
        key: Any = None,
        value: Any = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """Produce one record to ``topic`` with its codecs, as a Kafka producer would."""
        declared = self.app.topics.get(topic)
        if declared is None:
            raise UnknownTopicError(f"topic {topic!r} is not declared by app {self.app.id!r}")
        future = await declared.send(
            key=key, value=value, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        meta: RecordMetadata = future.result()
        return meta

    async def put_raw(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int = 0
    ) -> RecordMetadata:
        """Produce raw bytes (e.g. a malformed record) bypassing the codecs."""
        future = await self.send(
            topic, key, value, partition=partition, headers=(), timestamp_ms=None
        )
        meta: RecordMetadata = future.result()
        return meta

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait until every agent has processed everything delivered to it."""
        runtime = self._require()
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self.failure is not None:
                raise self.failure
            busy = any(not r.queue.empty() or not r.idle.is_set() for r in runtime.runners)
            if not busy:
                await asyncio.sleep(0)  # let acknowledgement callbacks run
                if self.failure is not None:
                    raise self.failure
                await self.flush()
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"agents still busy after {timeout}s")
            await asyncio.sleep(0.001)

    async def flush(self) -> None:
        """What a worker does before committing: table writes to changelogs and stores."""
        if self.stores is not None:
            await self.stores.flush(self)

    def raw_records(self, topic: str) -> list[RawRecord]:
        """Everything written to ``topic``, by partition then offset."""
        parts = self._logs.get(topic, {})
        return [r for p in sorted(parts) for r in parts[p]]

    def records(self, topic: str) -> list[Event]:
        """Everything written to ``topic``, decoded with its codecs."""
        declared = self.app.topics[topic]
        out = []
        for r in self.raw_records(topic):
            key = declared.key_codec.loads(r.key) if r.key is not None else None
            value = declared.value_codec.loads(r.value) if r.value is not None else None
            out.append(Event(key, value, r.topic, r.partition, r.offset, r.timestamp, r.headers))
        return out

    def committable(self) -> dict[tuple[str, int], int]:
        """Per source partition, the offset a worker would commit now."""
        return self._require().tracker.committable()

    # -- lifecycle

    def _require(self) -> AgentRuntime:
        if self.runtime is None:
            raise LifecycleError("the test driver is not started: use `async with TestDriver(app)`")
        return self.runtime

    def _on_crash(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc

    async def __aenter__(self) -> TestDriver:
        self.app.resolve_partitions({})
        self.app.attach_sender(self)
        # Every table partition is local, in memory, and ready at once.
        self.stores = TableStores(self.app.tables, state_dir=None)
        for table in self.app.tables.values():
            for partition in range(table.partitions):
                self.stores.open(table, partition)
                table.ready.add(partition)
        self.runtime = self.app.build_runtime(self, self._on_crash, queue_size=0)
        self.runtime.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.runtime is not None:
            await self.runtime.stop(timeout=5.0)
        if self.stores is not None:
            self.stores.close_all()
        self.app.attach_sender(None)
