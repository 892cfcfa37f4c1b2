"""Runs agents over records handed in by a transport (Kafka consumer or in-memory driver).

:class:`AgentRuntime` builds the agents' actors and routes fetched records to them; the
rest is one concept a module, all built here:

* :mod:`~streamjoin.runtime.tasks.actors`: an actor's queue and event loop (the per-event
  hot path), handing out events one at a time or in batches;
* :mod:`~streamjoin.runtime.tasks.in_flight`: the event being processed, as tables, joins
  and ``current_record()`` see it;
* :mod:`~streamjoin.runtime.tasks.acknowledgements`: when a processed event counts in its
  task's offset ledger (once its sends were acknowledged);
* :mod:`~streamjoin.runtime.tasks.barrier`: holding the actors between two events for a
  transaction's snapshot or a revocation;
* :mod:`~streamjoin.runtime.tasks.error_policy`: the agents' ``on_error``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

from streamjoin.agents import Agent
from streamjoin.context import Sender, current_record
from streamjoin.errors import StoreCorrupted
from streamjoin.events import RawRecord
from streamjoin.joins.run_state import JoinStats
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.runtime.tasks.acknowledgements import Acknowledgements
from streamjoin.runtime.tasks.actors import AgentRunner
from streamjoin.runtime.tasks.barrier import TransactionBarrier
from streamjoin.runtime.tasks.error_policy import ErrorPolicy
from streamjoin.runtime.tasks.task import Task
from streamjoin.stream import Stream

__all__ = ["AgentRunner", "AgentRuntime", "Stream", "current_record"]

log = logging.getLogger("streamjoin.agents")


class AgentRuntime:
    """All agent actors of an app and the routing of records to them; builds the actors'
    acknowledgements, barrier and error policy (commits and revocations hold the actors
    through :attr:`barrier`)."""

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
        self._on_crash = on_crash
        self._on_store_corrupted = on_store_corrupted
        #: join name -> its counters, kept for the worker's lifetime
        self.join_stats: dict[str, JoinStats] = {}
        self.errors = ErrorPolicy(sender, self.counters, transactional=transactional)
        self.acks = Acknowledgements(
            self.errors, self.counters, on_crash=on_crash, transactional=transactional
        )
        self.barrier = TransactionBarrier()
        self.runners: list[AgentRunner] = []
        self._routes: dict[str, list[list[AgentRunner]]] = {}
        for agent in agents:
            actors = [
                AgentRunner(
                    agent,
                    i,
                    queue_size=queue_size,
                    hold=self.barrier,
                    acks=self.acks,
                    errors=self.errors,
                    counters=self.counters,
                    join_stats=self.join_stats,
                    on_store_corrupted=self.store_corrupted,
                )
                for i in range(agent.concurrency)
            ]
            self.runners.extend(actors)
            for topic in agent.topics:
                self._routes.setdefault(topic.name, []).append(actors)
        #: actors of agents that read a topic another agent reads too (see settle_shared)
        sharing = [
            runner
            for agents_of_topic in self._routes.values()
            if len(agents_of_topic) > 1
            for actors in agents_of_topic
            for runner in actors
        ]
        self.barrier.watch(self.runners, sharing)

    @property
    def transactional(self) -> bool:
        """Exactly-once: an event counts as processed as soon as its function is done with
        it (its sends belong to the open transaction, which commits them all or none)."""
        return self.acks.transactional

    @transactional.setter
    def transactional(self, value: bool) -> None:
        self.acks.transactional = self.errors.transactional = value

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
            runner.end_stream()
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

    def store_corrupted(self, task: Task, exc: StoreCorrupted) -> None:
        """A read in ``task``'s store found it corrupted: the worker rebuilds it (without a
        handler, e.g. in-memory stores, that stops the worker like any fatal error)."""
        if self._on_store_corrupted is None:
            self._on_crash(exc)
        else:
            self._on_store_corrupted(task, exc)

    # -- records in

    async def dispatch_many(self, raws: Sequence[RawRecord], task: Task) -> None:
        """Hand fetched records of one task, in order, to every agent reading their topics:
        registered with the task's offset ledger first (a run of one partition's records
        at a time), then queued as one chunk per actor (may wait while an actor's queue is
        full). Nothing is handed over once the task stopped running (the records are read
        again by its next owner)."""
        barrier = self.barrier
        if not barrier.dispatch_open.is_set():
            await barrier.dispatch_open.wait()  # a transaction's snapshot (see settle_shared)
        if not task.running or not raws:
            return
        barrier.dispatching += 1
        try:
            await self._dispatch(raws, task)
        finally:
            barrier.dispatching -= 1

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

    def ack_finished(self) -> None:
        """Acknowledge every actor's finished events still waiting to be acknowledged
        together (see :meth:`AgentRunner.ack_finished`): before a commit reads the ledgers."""
        for runner in self.runners:
            runner.ack_finished()


def _stopped(task: Task) -> bool:
    """Whether ``task`` stopped running (a function: the state changes across awaits)."""
    return not task.running
