"""Sending an enriching join's results: one pair of functions the stream-table join and
the stream-global-table join both build once per join and call once per event."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from streamjoin.events import Event
from streamjoin.quick_sends import try_send_record
from streamjoin.topics import Topic

__all__ = ["PLAIN_RESULTS", "Emit", "EmitAwaited", "result_senders"]

#: result types a join function returns directly: checked by type before the slower
#: ``inspect.isawaitable`` (an async join function's result is awaited first)
PLAIN_RESULTS = frozenset((dict, list, tuple, str, bytes, int, float, bool, type(None)))

Emit = Callable[[Event, Any], Awaitable[object] | None]
EmitAwaited = Callable[[Event, Awaitable[Any]], Awaitable[None]]


def result_senders(output: Topic | None) -> tuple[Emit, EmitAwaited]:
    """``(emit, emit_awaited)`` for ``output``: ``emit(event, result)`` sends a non-None
    result with the event's key and timestamp at once, or returns what to await when the
    output has no room (None when done: no coroutine for the usual case);
    ``emit_awaited(event, pending)`` does the same for an async join function's result."""

    def emit(event: Event, result: Any) -> Awaitable[object] | None:
        if result is not None and output is not None:
            key, timestamp = event.key, event.timestamp
            if type(timestamp) is int and timestamp >= 0:
                # (try_send's own checks passed: its compiled part, without its frame)
                sent = try_send_record(output, key, result, (), None, timestamp)
            else:
                sent = output.try_send(key=key, value=result, timestamp_ms=timestamp)
            if sent is None:
                return output.send(key=key, value=result, timestamp_ms=timestamp)
        return None

    async def emit_awaited(event: Event, pending: Awaitable[Any]) -> None:
        sending = emit(event, await pending)
        if sending is not None:
            await sending

    return emit, emit_awaited
