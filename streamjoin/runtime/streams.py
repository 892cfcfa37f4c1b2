"""Runs agents over records handed in by a transport (Kafka consumer or in-memory driver).

Each agent actor has a bounded queue (backpressure on fetching) and a
:class:`Stream` its function iterates. An event counts as processed when the
function asks for the next one; it is acknowledged to the :class:`OffsetTracker`
once the records sent while processing it were acknowledged by the broker.
Rebalances bump an epoch so records buffered for revoked partitions are dropped
(they will be refetched from the committed offset by their next owner).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from streamjoin.agents import Agent
from streamjoin.codecs import DecodeError
from streamjoin.errors import AgentFailed as AgentFailed
from streamjoin.errors import InternalError
from streamjoin.events import Event, RawRecord
from streamjoin.runtime.offsets import OffsetTracker, TopicPartition
from streamjoin.runtime.record_queue import RecordQueue
from streamjoin.topics import Sender, current_stream

log = logging.getLogger("streamjoin.agents")

_STOP = object()


@dataclass
class _InFlight:
    raw: RawRecord
    epoch: int
    sends: list[asyncio.Future[Any]] = field(default_factory=list)


def current_record() -> RawRecord | None:
    """The record whose event the calling agent is processing (None outside agents)."""
    stream = current_stream.get()
    if stream is None:
        return None
    current = stream._runner.current
    return None if current is None else current.raw


class Stream:
    """``async for event in stream`` yields :class:`Event`; ``stream.items()`` (key, value)."""

    def __init__(self, runner: AgentRunner) -> None:
        self._runner = runner

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Event:
        return await self._runner.next_event()

    async def items(self) -> AsyncIterator[tuple[Any, Any]]:
        async for event in self:
            yield event.key, event.value

    def track_send(self, future: asyncio.Future[Any]) -> None:
        """Delay the current event's acknowledgement until ``future`` completes."""
        current = self._runner.current
        if current is not None:
            current.sends.append(future)


