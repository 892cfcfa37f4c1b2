"""In-memory channels: ``app.channel()`` and the one agent that reads each (Faust's channels).

A channel is a bounded asyncio queue inside one worker process. ``await
channel.send(value=...)`` puts an event in it (waiting while it holds ``maxsize``
events); the agent declared on it (``@app.agent(channel)``) iterates its events with a
topic agent's stream surface (``async for``, ``values()`` and the operators, ``take``).

**At-most-once**, by design: nothing goes through Kafka, so what is queued when the worker
stops or crashes is lost, and the sending agent's event is committed without waiting for
the channel's agent. Records that must survive go through a topic (an agent declared with
no topic reads a durable one).

A channel agent belongs to no partition: the worker runs it once, as an app task (started
once the worker joined its group, cancelled first when it stops). Its events have no task,
so it cannot write a partitioned table (reads work as outside agents), and its sends are
an app task's (not tied to any event's commit).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import traceback
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from streamjoin.agents import AgentFunction, AgentGenerator
from streamjoin.channels import Sinks, drain_into
from streamjoin.context import Headers, RuntimeLink, Sender, current_channel_agent, current_event
from streamjoin.errors import AgentFailed, ConfigurationError, LifecycleError
from streamjoin.events import Event
from streamjoin.stream import EventBatch, Stream
from streamjoin.topics import Topic

__all__ = ["ChannelAgent", "MemoryChannel"]

log = logging.getLogger("streamjoin.channels")

#: what a channel agent does with an event its function raised on (no ``dead_letter``:
#: a channel's events are values, not records with bytes to park)
OnChannelError = Literal["stop", "skip"]


class MemoryChannel:
    """``app.channel(name, maxsize=1000)``: an in-memory queue of events read by one agent.

    At-most-once: what is queued when the worker stops or crashes is lost (counted in
    ``dropped`` at a stop); use a topic for records that must survive. ``send`` waits
    while ``maxsize`` events are queued (backpressure on the sender).
    """

    def __init__(self, name: str, maxsize: int, link: RuntimeLink) -> None:
        if not name or not isinstance(name, str):
            raise ConfigurationError(f"app.channel(): name must be a non-empty str, got {name!r}")
        if type(maxsize) is not int or maxsize < 1:
            raise ConfigurationError(
                f"channel {name!r}: maxsize must be an int >= 1, got {maxsize!r}"
            )
        self.name = name
        self.maxsize = maxsize
        #: the name of the agent reading it (``@app.agent(channel)``), once declared
        self.reader: str | None = None
        #: events put in the queue, handed to its agent and done with, skipped after an
        #: error, and dropped (queued at a stop, or sent after it)
        self.sent = self.processed = self.skipped = self.dropped = 0
        self._link = link
        #: the worker run the queue belongs to (its sender: a new run has a new one, and
        #: gets a fresh queue, bound to its own event loop, with nothing of the last run)
        self._run: Sender | None = None
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize)
        #: the run's channel agent was stopped: what is sent for the rest of it is dropped
        self._closed = False
        self._source: _ChannelSource | None = None

    def __repr__(self) -> str:
        return f"<MemoryChannel {self.name!r} maxsize={self.maxsize}>"

    def _queue_of(self, run: Sender | None) -> asyncio.Queue[Event]:
        if run is not self._run:
            self._run, self._closed = run, False
            self._queue = asyncio.Queue(self.maxsize)
        return self._queue

    async def send(
        self,
        *,
        key: Any = None,
        value: Any = None,
        headers: Headers = (),
        timestamp_ms: int | None = None,
    ) -> None:
        """Put an event in the channel; waits while it holds ``maxsize`` events.

        Its timestamp is ``timestamp_ms``, else the timestamp of the event the calling agent
        is processing, else now. Returns once the event is queued, not processed.
        """
        run = self._link.sender
        if run is None:
            raise LifecycleError(
                f"cannot send to channel {self.name!r}: the app is not running "
                "(use `async with app:` or `await app.start()`)"
            )
        if self.reader is None:
            raise ConfigurationError(
                f"channel {self.name!r} has no agent: declare one with @app.agent(channel), "
                "or nothing would ever take its events"
            )
        queue = self._queue_of(run)
        if timestamp_ms is None:
            processing = current_event.get()
            if processing is not None:
                timestamp_ms = processing.record.timestamp
            else:
                timestamp_ms = time.time_ns() // 1_000_000
        if not self._closed:
            await queue.put(Event(key, value, self.name, 0, -1, timestamp_ms, tuple(headers)))
        if self._closed and self._run is run:  # (also: the stop came while it waited for room)
            self.dropped += 1
            log.debug("channel %s is stopped: an event sent to it was dropped", self.name)
        else:
            self.sent += 1

    def busy(self) -> bool:
        """Whether events wait in the queue or its agent is processing one (the test
        driver's ``drain`` waits until neither)."""
        if self._closed:
            return False
        source = self._source
        return self._queue.qsize() > 0 or (source is not None and source.handling)

    def open(self) -> _ChannelSource:
        """The stream source of a worker run's channel agent: what it iterates."""
        self._source = _ChannelSource(self, self._queue_of(self._link.sender))
        return self._source

    def close(self) -> None:
        """The worker stops: drop what is queued (logged) and what is sent for the rest of
        the run; senders waiting on a full queue are let go (their events dropped)."""
        self._closed = True
        self._source = None
        dropped = 0
        while not self._queue.empty():
            self._queue.get_nowait()  # (also lets a sender waiting for room go on)
            dropped += 1
        self.dropped += dropped
        if dropped:
            log.warning(
                "channel %s: %d queued events dropped at stop (in-memory channels are "
                "at-most-once)",
                self.name,
                dropped,
            )


class _ChannelSource:
    """What a channel agent's :class:`Stream` reads: hands out the channel's events one at a
    time or in batches, numbering them (the event's ``offset``) as it does."""

    def __init__(self, channel: MemoryChannel, queue: asyncio.Queue[Event]) -> None:
        self._channel = channel
        self._queue = queue
        #: events handed out again after an error (the rest of a batch, per event)
        self._again: deque[Event] = deque()
        self._handed_out = 0
        #: the event being processed (a batch's: the one being iterated); None between
        self.record: Event | None = None
        self.batch: list[Event] | None = None
        self.per_event_errors = False

    @property
    def handling(self) -> bool:
        return self.record is not None or bool(self._again)

    def _done(self) -> None:
        """The agent asked for the next event (or batch): the one handed out is processed."""
        if self.batch is not None:
            self._channel.processed += len(self.batch)
        elif self.record is not None:
            self._channel.processed += 1
        self.record, self.batch = None, None

    def _numbered(self, event: Event) -> Event:
        if event.offset < 0:
            event.offset = self._handed_out
            self._handed_out += 1
        return event

    async def _get(self) -> Event:
        if self._again:
            return self._again.popleft()
        return self._numbered(await self._queue.get())

    def _get_now(self) -> Event | None:
        if self._again:
            return self._again.popleft()
        if self._queue.empty():
            return None
        return self._numbered(self._queue.get_nowait())

    async def next_event(self) -> Event:
        self._done()
        self.record = event = await self._get()
        return event

    async def events(self) -> AsyncIterator[Event]:
        while True:
            yield await self.next_event()

    async def next_batch(
        self, max_events: int, within: float, per_event_errors: bool
    ) -> EventBatch:
        self._done()
        self.record = first = await self._get()  # (busy from here: drain waits for it)
        events = [first]
        while len(events) < max_events and (event := self._get_now()) is not None:
            events.append(event)
        if within > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within
            while len(events) < max_events and (left := deadline - loop.time()) > 0:
                try:  # (asyncio.timeout, not wait_for: that can swallow the stop's cancel)
                    async with asyncio.timeout(left):
                        events.append(await self._get())
                except TimeoutError:
                    break
        self.batch, self.record, self.per_event_errors = events, events[0], per_event_errors
        return EventBatch(events, events, self)

    def failed(self) -> list[Event]:
        """After an error: the events it applies to (the batch, or with per-event errors
        the batch's current event alone, its later events handed out again); then none is
        current."""
        batch, record = self.batch, self.record
        self.record, self.batch = None, None
        if record is None:
            return []
        if batch is None:
            return [record]
        if not self.per_event_errors:
            return batch
        at = batch.index(record)
        self._channel.processed += at
        self._again.extendleft(reversed(batch[at + 1 :]))
        return [record]


@dataclass(eq=False)
class ChannelAgent:
    """``@app.agent(channel)``: ``fun`` iterates the events of an in-memory channel.

    It runs once per worker as an app task; ``on_error`` ``"stop"`` stops the worker with
    :class:`~streamjoin.errors.AgentFailed`, ``"skip"`` logs the event and calls ``fun``
    again on the same stream. ``send`` is the channel's.
    """

    name: str
    fun: AgentFunction | AgentGenerator
    channel: MemoryChannel
    on_error: OnChannelError = "stop"
    sinks: Sinks | None = None
    _source: _ChannelSource | None = field(default=None, init=False, repr=False)

    @classmethod
    def declare(
        cls,
        name: str,
        fun: AgentFunction | AgentGenerator,
        channel: MemoryChannel,
        *,
        on_error: str,
        concurrency: int,
        dead_letter: Topic | str | None,
        sink: Sequence[Any],
    ) -> ChannelAgent:
        """Check a channel agent's declaration; each refusal says what to do instead."""
        where = f"agent {name!r} (on channel {channel.name!r})"
        if channel.reader is not None:
            raise ConfigurationError(
                f"{where}: the channel is already read by agent {channel.reader!r}; a channel "
                "feeds one agent (declare a channel per agent, or send to a topic)"
            )
        if on_error == "dead_letter" or dead_letter is not None:
            raise ConfigurationError(
                f"{where}: on_error='dead_letter' is refused for a channel: its events are "
                "values, not records with bytes to park; use 'skip' (logged) or 'stop', or "
                "read a topic"
            )
        if on_error not in ("stop", "skip"):
            raise ConfigurationError(
                f"{where}: on_error must be 'stop' or 'skip', got {on_error!r}"
            )
        if concurrency != 1:
            raise ConfigurationError(
                f"{where}: concurrency must be 1 (got {concurrency!r}): one agent takes a "
                "channel's events in order; for parallel work read a partitioned topic"
            )
        sinks = Sinks(name, sink) if sink else None
        if inspect.isasyncgenfunction(fun) != bool(sinks):
            raise ConfigurationError(
                f"{where}: an agent with sinks must be an async generator (`yield value` "
                "sends it to the sinks), and only one with sinks may yield"
            )
        declared = cls(name, fun, channel, cast(OnChannelError, on_error), sinks)
        channel.reader = name
        return declared

    @property
    def topics(self) -> tuple[Topic, ...]:
        """None: it reads an in-memory channel (a sink checks this to send to it)."""
        return ()

    @property
    def send(self) -> Callable[..., Awaitable[None]]:
        """``await agent.send(value=...)``: its channel's :meth:`MemoryChannel.send` (Faust's
        ``agent.send`` on a channel agent)."""
        return self.channel.send

    async def __call__(self, stream: Stream) -> None:
        if self.sinks is None:
            await self.fun(stream)  # type: ignore[misc]
        else:
            await drain_into(self.fun(stream), self.sinks, self._event_key)

    def _event_key(self) -> Any:
        record = None if self._source is None else self._source.record
        return None if record is None else record.key

    async def run(self) -> None:
        """The app task running the agent on this worker: until cancelled by the stop
        (which drops what is still queued), or an error under ``stop``."""
        source = self._source = self.channel.open()
        marked = current_channel_agent.set(self.name)
        try:
            while True:
                try:
                    await self(Stream(source))
                except Exception as exc:
                    self._failed(exc, source.failed())
                    continue  # skip: call the function again on the same stream
                raise AgentFailed(
                    f"channel agent {self.name} returned; an agent must keep iterating over "
                    "its stream"
                )
        finally:
            current_channel_agent.reset(marked)
            self._source = None
            self.channel.close()

    def _failed(self, exc: Exception, events: list[Event]) -> None:
        """Apply ``on_error`` to ``events``: raise :class:`AgentFailed` (``stop``, or an
        error outside any event) or log them skipped."""
        said = _say(exc)
        if not events:
            raise AgentFailed(
                f"channel agent {self.name} raised outside of event processing: {said}"
            ) from exc
        where = events[0].position
        if len(events) > 1:
            where = f"the batch of {len(events)} events {where} to {events[-1].position}"
        if self.on_error == "stop":
            log.error("channel agent %s failed on %s: %s; stopping", self.name, where, said)
            log.debug("traceback of channel agent %s", self.name, exc_info=exc)
            raise AgentFailed(f"channel agent {self.name} failed on {where}: {said}") from exc
        self.channel.skipped += len(events)
        log.warning("channel agent %s failed on %s: %s; skipped", self.name, where, said)
        log.debug("traceback of channel agent %s", self.name, exc_info=exc)


def _say(exc: BaseException) -> str:
    """``Type: message (file:line)``, where the agent's code raised."""
    said = f"{type(exc).__name__}: {exc}"
    for frame in traceback.extract_tb(exc.__traceback__)[-1:]:
        said += f" ({frame.filename}:{frame.lineno})"
    return said
