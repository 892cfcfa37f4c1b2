"""Runs agents over records handed in by a transport (Kafka consumer or in-memory driver).

Each agent actor has a bounded queue (backpressure on fetching) and a
:class:`~streamjoin.stream.Stream` its function iterates. Records are queued with
their :class:`~streamjoin.runtime.tasks.task.Task`; an event counts as processed when
the function asks for the next one, and is acknowledged to its task's offset
ledger once the records sent while processing it were acknowledged by the broker.
A record whose task stopped running (revocation began) is dropped when it reaches
the agent: it was never acknowledged, so its next owner reads it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from streamjoin.agents import Agent
from streamjoin.codecs import DecodeError
from streamjoin.context import Delivery, Sender, current_event, current_record
from streamjoin.errors import AgentFailed, RecordRejected, StoreCorrupted
from streamjoin.events import Event, RawRecord
from streamjoin.runtime.ops.metrics import WorkerCounters
from streamjoin.runtime.tasks.record_queue import RecordQueue
from streamjoin.runtime.tasks.task import Task, TaskState
from streamjoin.runtime.transport.out_batches import Sent
from streamjoin.state.table_partition import TablePartition
from streamjoin.stream import EventBatch, Stream

__all__ = ["AgentFailed", "AgentRunner", "AgentRuntime", "Stream", "current_record"]

log = logging.getLogger("streamjoin.agents")

_RUNNING = TaskState.RUNNING

#: what an actor's queue holds: a task and records of it in order (None: stop)
_Chunk = tuple[Task, list[RawRecord]] | None

#: an actor gives the event loop a turn after this many events in a row: records it has
#: buffered are taken without suspending, so without it a long backlog would starve the
#: producer's sender, acknowledgements and the commit loop for seconds (nothing would be
#: committed until the backlog ends)
YIELD_EVERY = 64


class _InFlight:
    """The event an actor is processing: the runtime's side of :mod:`streamjoin.context`."""

    __slots__ = (
        "batch",
        "pending",
        "record",
        "runner",
        "runtime",
        "senders",
        "sends",
        "settled",
        "split_errors",
        "task",
    )

    def __init__(
        self, raw: RawRecord, task: Task, runtime: AgentRuntime, runner: AgentRunner
    ) -> None:
        #: (an attribute, not a property: windowed tables read it twice per access)
        self.record = raw
        self.task = task
        self.runtime = runtime
        self.runner = runner
        self.sends: list[Delivery] = []
        #: acknowledgements (record batches) still awaited before the event counts
        self.pending = 0
        #: a batch of events (``stream.take``): all its records, and which record each send
        #: was made for (``record`` moves from event to event as the batch is iterated)
        self.batch: list[RawRecord] | None = None
        self.senders: list[RawRecord] = []
        #: records of the batch that an error policy acknowledged on its own (by id)
        self.settled: set[int] = set()
        #: an error in the batch gets the policy for its event alone (``per_event_errors``)
        self.split_errors = False

    def track_send(self, sent: Delivery) -> None:
        self.sends.append(sent)
        if self.batch is not None:
            self.senders.append(self.record)

    def table_partition(self, table: str) -> TablePartition | None:
        return self.task.tables.get(table)

    @property
    def task_values(self) -> dict[str, Any]:
        return self.task.values

    @property
    def worker_values(self) -> dict[str, Any]:
        return self.runtime.shared_values


