"""Decoding a fetched record into the event an agent's function sees.

Once per event, so it is one of the compiled per-event modules
(:mod:`streamjoin.compiled`); :class:`~streamjoin.agents.Agent`, which takes the user's
arguments, stays Python and hands its decoders over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from msgspec.structs import astuple

from streamjoin.errors import DecodeError
from streamjoin.events import Event, RawRecord

__all__ = ["Loads", "RecordDecoder"]

#: a topic's key and value decoders
Loads = tuple[Callable[[bytes], Any], Callable[[bytes], Any]]

#: (``Final``: a C static when compiled, not a module dict lookup per use)
_ASTUPLE: Final = astuple
_EVENT: Final = Event


class RecordDecoder:
    """The key and value decoders of each topic an agent reads, by topic name."""

    def __init__(self, loads: dict[str, Loads], first_topic: str) -> None:
        self.loads = loads
        self.first_topic = first_topic

    def decoders(self, topic: str) -> Loads:
        """``topic``'s decoders; a topic the agent does not read gets its first topic's."""
        found = self.loads.get(topic)
        return found if found is not None else self.loads[self.first_topic]

    def decode(self, raw: RawRecord) -> Event:
        """The event for ``raw``; raises :class:`DecodeError` naming the record on bad bytes."""
        # the record's fields in one call (compiled, seven attribute reads of a msgspec
        # Struct each go through the generic lookup: about 2x as long)
        topic, partition, offset, timestamp, key, value, headers = _ASTUPLE(raw)
        loads = self.loads.get(topic)
        if loads is None:  # (decoders() inline: one call less per event)
            loads = self.loads[self.first_topic]
        try:
            if key is not None:
                key = loads[0](key)
            if value is not None:
                value = loads[1](value)
        except DecodeError as exc:
            raise DecodeError(f"{raw.position}: {exc}") from exc
        return _EVENT(key, value, topic, partition, offset, timestamp, headers)
