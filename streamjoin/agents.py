"""Agent declarations: an ``async def f(stream)`` bound to a source topic and an error policy."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from streamjoin.channels import Sinks, drain_into, event_key
from streamjoin.codecs import RawCodec
from streamjoin.context import Delivery
from streamjoin.decoding import Loads, RecordDecoder
from streamjoin.errors import ConfigurationError
from streamjoin.quick_codecs import loader
from streamjoin.stream import Stream
from streamjoin.topics import Topic

#: What happens to an event whose processing raised, or a record that cannot be decoded:
#: ``stop`` logs it and stops the worker without committing past it (the default),
#: ``skip`` logs it and goes on, ``dead_letter`` sends the raw record to a dead-letter
#: topic (with the error in its headers) and goes on.
OnError = Literal["stop", "skip", "dead_letter"]
ON_ERROR_CHOICES: tuple[OnError, ...] = ("stop", "skip", "dead_letter")

AgentFunction = Callable[[Stream], Awaitable[None]]
#: an agent with sinks: what it yields goes to them (see streamjoin.channels)
AgentGenerator = Callable[[Stream], AsyncIterator[Any]]


@dataclass(eq=False)
class Agent:
    """A stream processor: ``fun`` iterates over the events of ``topic`` (and ``more_topics``).

    ``concurrency`` actors each own a disjoint set of partitions
    (``partition % concurrency``), so events of one partition stay in order. An
    agent over several co-partitioned topics sees partition p of all of them in
    one stream, in timestamp order (see ``runtime.tasks.alignment``): that is how joins
    see both sides.
    """

    name: str
    fun: AgentFunction | AgentGenerator
    topic: Topic
    concurrency: int = 1
    on_error: OnError = "stop"
    dead_letter: Topic | None = None
    more_topics: tuple[Topic, ...] = ()
    #: topics whose records go before the others' of the same timestamp (a table's source
    #: before the streams it enriches: each stream record sees the row of its timestamp)
    ties_first: frozenset[str] = frozenset()
    #: where what the function yields goes (``@app.agent(..., sink=[...])``)
    sinks: Sinks | None = None
    #: hand the function each record as read (a :class:`RawRecord` has an Event's fields,
    #: key and value as bytes), without a decode and an Event per record: for the
    #: framework's internal agents over raw-bytes topics (see :meth:`take_raw_records`)
    raw_records: bool = field(default=False, init=False)
    #: turns a fetched record into the event with the key and value decoders of each topic
    #: it reads (made once, at declaration; compiled: see streamjoin.decoding)
    decoder: RecordDecoder = field(init=False, repr=False)

    @property
    def topics(self) -> tuple[Topic, ...]:
        return (self.topic, *self.more_topics)

    def __post_init__(self) -> None:
        loads: dict[str, Loads] = {}
        for topic in self.topics:
            loads.setdefault(topic.name, (loader(topic.key_codec), loader(topic.value_codec)))
        self.decoder = RecordDecoder(loads, self.topic.name)
        if self.concurrency < 1:
            raise ConfigurationError(f"agent {self.name!r}: concurrency must be >= 1")
        if self.on_error not in ON_ERROR_CHOICES:
            raise ConfigurationError(
                f"agent {self.name!r}: on_error must be one of {ON_ERROR_CHOICES}, "
                f"got {self.on_error!r}"
            )
        if self.on_error == "dead_letter" and self.dead_letter is None:
            raise ConfigurationError(
                f"agent {self.name!r}: on_error='dead_letter' needs a dead-letter topic"
            )
        if inspect.isasyncgenfunction(self.fun) != bool(self.sinks):
            raise ConfigurationError(
                f"agent {self.name!r}: an agent with sinks must be an async generator "
                "(`yield value` sends the value to the sinks), and only one with sinks may "
                "yield: pass sink=[...] or iterate the stream without yielding"
            )

    @property
    def send(self) -> Callable[..., Awaitable[Delivery]]:
        """``await agent.send(key=..., value=...)``: Faust's ``agent.send``, which is the
        agent's topic's :meth:`~streamjoin.topics.Topic.send` (from another agent the record
        belongs to the event being processed)."""
        return self.topic.send

    def take_raw_records(self) -> None:
        """Hand the function undecoded records (see ``raw_records``); only for topics whose
        key and value codecs are both raw, whose decode would return the same bytes."""
        for topic in self.topics:
            codecs = (topic.key_codec, topic.value_codec)
            if not all(isinstance(codec, RawCodec) for codec in codecs):
                raise ConfigurationError(
                    f"agent {self.name!r}: records of {topic.name!r} are decoded by "
                    f"{codecs[0]!r}/{codecs[1]!r}; only raw-bytes topics can be read undecoded"
                )
        self.raw_records = True

    def actor_for(self, partition: int) -> int:
        return partition % self.concurrency

    async def __call__(self, stream: Stream) -> None:
        if self.sinks is None:
            await self.fun(stream)  # type: ignore[misc]
        else:
            await drain_into(self.fun(stream), self.sinks, event_key(self._key_loads))

    def _key_loads(self, topic: str) -> Callable[[bytes], Any]:
        return self.decoder.decoders(topic)[0]