class AgentRunner:
    """One actor of one agent: its queue, its stream and the task running the function.

    The queue holds chunks (one fetched batch's records for this actor, with their task);
    the actor walks the chunk it took without touching the queue again.
    """

    def __init__(self, agent: Agent, index: int, runtime: AgentRuntime, queue_size: int) -> None:
        self.agent = agent
        self.index = index
        self.runtime = runtime
        self.queue: RecordQueue[_Chunk] = RecordQueue(maxsize=queue_size)
        self.stream = Stream(self)
        self.current: _InFlight | None = None
        self.task: asyncio.Task[None] | None = None
        self.processed = 0
        self._since_yield = 0
        #: the chunk being walked: its task, its records and the next one's index
        self._chunk_task: Task | None = None
        #: a finished event's context, reused for the next event
        self._spare: _InFlight | None = None
        self._chunk: list[RawRecord] = []
        self._pos = 0
        #: chunks to walk before the queue's (the rest of a batch whose event failed)
        self._redo: list[tuple[Task, list[RawRecord]]] = []
        self._decode = agent.decode
        #: this agent's processing-time histogram, and when the current event was handed out
        self._latency = runtime.counters.latency_of(agent.name)
        self._started = 0.0
        #: finished events of ``_done_task`` that sent nothing, not yet acknowledged: they
        #: are acknowledged together (see :meth:`ack_finished`)
        self._done: list[RawRecord] = []
        self._done_task: Task | None = None
        #: the actor's events (see _walk_events)
        self._events = self._walk_events()
        #: waiting for more records to fill a batch (``stream.take(within=...)``): records
        #: taken from the queue but not handed out yet
        self.forming = False

    @property
    def name(self) -> str:
        return f"{self.agent.name}#{self.index}"

    def clear(self) -> None:
        """Drop buffered records (before stopping)."""
        self.queue.clear()
        self._redo.clear()
        self._pos = len(self._chunk)

    def busy(self) -> bool:
        """Inside an event, or holding records not yet handed to the function."""
        return (
            self.current is not None
            or self._pos < len(self._chunk)
            or bool(self._redo)
            or not self.queue.empty()
        )

    def next_event(self) -> Awaitable[Event]:
        """The next event (marks the previous one processed); what ``anext(stream)`` awaits."""
        return self._events.__anext__()

    def events(self) -> AsyncIterator[Event]:
        """What ``async for event in stream`` iterates (see :meth:`_walk_events`)."""
        return self._events

    async def _walk_events(self) -> AsyncIterator[Event]:
        """The actor's events, one at a time: one async generator for the actor's lifetime
        (an agent function restarted after an error goes on with it). A step that finds the
        next event buffered costs no coroutine and no call: the steps are spelled out here.
        Asking for the next event marks the one being processed done."""
        runtime = self.runtime
        decode = self._decode
        latency = self._latency
        perf_counter = time.perf_counter
        set_current = current_event.set
        while True:
            current = self.current
            if current is not None:
                if current.sends or current.batch is not None:
                    self._finish_current()
                else:
                    # the usual case: an event that sent nothing is done now, and its
                    # acknowledgement joins the others' (see ack_finished)
                    self.current = None
                    self.processed += 1
                    latency.observe(perf_counter() - self._started)
                    if current.task is not self._done_task:
                        self.ack_finished()
                        self._done_task = current.task
                    self._done.append(current.record)
                    self._spare = current
            while True:
                if self._since_yield >= YIELD_EVERY:
                    self._since_yield = 0
                    self.ack_finished()  # (before anything else runs, here and below)
                    await asyncio.sleep(0)  # the event loop's turn (see YIELD_EVERY)
                    continue
                if runtime.holding:
                    self.ack_finished()
                    await runtime.barrier.wait()  # a transaction is taking its snapshot
                    continue
                chunk = self._chunk
                pos = self._pos
                if pos >= len(chunk):
                    try:
                        if not self._next_buffered_chunk():
                            self.ack_finished()
                            await self._wait_for_chunk()
                    except StopAsyncIteration:
                        return  # the end of the stream (a generator must not raise it)
                    continue
                # From here to handing the event out nothing awaits: a snapshot or a
                # revocation sees this record either still buffered or being processed.
                raw = chunk[pos]
                self._pos = pos + 1
                task = self._chunk_task
                if task is None or task.state is not _RUNNING:
                    continue  # revocation began: its next owner reads it again
                inflight = self._spare
                if inflight is None:
                    inflight = _InFlight(raw, task, runtime, self)
                else:
                    self._spare = None
                    inflight.record = raw
                    inflight.task = task
                try:
                    event = decode(raw)
                except DecodeError as exc:
                    self.ack_finished()
                    await self._handle_failure(inflight, exc, "decode")
                    continue
                break
            self._since_yield += 1
            self.current = inflight
            set_current(inflight)
            self._started = perf_counter()
            yield event

    def ack_finished(self) -> None:
        """Acknowledge the finished events that sent nothing, in one call to their task's
        ledger instead of one per event. Done before the actor waits for anything (so while
        it is idle, or held by a transaction's snapshot, none is left), when the next such
        event is another task's, and by :meth:`AgentRuntime.ack_finished` before a commit
        reads the ledgers (an agent may be inside an event that awaits)."""
        done = self._done
        if done:
            self._done = []
            task = self._done_task
            if task is not None and task.accepts_acks:
                task.tracker.ack_records(done)

    def _next_buffered_chunk(self) -> bool:
        """Make the next buffered chunk the one walked, without suspending: the rest of a
        batch whose event failed first, then the queue's; False when nothing is buffered."""
        if self._redo:
            self._walk(self._redo.pop())
            return True
        ready, item = self.queue.get_nowait()
        if not ready:
            return False
        self._walk(item)
        return True

    async def _wait_for_chunk(self) -> None:
        """Wait for the next chunk and make it the one walked."""
        self._since_yield = 0
        current_event.set(None)  # (an event's context is set when it is handed out)
        self._walk(await self.queue.get())

    def _walk(self, item: _Chunk) -> None:
        if item is None:
            # the end of the stream: records taken but not handed out (a batch being
            # filled) were never acknowledged, so the partition's next owner reads them
            current_event.set(None)
            raise StopAsyncIteration
        self._chunk_task, self._chunk = item
        self._pos = 0

    def next_batch(
        self, max_events: int, within: float, per_event_errors: bool
    ) -> Awaitable[EventBatch]:
        """The next batch of events (marks the previous event or batch processed); what
        ``async for batch in stream.take(...)`` awaits."""
        if self.current is not None:
            self._finish_current()
        self.ack_finished()  # (events taken one at a time before)
        return self._next_batch(max_events, within, per_event_errors)

    async def _next_batch(
        self, max_events: int, within: float, per_event_errors: bool
    ) -> EventBatch:
        if self._since_yield >= YIELD_EVERY:
            self._since_yield = 0
            await asyncio.sleep(0)  # the event loop's turn (see YIELD_EVERY)
        runtime = self.runtime
        decode = self._decode
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            task: Task | None = None
            raws: list[RawRecord] = []
            events: list[Event] = []
            while len(raws) < max_events:
                chunk = self._chunk
                pos = self._pos
                if pos >= len(chunk):
                    if self._next_buffered_chunk():
                        continue
                    if raws:
                        if not within or runtime.settling:
                            break  # (a transaction's snapshot waits for this batch)
                        if deadline is None:
                            deadline = loop.time() + within
                        self._since_yield = 0
                        self.forming = True
                        try:
                            more = await self.queue.wait_nonempty(deadline - loop.time())
                        finally:
                            self.forming = False
                        if more:
                            continue
                        break
                    await self._wait_for_chunk()
                    continue
                chunk_task = self._chunk_task
                if chunk_task is None or chunk_task.state is not _RUNNING:
                    self._pos = len(chunk)  # revocation began: its next owner reads these again
                    continue
                if task is None:
                    task = chunk_task
                elif chunk_task is not task:
                    break  # another task's records start the next batch
                end = min(len(chunk), pos + max_events - len(raws))
                self._pos = end
                for raw in chunk[pos:end]:
                    try:
                        event = decode(raw)
                    except DecodeError as exc:
                        failed = _InFlight(raw, task, runtime, self)
                        await self._handle_failure(failed, exc, "decode")
                        continue
                    raws.append(raw)
                    events.append(event)
            if task is None or not raws:
                continue
            if runtime.holding:
                await runtime.barrier.wait()  # a transaction is taking its snapshot
            if task.state is not _RUNNING:
                continue  # revocation began meanwhile: its next owner reads these again
            # From here to handing the batch out nothing awaits (as for one event).
            inflight = _InFlight(raws[0], task, runtime, self)
            inflight.batch = raws
            inflight.split_errors = per_event_errors
            self._since_yield += len(raws)
            self.current = inflight
            current_event.set(inflight)
            self._started = time.perf_counter()
            return EventBatch(events, raws, inflight)

    def _split_batch(self, inflight: _InFlight) -> _InFlight:
        """A batch's event failed: the events before it count as processed (once the
        batch's sends are acknowledged), the events after it are handed out again, and the
        failed one is returned for the error policy, as if it had come alone."""
        batch = inflight.batch
        assert batch is not None
        failing = inflight.record
        index = next((i for i, raw in enumerate(batch) if raw is failing), 0)
        rest = batch[index + 1 :]
        if rest:
            if self._pos < len(self._chunk) and self._chunk_task is not None:
                self._redo.append((self._chunk_task, self._chunk[self._pos :]))
            self._redo.append((inflight.task, rest))
            self._pos = len(self._chunk)
        failed = _InFlight(batch[index], inflight.task, self.runtime, self)
        if index:
            inflight.batch = batch[:index]
            # what the failed event sent before it raised is settled by its own policy
            inflight.settled.add(id(batch[index]))
            self.processed += index
            self.runtime.complete(inflight)
        return failed

    def _finish_current(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            if current.batch is not None:
                self.processed += len(current.batch)
                self._latency.observe(time.perf_counter() - self._started)
                self.runtime.complete(current)
                return
            self.processed += 1
            self._latency.observe(time.perf_counter() - self._started)
            if current.sends:
                self.runtime.complete(current)
                return
            self.runtime.acknowledge(current)  # nothing sent: acknowledged now
            # referenced by nothing the runtime keeps: the next event's context
            self._spare = current

    async def _handle_failure(self, inflight: _InFlight, exc: BaseException, kind: str) -> None:
        """The error policy, with the actor still inside the event: a transaction's snapshot
        (or a revocation) waits until its dead letter is sent, so it belongs to the same
        transaction as the event's offset."""
        self.current = inflight
        try:
            await self.runtime.handle_failure(self, inflight, exc, kind)
        finally:
            self.current = None

    async def run(self) -> None:
        while True:
            try:
                await self.agent(self.stream)
            except AgentFailed:
                raise
            except Exception as exc:
                current, self.current = self.current, None
                current_event.set(None)
                self.ack_finished()
                corrupted = _store_corrupted(exc)
                if current is not None and corrupted is not None:
                    # Not the record's fault: its task's store is rebuilt and the record is
                    # read again (never acknowledged), whatever the error policy says.
                    self.runtime.store_corrupted(current.task, corrupted)
                    continue
                if current is None:
                    raise AgentFailed(
                        f"agent {self.name} raised outside of event processing: {exc!r}"
                    ) from exc
                if current.batch is not None and current.split_errors:
                    current = self._split_batch(current)
                await self._handle_failure(current, exc, "processing")
                continue  # skip / dead_letter: restart the function on the same stream
            if self.runtime.stopping:
                self._finish_current()
                self.ack_finished()
                return
            raise AgentFailed(
                f"agent {self.name} returned; an agent must keep iterating over its stream"
            )


class AgentRuntime:
    """All agent actors of an app, the routing of records to them, and their acknowledgements."""

    def __init__(
        self,
        agents: Iterable[Agent],
        sender: Sender,
        *,
        on_crash: Callable[[BaseException], None],
        on_store_corrupted: Callable[[Task, StoreCorrupted], None] | None = None,
        queue_size: int = 1000,
        transactional: bool = False,
        counters: WorkerCounters | None = None,
    ) -> None:
        self.sender = sender
        #: the worker's metrics (processing latency, failed records)
        self.counters = counters if counters is not None else WorkerCounters()
        self.stopping = False
        #: exactly-once: an event counts as processed as soon as its function is done with
        #: it (its sends belong to the open transaction, which commits them all or none)
        self.transactional = transactional
        #: cleared while a commit takes its snapshot: no actor starts a new event
        self.barrier = asyncio.Event()
        self.barrier.set()
        #: the barrier is closed (a plain flag: actors check it before every event)
        self.holding = False
        self._on_crash = on_crash
        self._on_store_corrupted = on_store_corrupted
        #: values agents keep for the worker's lifetime (join counters), by key
        self.shared_values: dict[str, Any] = {}
        #: events waiting for the acknowledgement of a record batch (or a lone send)
        self._waiting: dict[Any, list[_InFlight]] = {}
        #: on_error policies being applied to events whose sends the broker refused
        self._policies: set[asyncio.Future[None]] = set()
        self.runners: list[AgentRunner] = []
        self._routes: dict[str, list[list[AgentRunner]]] = {}
        for agent in agents:
            actors = [AgentRunner(agent, i, self, queue_size) for i in range(agent.concurrency)]
            self.runners.extend(actors)
            for topic in agent.topics:
                self._routes.setdefault(topic.name, []).append(actors)
        #: actors of agents that read a topic another agent reads too (see settle_shared)
        self._sharing = [
            runner
            for agents_of_topic in self._routes.values()
            if len(agents_of_topic) > 1
            for actors in agents_of_topic
            for runner in actors
        ]
        #: cleared while a transaction's snapshot waits for those actors: nothing new is
        #: handed to any actor
        self._dispatch_open = asyncio.Event()
        self._dispatch_open.set()
        #: dispatch_many calls past that gate, not finished yet
        self._dispatching = 0
        #: settle_shared is waiting: batches being filled are handed out as they are
        self.settling = False

    @property
    def topics(self) -> set[str]:
        return set(self._routes)

    # -- lifecycle

    def start(self) -> None:
        for runner in self.runners:
            runner.task = asyncio.create_task(self._supervise(runner), name=runner.name)

    async def _supervise(self, runner: AgentRunner) -> None:
        try:
            await runner.run()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._on_crash(exc)

    async def stop(self, timeout: float = 30.0) -> None:
        """Let in-flight events finish, drop buffered ones, end the agent functions."""
        self.stopping = True
        for runner in self.runners:
            runner.clear()
            runner.queue.put_nowait(None)  # the end of its stream
        tasks = [r.task for r in self.runners if r.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                log.warning(
                    "agent %s did not stop within %.0fs; cancelling", task.get_name(), timeout
                )
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    # -- records in

    async def dispatch_many(self, raws: Sequence[RawRecord], task: Task) -> None:
        """Hand fetched records of one task, in order, to every agent reading their topics:
        registered with the task's offset ledger first (a run of one partition's records
        at a time), then queued as one chunk per actor (may wait while an actor's queue is
        full). Nothing is handed over once the task stopped running (the records are read
        again by its next owner)."""
        if not self._dispatch_open.is_set():
            await self._dispatch_open.wait()  # a transaction's snapshot (see settle_shared)
        if not task.running or not raws:
            return
        self._dispatching += 1
        try:
            await self._dispatch(raws, task)
        finally:
            self._dispatching -= 1

    async def _dispatch(self, raws: Sequence[RawRecord], task: Task) -> None:
        routes = self._routes
        register = task.tracker.register_many
        chunks: dict[AgentRunner, list[RawRecord]] = {}
        start = 0
        end = len(raws)
        while start < end:
            first = raws[start]
            topic, partition = first.topic, first.partition
            stop = start + 1
            while stop < end and raws[stop].partition == partition and raws[stop].topic == topic:
                stop += 1
            run = raws[start:stop] if start or stop < end else raws
            targets = [actors[partition % len(actors)] for actors in routes.get(topic, ())]
            register((topic, partition), [raw.offset for raw in run], len(targets))
            for runner in targets:
                chunk = chunks.get(runner)
                if chunk is None:
                    chunks[runner] = list(run)
                else:
                    chunk.extend(run)
            start = stop
        for runner, chunk in chunks.items():
            if _stopped(task):
                return  # revocation began while waiting for room: the rest is read again
            await runner.queue.put((task, chunk), len(chunk))

    async def settle_shared(self, timeout: float) -> bool:
        """Hand nothing new to any actor, and wait until the actors of agents that share a
        topic (two agents reading one topic) have processed everything handed to them;
        False if some had not after ``timeout`` seconds. Call :meth:`open_dispatch` after
        the snapshot.

        A batch being filled (``stream.take(within=...)``) is handed out as it is rather
        than after ``within``.

        A partition's offset counts a record only once every agent reading it processed
        it, but each agent's table writes and sends go into the transaction as it goes:
        a snapshot taken while one agent is ahead of another on the same partition would
        commit the faster agent's effects of records whose offset is not committed, and a
        restart would apply them twice. Caught up, both are at the same offset."""
        if not self._sharing:
            return True
        self._dispatch_open.clear()
        # a batch being filled (stream.take(within=...)) is handed out as it is
        self.settling = True
        for runner in self._sharing:
            if runner.forming:
                runner.queue.wake()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while self._dispatching or self.sharing_behind():
                if loop.time() >= deadline:
                    return False
                await asyncio.sleep(0.001)
            return True
        finally:
            self.settling = False

    def open_dispatch(self) -> None:
        """Hand records to the actors again (after :meth:`settle_shared`)."""
        self._dispatch_open.set()

    def sharing_behind(self) -> list[str]:
        """Actors of agents sharing a topic that still have records to process (an actor
        whose function ended has none)."""
        return [
            r.name
            for r in self._sharing
            if (r.busy() or r.forming) and r.task is not None and not r.task.done()
        ]

    def ack_finished(self) -> None:
        """Acknowledge every actor's finished events still waiting to be acknowledged
        together (see :meth:`AgentRunner.ack_finished`): before a commit reads the ledgers."""
        for runner in self.runners:
            runner.ack_finished()

    def busy_with(self, tasks: Iterable[Task]) -> list[str]:
        """Actors processing an event of one of ``tasks`` right now."""
        wanted = set(map(id, tasks))
        return [
            r.name for r in self.runners if r.current is not None and id(r.current.task) in wanted
        ]

    async def wait_idle(self, tasks: Iterable[Task], timeout: float) -> bool:
        """Wait until no actor is inside an event of ``tasks`` and every finished event's
        sends were acknowledged (so its offset counts); False on timeout."""
        tasks = list(tasks)
        deadline = asyncio.get_running_loop().time() + timeout
        while self.busy_with(tasks) or any(t.awaiting_sends for t in tasks):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def inside_events(self) -> list[str]:
        """Actors processing an event right now (of any task)."""
        return [r.name for r in self.runners if r.current is not None]

    async def quiesce(self, timeout: float) -> bool:
        """Hold every actor between two events (the snapshot of a transaction: every event
        is either wholly before it or wholly after it); False if some actor was still inside
        an event after ``timeout`` seconds (the barrier stays closed: call :meth:`resume`)."""
        self.holding = True
        self.barrier.clear()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.inside_events():
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.001)
        return True

    def resume(self) -> None:
        """Let the actors take new events again."""
        self.holding = False
        self.barrier.set()

    # -- acknowledgements

    def complete(self, inflight: _InFlight) -> None:
        """Acknowledge an event once its sends are acknowledged (at once when
        transactional: the commit checks every send of the transaction).

        Sends are awaited by what the broker acknowledges together (a record batch, see
        :class:`~streamjoin.context.Delivery`): the events waiting on one batch are listed
        under it, and one callback per batch acknowledges them in order."""
        sends = inflight.sends
        if not sends or self.transactional:
            self.acknowledge(inflight)
            return
        if len(sends) == 1:
            delivery = _acknowledged_by(sends[0])
            if not delivery.done():
                # the usual case (one send, its batch not yet acknowledged), without the
                # general loops below
                inflight.pending = 1
                inflight.task.awaiting_sends += 1
                events = self._waiting.get(delivery)
                if events is None:
                    self._waiting[delivery] = [inflight]
                    delivery.add_done_callback(self._delivered)
                else:
                    events.append(inflight)
                return
            awaited = [delivery]
        else:
            awaited = _acknowledgements(sends)
        pending = 0
        for delivery in awaited:
            if not delivery.done():
                pending += 1
            elif _failed(delivery) and inflight.batch is not None:
                self._batch_sends_failed(inflight, delivery)
            elif _failed(delivery):
                failed = _failed_send(inflight, delivery)
                if failed is not None:
                    self._send_failed(inflight, failed)
                    return
        if not pending:
            self.acknowledge(inflight)
            return
        inflight.pending = pending
        inflight.task.awaiting_sends += 1
        waiting = self._waiting
        for delivery in awaited:
            if delivery.done():
                continue
            events = waiting.get(delivery)
            if events is None:
                waiting[delivery] = [inflight]
                delivery.add_done_callback(self._delivered)
            else:
                events.append(inflight)

    def _delivered(self, delivery: Any) -> None:
        """A batch (or a lone send) was acknowledged or failed: so are the events waiting
        on it, in order."""
        events = self._waiting.pop(delivery, ())
        failed = _failed(delivery)
        for inflight in events:
            if inflight.pending <= 0:
                continue  # one of its sends failed already
            if failed and inflight.batch is not None:
                self._batch_sends_failed(inflight, delivery)
            elif failed:
                sent = _failed_send(inflight, delivery)
                if sent is not None:
                    inflight.pending = 0
                    inflight.task.awaiting_sends -= 1
                    self._send_failed(inflight, sent)
                    continue
            inflight.pending -= 1
            if inflight.pending == 0:
                inflight.task.awaiting_sends -= 1
                self.acknowledge(inflight)

    def acknowledge(self, inflight: _InFlight) -> None:
        """Count the event processed in its task's offset ledger (if its task still takes
        acknowledgements)."""
        task = inflight.task
        if task.accepts_acks:
            batch = inflight.batch
            if batch is None:
                task.tracker.ack_records((inflight.record,))
                return
            settled = inflight.settled
            task.tracker.ack_records(
                batch if not settled else [raw for raw in batch if id(raw) not in settled]
            )

    def _batch_sends_failed(self, inflight: _InFlight, delivery: Delivery) -> None:
        """Sends of a batch that ``delivery`` (failed) failed: the error policy applies to
        the whole batch, or (``per_event_errors``) to each event that made one, as if it had
        come alone; what it acknowledges is left out when the batch is acknowledged."""
        settled = inflight.settled
        batch = inflight.batch
        assert batch is not None
        if not inflight.split_errors:
            # the batch is the unit: the policy applies to all of it, once
            refused = next(
                (s for s in inflight.sends if _acknowledged_by(s) is delivery and _failed(s)), None
            )
            rest = [raw for raw in batch if id(raw) not in settled]
            if refused is None or not rest:
                return
            settled.update(map(id, rest))
            whole = _InFlight(rest[0], inflight.task, self, inflight.runner)
            whole.batch = rest
            self._send_failed(whole, refused)
            return
        for sent, record in zip(inflight.sends, inflight.senders, strict=True):
            if _acknowledged_by(sent) is delivery and _failed(sent) and id(record) not in settled:
                settled.add(id(record))
                self._send_failed(_InFlight(record, inflight.task, self, inflight.runner), sent)

    def _send_failed(self, inflight: _InFlight, sent: Delivery) -> None:
        self.counters.error("send")
        raw = inflight.record
        exc = sent.exception() if not sent.cancelled() else asyncio.CancelledError()
        if isinstance(exc, RecordRejected):
            # The broker refused the record for what it is: the agent's on_error policy
            # applies to the event that sent it, as if the send had raised there.
            policy = asyncio.ensure_future(self._refused(inflight, exc))
            self._policies.add(policy)
            policy.add_done_callback(self._policies.discard)
            return
        self._on_crash(
            AgentFailed(
                f"a record sent while processing {raw.position} "
                f"was not acknowledged: {exc!r}; stopping without committing past it"
            )
        )

    async def _refused(self, inflight: _InFlight, exc: RecordRejected) -> None:
        try:
            await self.handle_failure(inflight.runner, inflight, exc, "send")
        except Exception as failure:
            self._on_crash(failure)

    # -- failures

    def store_corrupted(self, task: Task, exc: StoreCorrupted) -> None:
        """A read in ``task``'s store found it corrupted: the worker rebuilds it (without a
        handler, e.g. in-memory stores, that stops the worker like any fatal error)."""
        if self._on_store_corrupted is None:
            self._on_crash(exc)
        else:
            self._on_store_corrupted(task, exc)

    async def handle_failure(
        self, runner: AgentRunner, inflight: _InFlight, exc: BaseException, kind: str
    ) -> None:
        """The agent's ``on_error`` for the event (or the whole batch) ``inflight``."""
        raw = inflight.record
        records = [raw] if inflight.batch is None else inflight.batch
        where = records[0].position
        if len(records) > 1:
            where = f"the batch of {len(records)} events {where} to {records[-1].position}"
        what = _WHAT.get(kind, "failed on")
        policy = runner.agent.on_error
        counters = self.counters
        counters.error(kind)
        if policy != "stop":
            failed = counters.skipped if policy == "skip" else counters.dead_lettered
            failed[runner.agent.name] = failed.get(runner.agent.name, 0) + len(records)
        if policy == "stop":
            # one line, with where the agent raised; the traceback is at DEBUG
            log.error("agent %s %s %s: %s; stopping", runner.name, what, where, _say(exc))
            log.debug("traceback of the failed record %s", where, exc_info=exc)
            raise AgentFailed(f"agent {runner.name} {what} {where}: {_say(exc)}") from exc
        if policy == "skip":
            # one line per skipped record; the traceback is for debugging only
            log.warning("agent %s %s %s: %s; skipped", runner.name, what, where, _say(exc))
            log.debug("traceback of the skipped record %s", where, exc_info=exc)
        else:
            dlq = runner.agent.dead_letter
            if dlq is None:  # rejected when the agent is declared; kept for type narrowing
                raise AgentFailed(f"agent {runner.name} has no dead-letter topic") from exc
            error = ("streamjoin-error", f"{kind}: {exc!r}"[:2000].encode())
            agent = ("streamjoin-agent", runner.agent.name.encode())
            futures = []
            for record in records:
                headers = (
                    *record.headers,
                    error,
                    ("streamjoin-source", record.position.encode()),
                    agent,
                )
                futures.append(
                    await self.sender.send(
                        dlq.name,
                        record.key,
                        record.value,
                        partition=None,
                        headers=headers,
                        timestamp_ms=record.timestamp,
                    )
                )
            if not self.transactional:  # (exactly-once: the commit checks every send)
                for future in futures:
                    await future
            log.warning(
                "agent %s %s %s: %s; sent to dead-letter topic %s",
                runner.name,
                what,
                where,
                _say(exc),
                dlq.name,
            )
            log.debug("traceback of the dead-lettered record %s", where, exc_info=exc)
        self.acknowledge(inflight)


def _store_corrupted(exc: BaseException) -> StoreCorrupted | None:
    """The :class:`StoreCorrupted` behind ``exc`` (itself, or what it was raised from)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, StoreCorrupted):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


#: how a failure of each kind reads in the log ("agent X <what> topic[p]@offset: ...")
_WHAT = {
    "decode": "could not decode",
    "processing": "failed on",
    "send": "had a record refused by the broker while processing",
}


def _say(exc: BaseException) -> str:
    """``Type: message (file:line)``, the line where the agent's code raised (a refused or
    undecodable record's message says what is wrong with it instead)."""
    if isinstance(exc, RecordRejected | DecodeError):
        return f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{place}"


def _stopped(task: Task) -> bool:
    """Whether ``task`` stopped running (a function: the state changes across awaits)."""
    return not task.running


def _failed(future: Delivery) -> bool:
    return future.cancelled() or future.exception() is not None


def _acknowledgements(sends: list[Delivery]) -> list[Delivery]:
    """The distinct deliveries that acknowledge ``sends``, in order: :func:`_acknowledged_by`
    of each, inlined for our own sends (a batch of events sends hundreds per call)."""
    found: dict[int, Delivery] = {}
    last: Delivery | None = None
    for sent in sends:
        delivery = sent.batch.future if type(sent) is Sent else _acknowledged_by(sent)
        if delivery is not last:  # (consecutive sends usually share a record batch)
            found[id(delivery)] = last = delivery
    return list(found.values())


def _acknowledged_by(sent: Delivery) -> Delivery:
    """What acknowledges ``sent``: its record batch's future, or ``sent`` itself."""
    acknowledged: Delivery = getattr(sent, "acknowledged", sent)
    return acknowledged


def _failed_send(inflight: _InFlight, delivery: Delivery) -> Delivery | None:
    """The event's first send that ``delivery`` (failed) failed: a batch may fail some of
    its records and not others (those sent again after a refusal)."""
    for sent in inflight.sends:
        if _acknowledged_by(sent) is delivery and _failed(sent):
            return sent
    return None
