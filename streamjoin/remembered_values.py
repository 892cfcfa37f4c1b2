"""Decoded table values remembered by their stored bytes.

A stream-table join reads its key's row for every event, and a count reads its stored
number for every event: most reads decode bytes already decoded before (the store's read
cache hands back the very same bytes object, whose hash Python keeps). Parsing JSON (or
Avro) costs about ten times a dict lookup, so a table keeps what it decoded, keyed by the
bytes.

Only values no caller can change are kept and shared: strings, numbers and booleans. A
flat dict or list of those is kept too, and every read gets its own shallow copy (a
caller may change the row it was given without changing the next reader's). Anything
nested is decoded every time. Only codecs whose values are plain data are remembered: the
:class:`JsonCodec`, and codecs that say so with a true ``plain_values`` attribute (the
schema-registry codecs without a ``record_type``); typed records (dataclasses, Structs, user
codecs) are decoded every time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from streamjoin.codecs import Codec, JsonCodec
from streamjoin.quick_codecs import load

__all__ = ["DEFAULT_BOUND", "MAX_REMEMBERED_BYTES", "RememberedValues", "value_loader"]

#: values remembered per table; past it the memory starts over (a table whose reads spread
#: over more distinct values than this gains little from remembering them)
DEFAULT_BOUND: Final = 10_000
#: stored values longer than this are decoded every time: with the bound above, a table
#: holds at most about 15 MB of remembered values (a decoded dict takes several times its
#: JSON's bytes)
MAX_REMEMBERED_BYTES: Final = 256

_IMMUTABLE: Final = frozenset((str, int, float, bool))
_FLAT_ITEMS: Final = frozenset((str, int, float, bool, type(None)))
_MISS: Final = object()


class RememberedValues:
    """``loads`` of a plain-data codec that decodes each distinct stored value once."""

    __slots__ = ("_bound", "_codec", "_seen")

    def __init__(self, codec: Codec, bound: int = DEFAULT_BOUND) -> None:
        self._codec = codec
        self._bound = bound
        #: stored bytes -> the decoded value (a private copy for dicts and lists)
        self._seen: dict[bytes, Any] = {}

    def loads(self, data: bytes) -> Any:
        seen = self._seen
        if type(data) is bytes:
            value = seen.get(data, _MISS)
            if value is not _MISS:
                kind = type(value)
                return value.copy() if kind is dict or kind is list else value
        value = load(self._codec, data)
        kind = type(value)
        if kind in _IMMUTABLE:
            kept = value
        elif (kind is dict and _flat(value.values())) or (kind is list and _flat(value)):
            kept = value.copy()
        else:
            return value
        if type(data) is bytes and len(data) <= MAX_REMEMBERED_BYTES:
            if len(seen) >= self._bound:
                seen.clear()
            seen[data] = kept
        return value

    def __len__(self) -> int:
        return len(self._seen)


def _flat(items: Any) -> bool:
    for item in items:  # noqa: SIM110 (all() of a generator: about 2x slower)
        if type(item) not in _FLAT_ITEMS:
            return False
    return True


def value_loader(codec: Codec, bound: int = DEFAULT_BOUND) -> Callable[[bytes], Any]:
    """What a table decodes its stored values with: remembered for plain-data codecs (the
    JSON codec, codecs with a true ``plain_values``; ``bound`` > 0), the codec's own
    ``loads`` otherwise."""
    plain = type(codec) is JsonCodec or getattr(codec, "plain_values", False) is True
    if plain and bound > 0:
        return RememberedValues(codec, bound).loads
    return codec.loads
