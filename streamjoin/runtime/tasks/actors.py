"""The agent actor: one concurrent instance of an agent, its queue and its event loop.

Each actor has a bounded queue (backpressure on fetching) and a
:class:`~streamjoin.stream.Stream` its function iterates. The queue holds chunks (one
fetched batch's records for this actor, with their
:class:`~streamjoin.runtime.tasks.task.Task`); the actor walks the chunk it took without
touching the queue again. An event counts as processed when the function asks for the
next one; it is then handed to the acknowledgements. A record whose task stopped
running (revocation began) is dropped when it reaches the actor: it was never
acknowledged, so its next owner reads it again.

This is the per-event hot path, compiled with mypyc (:mod:`streamjoin.compiled`): the
actor is its own async iterator, and :meth:`AgentRunner.__anext__` hands out a buffered
event as native code, suspending only to wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from time import perf_counter
from typing import Any, Final, Protocol, cast

from streamjoin.agents import Agent
from streamjoin.context import current_event
from streamjoin.errors import AgentFailed, DecodeError, StoreCorrupted
from streamjoin.events import Event, RawRecord
from streamjoin.joins.run_state import JoinStats
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.tasks.acknowledgements import Acknowledgements
from streamjoin.runtime.tasks.error_policy import ErrorPolicy, corrupted_store_behind
from streamjoin.runtime.tasks.in_flight import InFlight
from streamjoin.runtime.tasks.record_queue import RecordQueue
from streamjoin.runtime.tasks.task import Task, TaskState
from streamjoin.stream import EventBatch, Stream

_RUNNING: Final = TaskState.RUNNING
#: (``Final``: a C static when compiled, not a module dict lookup per use)
_CURRENT_EVENT: Final = current_event

#: what an actor's queue holds: a task and records of it in order (None: stop)
_Chunk = tuple[Task, list[RawRecord]] | None

#: an actor gives the event loop a turn after this many events in a row: records it has
#: buffered are taken without suspending, so without it a long backlog would starve the
#: producer's sender, acknowledgements and the commit loop for seconds (nothing would be
#: committed until the backlog ends)
YIELD_EVERY: Final = 64


def _undecoded(raw: RawRecord) -> Any:
    """A raw-bytes agent's "decode": the record itself (it has an Event's fields, and the
    raw codec would return its key and value bytes unchanged)."""
    return raw


class Hold(Protocol):
    """What an actor checks before it hands out an event: whether a transaction's snapshot
    holds it (:class:`~streamjoin.runtime.tasks.barrier.TransactionBarrier`)."""

    #: held: wait for ``opened`` (a plain flag: checked before every event)
    holding: bool
    #: a snapshot waits for the actors sharing a topic: hand out a batch being filled now
    settling: bool
    opened: asyncio.Event


class Punctual(Protocol):
    """An actor's punctuations, as it runs them
    (:class:`~streamjoin.runtime.tasks.punctuation.ActorPunctuations`)."""

    #: the stream time at which the walked task's next punctuation is due (read per event)
    due_at: int
    #: punctuations due between two events (checked once per chunk)
    ticks: list[Any]

    def enter(self, task: Task, records: list[RawRecord]) -> None: ...

    def due_for(self, task: Task) -> int: ...

    def batch_end(self, chunk: list[RawRecord], pos: int, end: int, starts: bool) -> int: ...

    async def stream_time_passed(self, inflight: InFlight, stream_time_ms: int) -> None: ...

    async def run_tick(self) -> None: ...


class AgentRunner:
    """One actor of one agent: its queue, its stream and the task running the function."""

    def __init__(
        self,
        agent: Agent,
        index: int,
        *,
        queue_size: int,
        hold: Hold,
        acks: Acknowledgements,
        errors: ErrorPolicy,
        counters: WorkerCounters,
        join_stats: dict[str, JoinStats],
        on_store_corrupted: Callable[[Task, StoreCorrupted], None],
    ) -> None:
        self.agent = agent
        self.index = index
        self.queue: RecordQueue[_Chunk] = RecordQueue(maxsize=queue_size)
        self.stream = Stream(self)
        self.current: InFlight | None = None
        self.task: asyncio.Task[None] | None = None
        self.processed = 0
        #: the worker is stopping: the function returning is expected
        self.stopping = False
        self._hold = hold
        self._acks = acks
        self._errors = errors
        self._join_stats = join_stats
        self._on_store_corrupted = on_store_corrupted
        self._since_yield = 0
        #: the chunk being walked: its task, its records and the next one's index
        self._chunk_task: Task | None = None
        #: a finished event's context, reused for the next event
        self._spare: InFlight | None = None
        self._chunk: list[RawRecord] = []
        self._pos = 0
        #: chunks to walk before the queue's (the rest of a batch whose event failed)
        self._redo: list[tuple[Task, list[RawRecord]]] = []
        #: (an internal agent over raw-bytes topics is handed the records as read)
        self._raw_records = agent.raw_records
        self._decode: Callable[[RawRecord], Any] = (
            _undecoded if agent.raw_records else agent.decoder.decode
        )
        #: this agent's processing-time histogram, and when the current event was handed out
        self._latency = counters.latency_of(agent.name)
        self._started = 0.0
        #: the clock it is timed with (an attribute, read natively per event: the module's
        #: ``perf_counter`` would be a dict lookup at each of the two reads)
        self._clock: Callable[[], float] = perf_counter
        #: the histogram's bounds and counts, read and counted here natively per event;
        #: the sum of the latencies counted since :meth:`ack_finished` last added them
        self._latency_bounds: tuple[float, ...] = self._latency.bounds
        self._latency_counts: list[int] = self._latency.counts
        self._latency_sum = 0.0
        #: finished events of ``_done_task`` that sent nothing, not yet acknowledged: they
        #: are acknowledged together (see :meth:`ack_finished`)
        self._done: list[RawRecord] = []
        self._done_task: Task | None = None
        #: the stream ended (the worker stops): every later step ends it again
        self._ended = False
        #: waiting for more records to fill a batch (``stream.take(within=...)``): records
        #: taken from the queue but not handed out yet
        self.forming = False
        #: the agent's punctuations on this actor (None: it declares none; set before start)
        self.punctuations: Punctual | None = None

    @property
    def name(self) -> str:
        return f"{self.agent.name}#{self.index}"

    def end_stream(self) -> None:
        """The worker stops: drop buffered records and end the stream after the event
        being processed (the function then returns)."""
        self.stopping = True
        self.queue.clear()
        self._redo.clear()
        self._pos = len(self._chunk)
        self.queue.put_nowait(None)

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
        return self.__anext__()

    def events(self) -> AsyncIterator[Event]:
        """What ``async for event in stream`` iterates: the actor itself (see
        :meth:`__anext__`)."""
        return self

    def __aiter__(self) -> AgentRunner:
        return self

    async def __anext__(self) -> Any:
        """The actor's next event; asking for it marks the one being processed done.

        The actor is its own async iterator for its lifetime (an agent function restarted
        after an error goes on with it), and this is a coroutine rather than an async
        generator so that mypyc compiles it: a step that finds the next event buffered
        runs as native code and suspends nowhere. (Returns ``Any``: a raw-bytes agent's
        events are its records, see :func:`_undecoded`.)"""
        if self._ended:
            raise StopAsyncIteration
        current = self.current
        if current is not None:
            if current.sends or current.batch is not None:
                self._finish_current()
            else:
                # the usual case: an event that sent nothing is done now, and its
                # acknowledgement joins the others' (see ack_finished)
                self.current = None
                self.processed += 1
                took = self._clock() - self._started
                # the histogram's observe, inline and native: the bucket is the number of
                # bounds below ``took`` (bisect_left's; most events fall in the first)
                bounds = self._latency_bounds
                bucket = 0
                while bucket < len(bounds) and bounds[bucket] < took:
                    bucket += 1
                self._latency_counts[bucket] += 1
                self._latency_sum += took
                if current.task is not self._done_task:
                    self.ack_finished()
                    self._done_task = current.task
                self._done.append(current.record)
                self._spare = current
        hold = self._hold
        while True:
            if self._since_yield >= YIELD_EVERY:
                self._since_yield = 0
                self.ack_finished()  # (before anything else runs, here and below)
                await asyncio.sleep(0)  # the event loop's turn (see YIELD_EVERY)
                continue
            if hold.holding:
                self.ack_finished()
                await hold.opened.wait()  # a transaction is taking its snapshot
                continue
            chunk = self._chunk
            pos = self._pos
            if pos >= len(chunk):
                punctual = self.punctuations
                if punctual is not None and punctual.ticks:
                    self.ack_finished()
                    await punctual.run_tick()  # (a punctuation due between two events)
                    continue
                if not self._next_buffered_chunk():
                    self.ack_finished()
                    await self._wait_for_chunk()  # (raises StopAsyncIteration at the end)
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
                inflight = InFlight(raw, task, self._join_stats, self)
            else:
                self._spare = None
                inflight.record = raw
                inflight.task = task
            try:
                event = self._decode(raw)
            except DecodeError as exc:
                self.ack_finished()
                await self._handle_failure(inflight, exc, "decode")
                continue
            break
        self._since_yield += 1
        self.current = inflight
        if _CURRENT_EVENT.get() is not inflight:
            # (usually it is: the finished event's context is reused for the next one, and
            # reading the variable is cheaper than setting it, which copies the context)
            _CURRENT_EVENT.set(inflight)
        punctual = self.punctuations
        if punctual is not None and raw.timestamp >= punctual.due_at:
            # the record moved its task's stream time to a punctuation's due time: it
            # runs first, as part of this event (see runtime.tasks.punctuation)
            await punctual.stream_time_passed(inflight, raw.timestamp)
        self._started = self._clock()
        return event

    def ack_finished(self) -> None:
        """Acknowledge the finished events that sent nothing, in one call to their task's
        ledger instead of one per event. Done before the actor waits for anything (so while
        it is idle, or held by a transaction's snapshot, none is left), when the next such
        event is another task's, and by :meth:`AgentRuntime.ack_finished` before a commit
        reads the ledgers (an agent may be inside an event that awaits). The latencies
        counted since the last call join the histogram's sum here too."""
        if self._latency_sum:
            self._latency.sum += self._latency_sum
            self._latency_sum = 0.0
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
        _CURRENT_EVENT.set(None)  # (an event's context is set when it is handed out)
        self._walk(await self.queue.get())

    def _walk(self, item: _Chunk) -> None:
        if item is None:
            # the end of the stream: records taken but not handed out (a batch being
            # filled) were never acknowledged, so the partition's next owner reads them
            _CURRENT_EVENT.set(None)
            self._ended = True
            raise StopAsyncIteration
        self._chunk_task, self._chunk = item
        self._pos = 0
        if self.punctuations is not None:
            self.punctuations.enter(*item)

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
        hold = self._hold
        decode = self._decode
        raw_records = self._raw_records
        punctual = self.punctuations
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
                    if punctual is not None and punctual.ticks and not raws:
                        if hold.holding:
                            await hold.opened.wait()
                        await punctual.run_tick()  # (a punctuation due between two batches)
                        continue
                    if self._next_buffered_chunk():
                        continue
                    if raws:
                        if not within or hold.settling:
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
                cut = False
                if punctual is not None:
                    # a record reaching a punctuation's due stream time starts a batch
                    cut_at = punctual.batch_end(chunk, pos, end, not raws)
                    cut, end = cut_at < end, cut_at
                self._pos = end
                if raw_records:
                    raws.extend(chunk[pos:end])  # (no decode can fail: see _undecoded)
                else:
                    for raw in chunk[pos:end]:
                        try:
                            event = decode(raw)
                        except DecodeError as exc:
                            failed = InFlight(raw, task, self._join_stats, self)
                            await self._handle_failure(failed, exc, "decode")
                            continue
                        raws.append(raw)
                        events.append(event)
                if cut:
                    break
            if task is None or not raws:
                continue
            if hold.holding:
                await hold.opened.wait()  # a transaction is taking its snapshot
            if task.state is not _RUNNING:
                continue  # revocation began meanwhile: its next owner reads these again
            # From here to handing the batch out nothing awaits (as for one event).
            inflight = InFlight(raws[0], task, self._join_stats, self)
            inflight.batch = raws
            inflight.split_errors = per_event_errors
            self._since_yield += len(raws)
            self.current = inflight
            _CURRENT_EVENT.set(inflight)
            if punctual is not None and raws[0].timestamp >= punctual.due_for(task):
                await punctual.stream_time_passed(inflight, raws[0].timestamp)
            self._started = self._clock()
            # (a raw-bytes agent's events are its records: see _undecoded)
            handed = cast("list[Event]", raws) if raw_records else events
            return EventBatch(handed, raws, inflight)

    def _split_batch(self, inflight: InFlight) -> InFlight:
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
        failed = InFlight(batch[index], inflight.task, self._join_stats, self)
        if index:
            inflight.batch = batch[:index]
            # what the failed event sent before it raised is settled by its own policy
            inflight.settled.add(id(batch[index]))
            self.processed += index
            self._acks.complete(inflight)
        return failed

    def _finish_current(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            if current.batch is not None:
                self.processed += len(current.batch)
                self._latency.observe(self._clock() - self._started)
                self._acks.complete(current)
                return
            self.processed += 1
            self._latency.observe(self._clock() - self._started)
            if current.sends:
                self._acks.complete(current)
                return
            self._acks.acknowledge(current)  # nothing sent: acknowledged now
            # referenced by nothing the acknowledgements keep: the next event's context
            self._spare = current

    async def _handle_failure(self, inflight: InFlight, exc: BaseException, kind: str) -> None:
        """The error policy, with the actor still inside the event: a transaction's snapshot
        (or a revocation) waits until its dead letter is sent, so it belongs to the same
        transaction as the event's offset."""
        self.current = inflight
        try:
            await self._errors.apply(inflight, exc, kind)
            self._acks.acknowledge(inflight)
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
                _CURRENT_EVENT.set(None)
                self.ack_finished()
                corrupted = corrupted_store_behind(exc)
                if current is not None and corrupted is not None:
                    # Not the record's fault: its task's store is rebuilt and the record is
                    # read again (never acknowledged), whatever the error policy says.
                    self._on_store_corrupted(current.task, corrupted)
                    continue
                if current is None:
                    raise AgentFailed(
                        f"agent {self.name} raised outside of event processing: {exc!r}"
                    ) from exc
                if current.batch is not None and current.split_errors:
                    current = self._split_batch(current)
                await self._handle_failure(current, exc, "processing")
                continue  # skip / dead_letter: restart the function on the same stream
            if self.stopping:
                self._finish_current()
                self.ack_finished()
                return
            raise AgentFailed(
                f"agent {self.name} returned; an agent must keep iterating over its stream"
            )
