"""The built-in codecs' common cases run from compiled code (quick_codecs): whatever the
input, the same result and the same error as the codec's own method."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin import quick_codecs
from streamjoin.codecs import JSON, RAW, STR, Codec, DataclassJson, JsonCodec, StrCodec
from streamjoin.errors import ArgumentTypeError, CodecError

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary(max_size=8)
    | st.sampled_from(["\ud800", "a\udfffb", 2**64, -(2**63) - 1])
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text() | st.integers(), inner, max_size=4)
        | st.tuples(inner)
        | st.frozensets(st.integers(), max_size=3)
    ),
    max_leaves=8,
)
_bytes = (
    st.binary(max_size=24)
    | st.sampled_from(
        [b'{"a":1}', b"[1,2.5,null]", b"NaN", b"1e999", b'"\\ud800"', b"\xff", b"[" * 2000]
    )
    | st.builds(bytearray, st.binary(max_size=8))
    | st.text(max_size=8)
    | st.none()
)


@dataclass
class _Point:
    x: int


class _CountingJson(JsonCodec):
    """A subclass: its own method must run, not the built-in's common case."""

    def __init__(self) -> None:
        self.calls = 0

    def loads(self, data: Any) -> Any:
        self.calls += 1
        return super().loads(data)

    def dumps(self, obj: Any) -> bytes | None:
        self.calls += 1
        return super().dumps(obj)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        result = call()
    except (CodecError, ArgumentTypeError) as exc:
        return type(exc).__name__, str(exc)
    if isinstance(result, float) and math.isnan(result):
        return "nan", None
    return "value", (type(result), repr(result))


_CODECS: list[Codec] = [JSON, STR, RAW, JsonCodec(), StrCodec(), DataclassJson(_Point)]


@settings(max_examples=400, deadline=None)
@given(_values, st.sampled_from(range(len(_CODECS))))
def test_dump_gives_what_the_codec_gives(obj: Any, which: int) -> None:
    codec = _CODECS[which]
    assert _outcome(lambda: quick_codecs.dump(codec, obj)) == _outcome(lambda: codec.dumps(obj))


@settings(max_examples=400, deadline=None)
@given(_bytes, st.sampled_from(range(len(_CODECS))))
def test_load_and_loader_give_what_the_codec_gives(data: Any, which: int) -> None:
    codec = _CODECS[which]
    expected = _outcome(lambda: codec.loads(data))
    assert _outcome(lambda: quick_codecs.load(codec, data)) == expected
    assert _outcome(lambda: quick_codecs.loader(codec)(data)) == expected


@pytest.mark.parametrize("codec", [JSON, STR])
def test_the_built_in_codecs_get_the_compiled_loaders(codec: Codec) -> None:
    assert quick_codecs.loader(codec) in (quick_codecs.json_loads, quick_codecs.str_loads)


def test_a_subclass_of_a_built_in_codec_runs_its_own_methods() -> None:
    codec = _CountingJson()
    assert quick_codecs.dump(codec, {"a": 1}) == b'{"a":1}'
    assert quick_codecs.load(codec, b'{"a":1}') == {"a": 1}
    assert quick_codecs.loader(codec)(b"[1]") == [1]
    assert codec.calls == 3
