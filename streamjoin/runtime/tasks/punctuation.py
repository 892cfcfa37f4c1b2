"""Running punctuations (``@app.punctuate``) on the actors that process their tasks' events.

A punctuation of an agent runs on the actor holding the task's partition
(``partition % concurrency``), inside the actor's event loop
(:mod:`~streamjoin.runtime.tasks.actors`), so it never runs while an event of that actor
does, and the transaction barrier and revocation see it as an event in progress:

* **stream time**: the actor compares each record's timestamp with the next due stream
  time of the record's task (one comparison per event, and only for actors of agents
  that declare one). When it is reached, the punctuation runs *before* the record is
  handed to the agent, under that record's event context: what it sends delays the
  record's acknowledgement, and what it writes is buffered before the record can count,
  so no commit covers the record without the punctuation's writes and sends (and a
  replay from before the record runs it again). A batch (``stream.take``) ends before a
  record that reaches the next due time, and that record starts the next batch.
* **wall clock**: :class:`PunctuationService` keeps, per punctuation and running task,
  when it is due next (an interval after the task was first seen running, then every
  interval on that grid); a due one is queued to its actor as a tick (an empty chunk that
  wakes it), and the actor runs it between two events under an event context of its own
  (a record of offset -1 that counts nowhere). Under at-least-once its sends hold the
  task's revocation until they are acknowledged; a send that fails stops the worker (a
  refused one gets the agent's ``on_error``); under exactly-once they belong to the open
  transaction, as every send does.

An error raised by a punctuation gets the agent's ``on_error``: ``stop`` stops the worker
(nothing is committed past the record that made a stream-time punctuation due), ``skip``
and ``dead_letter`` (there is no record to dead-letter) log it, count it
(``errors{kind="punctuation"}``) and go on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from streamjoin.agents import Agent
from streamjoin.context import Delivery, current_event
from streamjoin.errors import AgentFailed, RecordRejected, StoreCorrupted
from streamjoin.events import RawRecord
from streamjoin.joins.run_state import JoinStats
from streamjoin.punctuation import (
    NOT_STARTED,
    Punctuation,
    PunctuationContext,
    next_stream_due,
    next_wall_clock_due,
)
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.tasks.acknowledgements import Acknowledgements
from streamjoin.runtime.tasks.actors import AgentRunner
from streamjoin.runtime.tasks.agent_runtime import AgentRuntime
from streamjoin.runtime.tasks.error_policy import corrupted_store_behind
from streamjoin.runtime.tasks.in_flight import InFlight
from streamjoin.runtime.tasks.task import Task, TaskState

log = logging.getLogger("streamjoin.punctuation")

#: no stream-time punctuation is ever due (an actor of an agent with wall-clock ones only)
NEVER = 2**63


def wall_clock_ms() -> int:
    """Now, in milliseconds since the epoch (what a wall-clock punctuation is given)."""
    return time.time_ns() // 1_000_000


#: the records of a tick: an empty chunk, queued to wake an actor with punctuations due
TICK: list[RawRecord] = []


@dataclass(frozen=True, slots=True)
class Tick:
    """A punctuation due on an actor for ``task``: a wall-clock one due at ``at_ms``, or
    (``punctuation`` None) the task's stream time moved to ``at_ms`` without a record
    (:meth:`PunctuationService.advance_stream_time`, the test driver's)."""

    task: Task
    punctuation: Punctuation | None
    at_ms: int


class ActorPunctuations:
    """One actor's punctuations: each task's next due stream times, and the ticks due.

    What the actor reads per event is :attr:`due_at`, the next due stream time of the task
    whose records it walks (set by :meth:`enter` once per chunk)."""

    def __init__(
        self,
        runner: AgentRunner,
        punctuations: Sequence[Punctuation],
        *,
        acks: Acknowledgements,
        counters: WorkerCounters,
        join_stats: dict[str, JoinStats],
        on_crash: Callable[[BaseException], None],
        on_store_corrupted: Callable[[Task, StoreCorrupted], None],
    ) -> None:
        self.runner = runner
        #: the stream-time ones (wall-clock ones come as ticks, from the service)
        self.stream = [p for p in punctuations if p.type == "stream_time"]
        #: the stream time at which the walked task's next stream-time punctuation is due
        self.due_at = NEVER
        #: punctuations due on this actor, run between two events in order
        self.ticks: list[Tick] = []
        self._acks = acks
        self._counters = counters
        self._join_stats = join_stats
        self._on_crash = on_crash
        self._on_store_corrupted = on_store_corrupted
        #: per task: the next due stream time of each of :attr:`stream`
        self._dues: dict[Task, list[int]] = {}
        #: the task whose chunk the actor walks (the one :attr:`due_at` is for)
        self._walking: Task | None = None
        #: the due stream time a batch being taken ends before (see :meth:`batch_end`)
        self._batch_due = NEVER
        #: sends of punctuations without a record, awaited in the background
        self._settling: set[asyncio.Future[None]] = set()

    # -- what the actor calls

    def enter(self, task: Task, records: list[RawRecord]) -> None:
        """The actor starts walking ``records`` of ``task`` (once per chunk)."""
        if records is TICK or not self.stream:
            return
        self._walking = task
        self.due_at = min(self._dues_of(task))

    def due_for(self, task: Task) -> int:
        """The stream time at which ``task``'s next stream-time punctuation is due."""
        return min(self._dues_of(task)) if self.stream else NEVER

    def batch_end(self, chunk: Sequence[RawRecord], pos: int, end: int, starts: bool) -> int:
        """Where a batch taking ``chunk[pos:end]`` of the walked task must end: before the
        first record that reaches a due stream time, unless that record starts the batch
        (``starts``: its punctuation runs before the batch is handed out); then before the
        first that reaches the due time after it."""
        if not starts:
            due = self._batch_due  # (the batch goes on with another chunk of its task)
        else:
            due = self._batch_due = self.due_at
            if pos < end and chunk[pos].timestamp >= due:
                due = self._batch_due = self._due_after(self._walking, chunk[pos].timestamp)
                pos += 1
        if due == NEVER:
            return end
        for index in range(pos, end):
            if chunk[index].timestamp >= due:
                return index
        return end

    async def stream_time_passed(self, inflight: InFlight, stream_time_ms: int) -> None:
        """``inflight``'s record (the first of a batch) moved its task's stream time to
        ``stream_time_ms``: run the punctuations due, under its event context (the actor
        has made it current), before it is handed out."""
        task = inflight.task
        dues = self._dues_of(task)
        for index, punctuation in enumerate(self.stream):
            if stream_time_ms >= dues[index]:
                boundary, dues[index] = next_stream_due(stream_time_ms, punctuation.interval_ms)
                try:
                    await self._call(punctuation, inflight, boundary, stream_time_ms)
                except AgentFailed:
                    # the worker stops: the event is abandoned, not processed (as when the
                    # error policy of a failed event says stop)
                    self.runner.current = None
                    raise
        if task is self._walking:
            self.due_at = min(dues)

    async def run_tick(self) -> None:
        """Run the first tick due, between two events, under an event context of its own
        (the actor checked that no transaction's snapshot holds it)."""
        tick = self.ticks.pop(0)
        task = tick.task
        if task.state is not TaskState.RUNNING:
            return  # revocation began (or the task was lost): its punctuations stop
        runner = self.runner
        topic = next(t.name for t in runner.agent.topics if t.name in task.group.sources)
        record = RawRecord(topic, task.partition, -1, tick.at_ms, None, None)
        inflight = InFlight(record, task, self._join_stats, runner)
        runner.current = inflight
        current_event.set(inflight)
        try:
            if tick.punctuation is None:
                await self.stream_time_passed(inflight, tick.at_ms)
            else:
                await self._call(tick.punctuation, inflight, tick.at_ms, None)
        finally:
            runner.current = None
            current_event.set(None)
        self._settle(inflight)

    # -- scheduling (the service's)

    def queue_tick(self, tick: Tick) -> None:
        """Have the actor run ``tick`` between two events (woken if it waits for records)."""
        self.ticks.append(tick)
        self.runner.queue.put_nowait((tick.task, TICK), 0)

    def has_tick(self, punctuation: Punctuation, task: Task) -> bool:
        return any(t.punctuation is punctuation and t.task is task for t in self.ticks)

    def busy(self) -> bool:
        """Ticks not run yet, or sends of punctuations not acknowledged yet."""
        return bool(self.ticks) or bool(self._settling)

    # -- internals

    def _dues_of(self, task: Task) -> list[int]:
        dues = self._dues.get(task)
        if dues is None:
            # (a new task: forget those that stopped, so closed tasks are not kept)
            for gone in [t for t in self._dues if not t.accepts_acks]:
                del self._dues[gone]
            dues = self._dues[task] = [NOT_STARTED] * len(self.stream)
        return dues

    def _due_after(self, task: Task | None, stream_time_ms: int) -> int:
        """The next due stream time once the task's stream time is ``stream_time_ms``."""
        dues = self._dues_of(task) if task is not None else [NOT_STARTED] * len(self.stream)
        return min(
            due if stream_time_ms < due else next_stream_due(stream_time_ms, p.interval_ms)[1]
            for p, due in zip(self.stream, dues, strict=True)
        )

    async def _call(
        self,
        punctuation: Punctuation,
        inflight: InFlight,
        timestamp_ms: int,
        stream_time_ms: int | None,
    ) -> None:
        """Call the punctuation's function; an error gets the agent's ``on_error``."""
        task = inflight.task
        context = PunctuationContext(
            punctuation.name,
            punctuation.agent,
            task.partition,
            punctuation.type,
            timestamp_ms,
            stream_time_ms,
        )
        try:
            result = punctuation.fun(context)
            if inspect.isawaitable(result):
                await result
        except AgentFailed:
            raise
        except Exception as exc:
            corrupted = corrupted_store_behind(exc)
            if corrupted is not None:
                # not the punctuation's fault: the store is rebuilt (the task is given up)
                self._on_store_corrupted(task, corrupted)
                return
            self._failed(punctuation, task, timestamp_ms, exc)

    def _failed(
        self, punctuation: Punctuation | None, task: Task, at_ms: int, exc: BaseException
    ) -> None:
        """The agent's ``on_error`` for a punctuation that raised (or had a send refused):
        ``stop`` raises :class:`AgentFailed`; otherwise it is logged and counted."""
        self._counters.error("punctuation")
        agent: Agent = self.runner.agent
        name = "a punctuation" if punctuation is None else f"punctuation {punctuation.name!r}"
        where = f"{name} of agent {self.runner.name} on {task.name} at {at_ms}"
        if agent.on_error == "stop":
            log.error("%s failed: %r; stopping", where, exc)
            raise AgentFailed(f"{where} failed: {exc!r}") from exc
        log.warning("%s failed: %r; skipped (on_error=%s)", where, exc, agent.on_error)
        log.debug("traceback of the failed punctuation", exc_info=exc)

    def _settle(self, inflight: InFlight) -> None:
        """A punctuation without a record sent ``inflight.sends``: under at-least-once the
        task's revocation waits for their acknowledgement, and a failed one stops the
        worker (exactly-once: the transaction's commit checks every send)."""
        sends = inflight.sends
        if not sends or self._acks.transactional:
            return
        inflight.task.awaiting_sends += 1
        settling = asyncio.ensure_future(self._acknowledged(inflight.task, list(sends)))
        self._settling.add(settling)
        settling.add_done_callback(self._settling.discard)

    async def _acknowledged(self, task: Task, sends: Iterable[Delivery]) -> None:
        try:
            for sent in sends:
                try:
                    await sent
                except RecordRejected as exc:
                    try:
                        self._failed(None, task, -1, exc)
                    except AgentFailed as failed:
                        self._on_crash(failed)
                except (Exception, asyncio.CancelledError) as exc:
                    if isinstance(exc, asyncio.CancelledError) and not sent.done():
                        raise  # this waiter was cancelled (the worker stops), not the send
                    self._counters.error("send")
                    self._on_crash(
                        AgentFailed(
                            f"a record sent by a punctuation of agent {self.runner.name} on "
                            f"{task.name} was not acknowledged: {exc!r}; stopping"
                        )
                    )
                    return
        finally:
            task.awaiting_sends -= 1


class PunctuationService:
    """An app's punctuations on one worker: attaches them to their agents' actors, and
    queues each wall-clock punctuation to its actor when it is due for a running task.

    The worker calls :meth:`start` (a loop on the real clock); the test driver calls
    :meth:`fire_due` with a clock it moves by hand."""

    def __init__(
        self,
        punctuations: Sequence[Punctuation],
        runtime: AgentRuntime,
        live_tasks: Callable[[], Iterable[Task]],
        *,
        on_crash: Callable[[BaseException], None],
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._running_tasks = live_tasks
        self._clock_ms = clock_ms
        self._on_crash = on_crash
        #: agent name -> its actors' punctuations, by actor index
        self._actors: dict[str, list[ActorPunctuations]] = {}
        self._agents: dict[str, Agent] = {}
        for runner in runtime.runners:
            own = [p for p in punctuations if p.agent == runner.agent.name]
            if not own:
                continue
            actor = ActorPunctuations(
                runner,
                own,
                acks=runtime.acks,
                counters=runtime.counters,
                join_stats=runtime.join_stats,
                on_crash=on_crash,
                on_store_corrupted=runtime.store_corrupted,
            )
            runner.punctuations = actor
            self._actors.setdefault(runner.agent.name, []).append(actor)
            self._agents[runner.agent.name] = runner.agent
        self._wall = [p for p in punctuations if p.type == "wall_clock" and p.agent in self._actors]
        #: (punctuation name, task) -> when it is due next on the wall clock
        self._due: dict[tuple[str, Task], int] = {}
        self._loop: asyncio.Task[None] | None = None

    @property
    def actors(self) -> list[ActorPunctuations]:
        return [a for actors in self._actors.values() for a in actors]

    def busy(self) -> bool:
        """Some punctuation is due and not run yet, or its sends not acknowledged yet."""
        return any(actor.busy() for actor in self.actors)

    # -- wall clock

    def fire_due(self, now_ms: int) -> int:
        """Queue every wall-clock punctuation due at ``now_ms`` for the running tasks of
        its agent (a task seen running for the first time is due an interval later);
        returns how many were queued. One not run yet is not queued again."""
        if not self._wall:
            return 0
        running = [t for t in self._running_tasks() if t.state is TaskState.RUNNING]
        queued = 0
        seen: set[tuple[str, Task]] = set()
        for punctuation in self._wall:
            agent = self._agents[punctuation.agent]
            topics = {t.name for t in agent.topics}
            for task in running:
                if topics.isdisjoint(task.group.sources):
                    continue
                key = (punctuation.name, task)
                seen.add(key)
                due = self._due.get(key)
                if due is None:
                    self._due[key] = now_ms + punctuation.interval_ms
                    continue
                if now_ms < due:
                    continue
                actor = self._actors[agent.name][agent.actor_for(task.partition)]
                self._due[key] = next_wall_clock_due(due, now_ms, punctuation.interval_ms)
                if not actor.has_tick(punctuation, task):
                    actor.queue_tick(Tick(task, punctuation, now_ms))
                    queued += 1
        for gone in self._due.keys() - seen:
            del self._due[gone]  # the task stopped running here: its schedule ends
        return queued

    def next_due_in_ms(self, now_ms: int) -> int | None:
        """How long until the earliest wall-clock punctuation is due (None: none known)."""
        return min((due - now_ms for due in self._due.values()), default=None)

    def advance_stream_time(self, agent: str, to_ms: int, partitions: Iterable[int] | None) -> int:
        """Move the stream time of ``agent``'s running tasks (of ``partitions``, default
        all) to ``to_ms`` as a record of that timestamp would, without one (the test
        driver's); returns how many tasks were ticked."""
        actors = self._actors.get(agent)
        if actors is None:
            return 0
        topics = {t.name for t in self._agents[agent].topics}
        wanted = None if partitions is None else set(partitions)
        ticked = 0
        for task in self._running_tasks():
            if task.state is not TaskState.RUNNING or topics.isdisjoint(task.group.sources):
                continue
            if wanted is not None and task.partition not in wanted:
                continue
            actors[self._agents[agent].actor_for(task.partition)].queue_tick(
                Tick(task, None, to_ms)
            )
            ticked += 1
        return ticked

    # -- the worker's loop

    def start(self) -> None:
        """Fire wall-clock punctuations on the real clock (nothing to do without any)."""
        if self._wall and self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="streamjoin-punctuations")

    async def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    async def _run(self) -> None:
        """Check what is due at least every second (tasks start running at any time), and
        right when the earliest one is due."""
        try:
            while True:
                self.fire_due(self._clock_ms())
                wait = self.next_due_in_ms(self._clock_ms())
                await asyncio.sleep(1.0 if wait is None else min(max(wait, 1) / 1000, 1.0))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # (a bug: the worker must not go on without its schedule)
            self._on_crash(exc)
