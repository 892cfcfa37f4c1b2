"""An in-memory test driver: run an app's agents without Kafka, feed events, collect sends.

    async with TestDriver(app) as driver:
        await driver.put("clicks", key="ad-1", value={"user": "u1"})
        await driver.drain()
        assert [e.value for e in driver.records("click-counts")] == [...]

Records are encoded and decoded with the topics' codecs, keyed records land on
``murmur2(key) % partitions`` as on Kafka, records sent to a topic that an
agent reads are delivered to it (agents can be chained), and offsets are
tracked exactly as in the worker, so at-least-once behaviour can be tested.

It runs the worker's own task manager, agent runtime, timestamp alignment of
co-partitioned inputs, table flushing and commit/revocation sequencing
(:class:`~streamjoin.runtime.tasks.processing.TaskProcessing`) over in-memory
transports: every task is assigned to it, every table partition is an in-memory
store, ready at once, and every partition counts as caught up (what was put is
delivered). :meth:`TestDriver.revoke` takes tasks through the worker's
revocation path (suspend, finish in-flight events, flush, commit),
:meth:`TestDriver.lose` through the fenced path (no flush, no commit), and
:meth:`TestDriver.assign` gives them back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from streamjoin.context import OutgoingRecord, current_event
from streamjoin.errors import ConfigurationError, InternalError, LifecycleError, UnknownTopicError
from streamjoin.events import Event, RawRecord
from streamjoin.partitioner import partition_for_key
from streamjoin.punctuation import agent_punctuated
from streamjoin.runtime.scheduled import ScheduledWork
from streamjoin.runtime.table_state.flush import TableFlusher
from streamjoin.runtime.table_state.service import TableStores
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.alignment import TimestampAligner
from streamjoin.runtime.tasks.processing import TaskProcessing
from streamjoin.runtime.tasks.punctuation import PunctuationService
from streamjoin.runtime.tasks.task import Task, TaskManager
from streamjoin.runtime.worker import WorkerTables
from streamjoin.state.global_rows import GlobalRowsStore, MemoryRows, batch_writes
from streamjoin.state.table_partition import TablePartition
from streamjoin.topics import check_timestamp_ms
from streamjoin.topology import Topology

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
        self.default_partitions = default_partitions or app.config.topic_partitions
        self._logs: dict[str, dict[int, list[RawRecord]]] = {}
        self.runtime: AgentRuntime | None = None
        self.stores: TableStores | None = None
        self.tasks: TaskManager | None = None
        self.processing: TaskProcessing | None = None
        self.topology: Topology | None = None
        self.failure: BaseException | None = None
        #: offsets committed by revocations, per source partition
        self.committed: dict[tuple[str, int], int] = {}
        #: the agents' punctuations, on :attr:`wall_clock_ms`, a clock moved by
        #: :meth:`advance_wall_clock` only (set to the real clock when the driver starts)
        self.punctuations: PunctuationService | None = None
        self.wall_clock_ms = 0
        #: the app's timers and app tasks: app tasks start with the driver, timers run
        #: when :meth:`run_timers` says; ``leader``: whether this "worker" leads the group
        self.scheduled: ScheduledWork | None = None
        self.leader = True
        #: global tables' in-memory copies by source topic: a record sent there is applied
        #: at once, so records sent after it (in the test's order) see it
        self._global_rows: dict[str, list[GlobalRowsStore]] = {}

    # -- Sender protocol

    async def partition_count(self, topic: str) -> int:
        settled = self.app.runtime_link.partitions.get(topic)
        if settled is not None:
            return settled
        declared = self.app.topics.get(topic)
        return (declared.partitions if declared else None) or self.default_partitions

    async def send(self, record: OutgoingRecord) -> asyncio.Future[Any]:
        topic, key, value, partition, headers, timestamp_ms = record
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
        global_rows = self._global_rows.get(topic, ())
        # (a changelog feeding a set global table is written by flushes: no drain, which
        # would flush again)
        if (
            global_rows
            and self.runtime is not None
            and current_event.get() is None
            and (topic not in self.app.changelog_topics)
        ):
            await self.drain()  # what the test sent before this row is processed without it
        for rows in global_rows:
            applied = batch_writes([(raw.offset, key, value)], partition, raw.offset + 1)
            rows.store.write(applied, None)
        if self.processing is not None and self.tasks is not None:
            task = self.tasks.task_for(topic, partition)
            if task is not None and topic in self.processing.runtime.topics:
                await self.processing.deliver(task, [raw])
                await self._release()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(RecordMetadata(topic, partition, raw.offset, timestamp))
        return future

    def send_now(self, record: OutgoingRecord) -> None:
        """Never at once: a record sent here may be delivered to agents, which awaits."""
        return None

    async def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> Awaitable[int]:
        last: RecordMetadata | None = None
        for key, value in records:
            future = await self.send((topic, key, value, partition, (), None))
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
        timestamp: None = None,
    ) -> RecordMetadata:
        """Produce one record to ``topic`` with its codecs, as a Kafka producer would.

        ``timestamp_ms`` is the record time in milliseconds since the epoch (default: now),
        what the agent sees as ``event.timestamp``.
        """
        timestamp_ms = check_timestamp_ms(timestamp_ms, timestamp, "put()")
        declared = self.app.topics.get(topic)
        if declared is None:
            raise UnknownTopicError(f"topic {topic!r} is not declared by app {self.app.id!r}")
        future = await declared.send(
            key=key, value=value, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        meta: RecordMetadata = future.result()
        return meta

    async def put_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        *,
        headers: Sequence[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
        timestamp: None = None,
    ) -> RecordMetadata:
        """Produce raw bytes (e.g. a malformed record) bypassing the codecs.

        Like :meth:`put`, the record goes to ``partition`` if given, else to
        ``murmur2(key) % partitions`` (partition 0 without a key).
        """
        timestamp_ms = check_timestamp_ms(timestamp_ms, timestamp, "put_raw()")
        if topic not in self.app.topics:
            raise UnknownTopicError(f"topic {topic!r} is not declared by app {self.app.id!r}")
        future = await self.send((topic, key, value, partition, headers, timestamp_ms))
        meta: RecordMetadata = future.result()
        return meta

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait until every agent has processed everything delivered to it (channel
        agents included: until their channels are empty)."""
        runtime = self._require()
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self.failure is not None:
                raise self.failure
            await self._release()
            busy = any(r.busy() for r in runtime.runners)
            held = self.processing is not None and self.processing.aligner.holding() > 0
            busy = busy or held or (self.punctuations is not None and self.punctuations.busy())
            busy = busy or any(channel.busy() for channel in self.app.channels.values())
            if not busy:
                await asyncio.sleep(0)  # let acknowledgement callbacks run
                if self.failure is not None:
                    raise self.failure
                await self.flush()
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"agents still busy after {timeout}s")
            await asyncio.sleep(0.001)

    async def flush(self, tasks: list[Task] | None = None) -> None:
        """What a worker does before committing: table writes to changelogs and stores."""
        if self.tasks is None or self.topology is None:
            return
        chosen = self.tasks.live() if tasks is None else tasks
        flusher = self._require_processing().flusher
        await flusher.flush(state for task in chosen for state in task.tables.values())

    async def revoke(self, partitions: Sequence[tuple[str, int]]) -> list[Task]:
        """Revoke the tasks of ``partitions`` as a worker does: suspend them, let in-flight
        events finish, flush their tables and commit exactly what they processed
        (:attr:`committed`), then close them."""
        return await self._require_processing().revoke(partitions, fenced=False)

    async def lose(self, partitions: Sequence[tuple[str, int]]) -> list[Task]:
        """Lose the tasks of ``partitions`` as a fenced worker does: nothing is flushed or
        committed, unflushed table writes are dropped."""
        return await self._require_processing().revoke(partitions, fenced=True)

    async def _flush_sends(self) -> None:
        """Every in-memory send is acknowledged at once."""

    async def _release(self) -> None:
        if self.processing is not None:
            await self.processing.release(lambda topic, partition, since: True, time.time() * 1000)

    async def commit(self) -> dict[tuple[str, int], int]:
        """What a worker's periodic commit does: flush every task's tables, then commit the
        positions of the events they cover (into :attr:`committed`); returns them."""
        return await self._require_processing().commit()

    async def assign(self, partitions: Sequence[tuple[str, int]]) -> None:
        """Give the tasks of ``partitions`` back (their tables as they were flushed; records
        sent to them from now on are processed again)."""
        manager = self._require_tasks()
        stores = self.stores
        topology = self.topology
        if stores is None or topology is None:
            raise LifecycleError("the test driver is not started")
        for task in manager.assign(partitions):
            for name in task.group.tables:
                store = stores.open(topology.tables[name], task.partition)
                manager.table_ready(
                    name, task.partition, TablePartition(name, task.partition, store)
                )
        if self.punctuations is not None:
            self.punctuations.fire_due(self.wall_clock_ms)  # (their wall-clock schedules start)

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

    async def run_timers(self, *names: str) -> list[str]:
        """Run the timers ``names`` (default: every timer and crontab) once now, in name
        order, as their ticks would: only on the leader for ``on_leader`` timers (see
        :attr:`leader`), errors by their ``on_error`` (``stop`` raises the failure here, as
        :meth:`drain` does). Returns the names of those that ran without an error."""
        scheduled = self.scheduled
        if scheduled is None:
            raise LifecycleError("the test driver is not started: use `async with TestDriver(app)`")
        unknown = sorted(set(names) - set(scheduled.timers))
        if unknown:
            known = ", ".join(sorted(scheduled.timers)) or "none"
            raise ConfigurationError(f"no timer named {', '.join(unknown)} (timers: {known})")
        ran = []
        for name in sorted(names or scheduled.timers):
            if await scheduled.run_timer(name):
                ran.append(name)
            if self.failure is not None:
                raise self.failure
        return ran

    async def advance_wall_clock(self, ms: int) -> int:
        """Move the punctuations' wall clock on by ``ms`` milliseconds and run the
        wall-clock punctuations then due (once each: a jump over several intervals runs
        one), on their tasks' actors, before returning (as :meth:`drain` does; what was put
        before is processed first). A task running since the driver started (or was
        assigned) is due an interval after that. Returns how many were due."""
        if type(ms) is not int or ms < 0:
            raise ConfigurationError(f"advance_wall_clock() takes milliseconds >= 0, got {ms!r}")
        await self.drain()  # (what was put before is processed first)
        self.wall_clock_ms += ms
        fired = 0 if self.punctuations is None else self.punctuations.fire_due(self.wall_clock_ms)
        await self.drain()
        return fired

    async def advance_stream_time(
        self, target: Any, to_ms: int, *, partition: int | None = None
    ) -> int:
        """Move the stream time of the tasks of ``target`` (an agent, or a topic or table
        one agent reads; ``partition``: only that task) to ``to_ms``, as a record with that
        timestamp would but without one, after what was put before is processed: the
        stream-time punctuations due then run before this returns. Returns how many tasks
        it moved."""
        where = f"advance_stream_time({target!r})"
        agent = agent_punctuated(target, self.app.agents, self.app.copartition_groups, where)
        await self.drain()  # (what was put before is processed first)
        moved = 0
        if self.punctuations is not None:
            partitions = None if partition is None else [partition]
            moved = self.punctuations.advance_stream_time(agent, to_ms, partitions)
        await self.drain()
        return moved

    def committable(self) -> dict[tuple[str, int], int]:
        """Per source partition, the offset a worker would commit now."""
        self._require().ack_finished()
        return self._require_tasks().committable()

    # -- lifecycle

    def _require(self) -> AgentRuntime:
        if self.runtime is None:
            raise LifecycleError("the test driver is not started: use `async with TestDriver(app)`")
        return self.runtime

    def _require_processing(self) -> TaskProcessing:
        if self.processing is None:
            raise LifecycleError("the test driver is not started: use `async with TestDriver(app)`")
        return self.processing

    def _require_tasks(self) -> TaskManager:
        if self.tasks is None:
            raise LifecycleError("the test driver is not started: use `async with TestDriver(app)`")
        return self.tasks

    def _on_crash(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc

    async def __aenter__(self) -> TestDriver:
        topology = self.topology = self.app.topology()
        self.tasks = TaskManager(topology)
        # Every table partition is local, in memory, and ready at once.
        self.stores = TableStores(topology.tables, state_dir=None)
        link = self.app.runtime_link
        link.settle_partitions(topology.resolve_partitions({}, self.app.config.topic_partitions))
        link.connect(self, WorkerTables(self.tasks, self.stores))
        for table in topology.global_tables.values():
            rows = GlobalRowsStore(MemoryRows())
            table.attach(rows)
            self._global_rows.setdefault(table.source.name, []).append(rows)
        self.runtime = AgentRuntime(
            topology.agents.values(), self, on_crash=self._on_crash, queue_size=0
        )
        self.processing = TaskProcessing(
            self.tasks,
            self.runtime,
            TimestampAligner(
                topology.aligned_groups(),
                max_idle_ms=self.app.config.align_max_idle_ms,
                idle_ms=self.app.config.align_idle_ms,
                first=topology.ties_first(),
            ),
            flusher=TableFlusher(self, topology.tables, flush_sends=self._flush_sends),
            offsets=_CommittedHere(self.committed),
        )
        every = [
            (topic, partition)
            for group in topology.task_groups()
            for topic in group.topics
            for partition in range(link.partitions[topic])
        ]
        if topology.punctuations:
            self.wall_clock_ms = time.time_ns() // 1_000_000
            self.punctuations = PunctuationService(
                topology.punctuations,
                self.runtime,
                self.tasks.live,
                on_crash=self._on_crash,
                clock_ms=lambda: self.wall_clock_ms,
            )
        await self.assign(every)
        self.runtime.start()
        self.scheduled = ScheduledWork(
            topology.timers.values(),
            topology.app_tasks.values(),
            is_leader=lambda: self.leader,
            on_crash=self._on_crash,
            counters=self.runtime.counters,
        )
        self.scheduled.start(timers=False)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.scheduled is not None:
            await self.scheduled.stop()
        if self.processing is not None:
            # after a failure the state may be what failed: stop without a final commit
            await self.processing.stop(commit=self.failure is None)
        if self.stores is not None:
            self.stores.close_all()
        for table in self.app.global_tables.values():
            table.attach(None)
        self._global_rows.clear()
        self.app.runtime_link.disconnect()


class _CommittedHere:
    """The group's committed offsets, as the driver keeps them (:attr:`TestDriver.committed`)."""

    def __init__(self, committed: dict[tuple[str, int], int]) -> None:
        self._committed = committed

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> bool:
        self._committed.update(offsets)
        return True
