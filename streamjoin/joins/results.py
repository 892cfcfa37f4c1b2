"""Sending an enriching join's results: one function the stream-table join and the
stream-global-table join both build once per join and call once per event."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Final

from streamjoin.events import Event
from streamjoin.quick_sends import try_send_record
from streamjoin.topics import Topic

__all__ = ["PLAIN_RESULTS", "Emit", "result_sender"]

#: result types a join function returns directly: checked by type before the slower
#: ``inspect.isawaitable`` (an async join function's result is awaited first)
PLAIN_RESULTS: Final = frozenset((dict, list, tuple, str, bytes, int, float, bool, type(None)))

#: ``emit(event, result)``: None when done, or what is left to await
Emit = Callable[[Event, Any], Awaitable[object] | None]


def result_sender(output: Topic | None) -> Emit:
    """``emit(event, result)`` for ``output``: sends a non-None result with the event's key
    and timestamp at once, or returns what to await when the output has no room (None when
    done: no coroutine for the usual case). An async join function's result (awaitable)
    is awaited first, in what it returns."""

    def send(event: Event, result: Any) -> Awaitable[object] | None:
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

    async def send_awaited(event: Event, pending: Awaitable[Any]) -> None:
        sending = send(event, await pending)
        if sending is not None:
            await sending

    def emit(event: Event, result: Any) -> Awaitable[object] | None:
        if type(result) not in PLAIN_RESULTS and inspect.isawaitable(result):
            return send_awaited(event, result)
        return send(event, result)

    return emit
