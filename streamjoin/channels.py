"""Where an agent's outputs go: its sinks (``@app.agent(topic, sink=[...])``).

An agent with sinks is an async generator: each value it yields goes to every sink in
order, while the event that produced it is still the one being processed. So a sink's sends
belong to that event (it is committed once they are acknowledged, at-least-once; they
commit in its transaction, exactly-once), and an exception in a sink gets the agent's
``on_error`` for that event.

A sink is a :class:`~streamjoin.topics.Topic` (the value is sent with the key of the event
that produced it), an agent (sent to its topic: ``agent.send``), an in-memory channel
(``app.channel()``: queued, at-most-once), or a function called with the value (sync or
async). Yield :class:`Keyed` to choose the key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from streamjoin.context import Delivery, current_event
from streamjoin.errors import ConfigurationError
from streamjoin.stream_ops import is_async
from streamjoin.topics import Topic


class Keyed(NamedTuple):
    """What an agent with sinks yields to set the key its topic and agent sinks send with
    (a plain value is sent with the key of the event that produced it)."""

    key: Any
    value: Any


class Channel(Protocol):
    """Something a value can be sent to: an agent (``agent.send``), or an in-memory
    channel (``app.channel()``)."""

    async def send(self, *, key: Any = None, value: Any = None) -> Delivery | None: ...


#: a sink as declared: a topic, an agent, or a function of the value
Sink = Topic | Channel | Callable[[Any], Any]


class Sinks:
    """An agent's sinks, checked and sorted once at declaration: ``deliver`` runs per
    yielded value."""

    __slots__ = ("_steps",)

    def __init__(self, agent: str, sinks: Sequence[Sink]) -> None:
        steps: list[tuple[int, Any]] = []
        for sink in sinks:
            if isinstance(sink, Topic) or _is_channel(sink):
                steps.append((_SEND, sink))
            elif callable(sink):
                steps.append((_AWAIT if is_async(sink) else _CALL, sink))
            else:
                raise ConfigurationError(
                    f"agent {agent!r}: a sink must be a topic, an agent or a function, got "
                    f"{type(sink).__qualname__} {sink!r}"
                )
        self._steps = tuple(steps)

    def __bool__(self) -> bool:
        return bool(self._steps)

    async def deliver(self, out: Any, event_key: Callable[[], Any]) -> None:
        """Send or hand ``out`` (a value, or :class:`Keyed`) to every sink, in order."""
        if type(out) is Keyed:
            key, value = out
        else:
            key, value = _UNSET, out
        for kind, sink in self._steps:
            if kind == _SEND:
                if key is _UNSET:
                    key = event_key()
                await sink.send(key=key, value=value)
            elif kind == _AWAIT:
                await sink(value)
            else:
                sink(value)


_SEND, _CALL, _AWAIT = 0, 1, 2
_UNSET: Any = object()


def _is_channel(sink: object) -> bool:
    # an Agent or a channel's agent (``topics``), or an in-memory channel (``maxsize``):
    # they import this module, so they are told by what they have rather than their class
    has_send = callable(getattr(sink, "send", None))
    return has_send and (hasattr(sink, "topics") or hasattr(sink, "maxsize"))


def event_key(decode_key: Callable[[str], Callable[[bytes], Any]]) -> Callable[[], Any]:
    """A function giving the key of the event being processed, decoded with the codec of
    the topic it was read from (``decode_key(topic)``): topic sinks send with it."""

    def key() -> Any:
        event = current_event.get()
        if event is None:
            return None
        record = event.record
        raw = record.key
        return None if raw is None else decode_key(record.topic)(raw)

    return key


async def drain_into(outputs: Any, sinks: Sinks, key: Callable[[], Any]) -> None:
    """Run an agent with sinks: what its function yields goes to ``sinks``."""
    deliver = sinks.deliver
    async for out in outputs:
        await deliver(out, key)
