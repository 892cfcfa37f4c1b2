"""The built-in codecs' common cases, run from compiled code: a str key and a JSON value
encoded and decoded without a Python frame.

Compiled with mypyc (:mod:`streamjoin.compiled`): every record read, sent or stored
passes a codec, often two. The codecs themselves stay interpreted in
:mod:`streamjoin.codecs` (users subclass them, and their errors are worded there); this
module takes only the common case of an exact :class:`~streamjoin.codecs.StrCodec` or
:class:`~streamjoin.codecs.JsonCodec` (the same calls their methods make first) and
hands everything else, failures included, to the codec's own method. So the result is
the codec's result, byte for byte and error for error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from streamjoin.codecs import JsonCodec, StrCodec, fast_json_decode, fast_json_encode, plain_json

__all__ = ["dump", "json_loads", "load", "loader", "str_loads"]

# The names the per-record functions read, as ``Final`` aliases: compiled, a Final name
# is a C static, where any other module-level name is a dict lookup at every use.
_JSON_CODEC: Final = JsonCodec
_STR_CODEC: Final = StrCodec
_PLAIN_JSON: Final = plain_json
_JSON_ENCODE: Final = fast_json_encode
_JSON_DECODE: Final = fast_json_decode

#: the ints the JSON codec writes with ``b"%d"`` itself (its encoder writes the rest)
_INT64_MIN: Final = -(2**63)
_UINT64_END: Final = 2**64


def dump(codec: Any, obj: Any) -> Any:
    """``codec.dumps(obj)``: the same bytes (or None), the same errors."""
    kind = type(codec)
    if kind is _STR_CODEC:
        if type(obj) is str:
            try:
                return obj.encode()
            except UnicodeEncodeError:
                pass  # (a lone surrogate: the codec words the error)
    elif kind is _JSON_CODEC:
        if obj is None:
            return None
        shape = type(obj)
        if shape is int and _INT64_MIN <= obj < _UINT64_END:  # (a count, an id)
            return b"%d" % obj
        if (shape is dict or shape is list) and _PLAIN_JSON(obj):
            try:
                return _JSON_ENCODE(obj)
            except (ValueError, msgspec.EncodeError):
                pass  # (a lone surrogate: the codec words the error)
    return codec.dumps(obj)


def load(codec: Any, data: Any) -> Any:
    """``codec.loads(data)``: the same value, the same errors."""
    kind = type(codec)
    if kind is _JSON_CODEC:
        return json_loads(data)
    if kind is _STR_CODEC:
        return str_loads(data)
    return codec.loads(data)


def json_loads(data: Any) -> Any:
    """What :meth:`JsonCodec.loads` gives for ``data``."""
    if type(data) is bytes:
        try:
            return _JSON_DECODE(data)
        except (ValueError, RecursionError):
            pass  # (the codec reads what JSON allows of it, or words the error)
    return _JSON.loads(data)


def str_loads(data: Any) -> Any:
    """What :meth:`StrCodec.loads` gives for ``data``."""
    if type(data) is bytes:
        try:
            return data.decode()
        except UnicodeDecodeError:
            pass  # (the codec words the error)
    return _STR.loads(data)


def loader(codec: Any) -> Callable[[Any], Any]:
    """The function that decodes like ``codec.loads``: a compiled one for the exact
    built-in JSON and str codecs, the codec's own method otherwise."""
    kind = type(codec)
    if kind is _JSON_CODEC:
        return json_loads
    if kind is _STR_CODEC:
        return str_loads
    loads: Callable[[Any], Any] = codec.loads
    return loads


#: every exact JsonCodec (and StrCodec) decodes alike: one of each does the rest
_JSON: Final = JsonCodec()
_STR: Final = StrCodec()