class AgentRunner:
    """One actor of one agent: its queue, its stream and the task running the function."""

    def __init__(self, agent: Agent, index: int, runtime: AgentRuntime, queue_size: int) -> None:
        self.agent = agent
        self.index = index
        self.runtime = runtime
        self.queue = RecordQueue(maxsize=queue_size)
        self.stream = Stream(self)
        self.current: _InFlight | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self.task: asyncio.Task[None] | None = None
        self.processed = 0

    @property
    def name(self) -> str:
        return f"{self.agent.name}#{self.index}"

    def clear(self) -> None:
        """Drop buffered records (after a revoke or before stopping)."""
        self.queue.clear()

    async def next_event(self) -> Event:
        self._finish_current()
        queue = self.queue
        while True:
            self.idle.set()
            ready, item = queue.get_nowait()  # no suspension while records are buffered
            if not ready:
                item = await queue.get()
            if item is _STOP:
                raise StopAsyncIteration
            epoch, raw = _unpack(item)
            if epoch != self.runtime.epoch:
                continue
            self.idle.clear()
            try:
                event = self.agent.decode(raw)
            except DecodeError as exc:
                await self.runtime.handle_failure(self, _InFlight(raw, epoch), exc, "decode")
                continue
            self.current = _InFlight(raw, epoch)
            return event

    def _finish_current(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            self.processed += 1
            self.runtime.complete(current)

    async def run(self) -> None:
        current_stream.set(self.stream)
        while True:
            try:
                await self.agent(self.stream)
            except AgentFailed:
                raise
            except Exception as exc:
                current, self.current = self.current, None
                if current is None:
                    raise AgentFailed(
                        f"agent {self.name} raised outside of event processing: {exc!r}"
                    ) from exc
                await self.runtime.handle_failure(self, current, exc, "processing")
                continue  # skip / dead_letter: restart the function on the same stream
            if self.runtime.stopping:
                self._finish_current()
                return
            raise AgentFailed(
                f"agent {self.name} returned; an agent must keep iterating over its stream"
            )


class AgentRuntime:
    """All agent actors of an app, the routing of records to them, and their offsets."""

    def __init__(
        self,
        agents: Iterable[Agent],
        sender: Sender,
        *,
        on_crash: Callable[[BaseException], None],
        queue_size: int = 1000,
    ) -> None:
        self.sender = sender
        self.tracker = OffsetTracker()
        self.epoch = 0
        self.stopping = False
        self._on_crash = on_crash
        self.runners: list[AgentRunner] = []
        self._routes: dict[str, list[list[AgentRunner]]] = {}
        for agent in agents:
            actors = [AgentRunner(agent, i, self, queue_size) for i in range(agent.concurrency)]
            self.runners.extend(actors)
            for topic in agent.topics:
                self._routes.setdefault(topic.name, []).append(actors)

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
            runner.queue.put_nowait(_STOP)
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

    async def dispatch(self, raw: RawRecord, epoch: int) -> None:
        """Hand one fetched record to every agent reading its topic (may wait: backpressure)."""
        await self.dispatch_many((raw,), epoch)

    async def dispatch_many(self, raws: Iterable[RawRecord], epoch: int) -> None:
        """Hand fetched records, in order, to every agent reading their topics: registered
        with the offset tracker first, then queued a batch per actor (may wait while an
        actor's queue is full)."""
        if epoch != self.epoch:
            return
        routes = self._routes
        register = self.tracker.register
        batches: dict[AgentRunner, list[tuple[int, RawRecord]]] = {}
        for raw in raws:
            targets = [actors[raw.partition % len(actors)] for actors in routes.get(raw.topic, ())]
            register((raw.topic, raw.partition), raw.offset, len(targets))
            for runner in targets:
                batch = batches.get(runner)
                if batch is None:
                    batch = batches[runner] = []
                batch.append((epoch, raw))
        for runner, batch in batches.items():
            if epoch != self.epoch:
                return  # a rebalance began while waiting for room: the rest is refetched
            await runner.queue.put_many(batch)

    def begin_revoke(self) -> None:
        """Start of a rebalance: drop everything buffered from the old assignment."""
        self.epoch += 1
        for runner in self.runners:
            runner.clear()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no actor is inside an event; False on timeout."""
        waits = [asyncio.create_task(r.idle.wait()) for r in self.runners if not r.idle.is_set()]
        if not waits:
            return True
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for task in pending:
            task.cancel()
        return not pending

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        self.tracker.forget(tps)

    # -- acknowledgements

    def complete(self, inflight: _InFlight) -> None:
        """Acknowledge an event once its sends are acknowledged."""
        pending = [f for f in inflight.sends if not f.done()]
        failed = next((f for f in inflight.sends if f.done() and _failed(f)), None)
        if failed is not None:
            self._send_failed(inflight, failed)
            return
        if not pending:
            self._ack(inflight)
            return
        remaining = [len(pending)]

        def one_done(future: asyncio.Future[Any]) -> None:
            if _failed(future):
                self._send_failed(inflight, future)
                return
            remaining[0] -= 1
            if remaining[0] == 0:
                self._ack(inflight)

        for future in pending:
            future.add_done_callback(one_done)

    def _ack(self, inflight: _InFlight) -> None:
        if inflight.epoch == self.epoch:
            raw = inflight.raw
            self.tracker.ack((raw.topic, raw.partition), raw.offset)

    def _send_failed(self, inflight: _InFlight, future: asyncio.Future[Any]) -> None:
        raw = inflight.raw
        exc = future.exception() if not future.cancelled() else asyncio.CancelledError()
        self._on_crash(
            AgentFailed(
                f"a record sent while processing {raw.topic}[{raw.partition}]@{raw.offset} "
                f"was not acknowledged: {exc!r}; stopping without committing past it"
            )
        )

    # -- failures

    async def handle_failure(
        self, runner: AgentRunner, inflight: _InFlight, exc: BaseException, kind: str
    ) -> None:
        raw = inflight.raw
        where = f"{raw.topic}[{raw.partition}]@{raw.offset}"
        what = "could not decode" if kind == "decode" else "failed on"
        policy = runner.agent.on_error
        if policy == "stop":
            log.error("agent %s %s %s: %r; stopping", runner.name, what, where, exc, exc_info=exc)
            raise AgentFailed(f"agent {runner.name} {what} {where}: {exc!r}") from exc
        if policy == "skip":
            log.warning("agent %s %s %s: %r; skipped", runner.name, what, where, exc, exc_info=exc)
        else:
            dlq = runner.agent.dead_letter
            if dlq is None:  # rejected when the agent is declared; kept for type narrowing
                raise AgentFailed(f"agent {runner.name} has no dead-letter topic") from exc
            headers = (
                *raw.headers,
                ("streamjoin-error", f"{kind}: {exc!r}"[:2000].encode()),
                ("streamjoin-source", where.encode()),
                ("streamjoin-agent", runner.agent.name.encode()),
            )
            future = await self.sender.send(
                dlq.name,
                raw.key,
                raw.value,
                partition=None,
                headers=headers,
                timestamp_ms=raw.timestamp,
            )
            await future
            log.warning(
                "agent %s %s %s: %r; sent to dead-letter topic %s",
                runner.name,
                what,
                where,
                exc,
                dlq.name,
            )
        self._ack(inflight)


def _failed(future: asyncio.Future[Any]) -> bool:
    return future.cancelled() or future.exception() is not None


def _unpack(item: object) -> tuple[int, RawRecord]:
    """Queue items are ``(epoch, record)`` pairs (or the stop sentinel, handled by the caller)."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], RawRecord):
        return int(item[0]), item[1]
    raise InternalError(f"unexpected item in an agent queue: {item!r}")
