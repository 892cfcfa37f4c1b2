"""Sending an enriching join's results: one object the stream-table join and the
stream-global-table join both build once per join and call once per event."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any, Final

from streamjoin.events import Event
from streamjoin.quick_sends import try_send_record
from streamjoin.topics import Topic

__all__ = ["PLAIN_RESULTS", "ResultSender"]

#: result types a join function returns directly: checked by type before the slower
#: ``inspect.isawaitable`` (an async join function's result is awaited first)
PLAIN_RESULTS: Final = frozenset((dict, list, tuple, str, bytes, int, float, bool, type(None)))


class ResultSender:
    """Sends a join's non-None results to ``output`` with the event's key and timestamp.

    A class, not closures: the compiled enrichers call :meth:`emit` natively, where a
    closure would be a Python-level call (its arguments parsed) per event."""

    __slots__ = ("output",)

    def __init__(self, output: Topic | None) -> None:
        self.output = output

    def emit(self, event: Event, result: Any) -> Awaitable[object] | None:
        """Send ``result`` at once, or return what is left to await (None when done: no
        coroutine for the usual case): an async join function's result, awaited first,
        or a send waiting for room in the output."""
        if type(result) not in PLAIN_RESULTS and inspect.isawaitable(result):
            return self._send_awaited(event, result)
        return self.send(event, result)

    def send(self, event: Event, result: Any) -> Awaitable[object] | None:
        output = self.output
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

    async def _send_awaited(self, event: Event, pending: Awaitable[Any]) -> None:
        sending = self.send(event, await pending)
        if sending is not None:
            await sending
