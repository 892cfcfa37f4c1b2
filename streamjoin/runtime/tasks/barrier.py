"""Holding the agent actors between two events, so a commit or a revocation sees every
event either wholly before it or wholly after it.

* A transaction's snapshot: :meth:`TransactionBarrier.settle_shared` first (agents
  reading one topic catch up with each other, nothing new is handed out), then
  :meth:`~TransactionBarrier.quiesce` (every actor waits between two events); the
  snapshot is taken, then :meth:`~TransactionBarrier.resume` and
  :meth:`~TransactionBarrier.open_dispatch`.
* A revocation: :meth:`~TransactionBarrier.wait_idle` (no actor inside an event of the
  revoked tasks, and their sends acknowledged).

Actors check the barrier before every event (see
:class:`~streamjoin.runtime.tasks.actors.Hold`); the dispatch of fetched records checks
its gate before handing records over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from streamjoin.runtime.tasks.actors import AgentRunner
from streamjoin.runtime.tasks.task import Task


class TransactionBarrier:
    """Where the actors stand: inside an event or between two, held or free to go on."""

    def __init__(self) -> None:
        #: a snapshot holds the actors (a plain flag: actors check it before every event)
        self.holding = False
        #: cleared while a commit takes its snapshot: no actor starts a new event
        self.opened = asyncio.Event()
        self.opened.set()
        #: settle_shared is waiting: batches being filled are handed out as they are
        self.settling = False
        #: cleared while a transaction's snapshot waits for the actors sharing a topic:
        #: nothing new is handed to any actor
        self.dispatch_open = asyncio.Event()
        self.dispatch_open.set()
        #: dispatches past that gate, not finished yet
        self.dispatching = 0
        self._runners: Sequence[AgentRunner] = ()
        self._sharing: Sequence[AgentRunner] = ()

    def watch(self, runners: Sequence[AgentRunner], sharing: Sequence[AgentRunner]) -> None:
        """The actors this barrier holds (built after it: they check it), and those of
        agents that read a topic another agent reads too (see :meth:`settle_shared`)."""
        self._runners = runners
        self._sharing = sharing

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
        self.dispatch_open.clear()
        # a batch being filled (stream.take(within=...)) is handed out as it is
        self.settling = True
        for runner in self._sharing:
            if runner.forming:
                runner.queue.wake()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while self.dispatching or self.sharing_behind():
                if loop.time() >= deadline:
                    return False
                await asyncio.sleep(0.001)
            return True
        finally:
            self.settling = False

    def open_dispatch(self) -> None:
        """Hand records to the actors again (after :meth:`settle_shared`)."""
        self.dispatch_open.set()

    def sharing_behind(self) -> list[str]:
        """Actors of agents sharing a topic that still have records to process (an actor
        whose function ended has none)."""
        return [
            r.name
            for r in self._sharing
            if (r.busy() or r.forming) and r.task is not None and not r.task.done()
        ]

    def busy_with(self, tasks: Iterable[Task]) -> list[str]:
        """Actors processing an event of one of ``tasks`` right now."""
        wanted = set(map(id, tasks))
        return [
            r.name for r in self._runners if r.current is not None and id(r.current.task) in wanted
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
        return [r.name for r in self._runners if r.current is not None]

    async def quiesce(self, timeout: float) -> bool:
        """Hold every actor between two events (the snapshot of a transaction: every event
        is either wholly before it or wholly after it); False if some actor was still inside
        an event after ``timeout`` seconds (the barrier stays closed: call :meth:`resume`)."""
        self.holding = True
        self.opened.clear()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.inside_events():
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.001)
        return True

    def resume(self) -> None:
        """Let the actors take new events again."""
        self.holding = False
        self.opened.set()
