"""Remembered JSON values: the same answers as decoding every time, and no reader can
change what the next reader gets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.codecs import JsonCodec, StrCodec
from streamjoin.remembered_values import MAX_REMEMBERED_BYTES, RememberedValues, value_loader

_scalars = st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)


def _encoded(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


@settings(max_examples=200, deadline=None)
@given(st.lists(_values, min_size=1, max_size=8), st.data())
def test_every_read_equals_a_fresh_decode_even_after_callers_change_what_they_got(
    values: list[Any], data: st.DataObject
) -> None:
    codec = JsonCodec()
    remembered = RememberedValues(codec, bound=3)  # small: the memory starts over often
    stored = [_encoded(v) for v in values]
    for _ in range(20):
        raw = data.draw(st.sampled_from(stored))
        got = remembered.loads(raw)
        fresh = codec.loads(raw)
        assert got == fresh
        assert repr(got) == repr(fresh)  # (1 stays int, -0.0 stays -0.0)
        # the caller changes what it was given: the next read must not see it
        if isinstance(got, dict):
            got["changed"] = True
        elif isinstance(got, list):
            got.append("changed")


def test_a_row_is_parsed_once_and_each_reader_gets_its_own_copy() -> None:
    parsed: list[bytes] = []

    class CountingJson(JsonCodec):
        def loads(self, data: bytes) -> Any:
            parsed.append(data)
            return super().loads(data)

    remembered = RememberedValues(CountingJson())
    row = b'{"country":"DE","tier":"gold"}'
    first = remembered.loads(row)
    second = remembered.loads(row)
    assert first == second == {"country": "DE", "tier": "gold"}
    assert first is not second
    assert parsed == [row]
    assert remembered.loads(b"3") == 3 and remembered.loads(b"3") == 3
    assert parsed == [row, b"3"]


def test_nested_values_are_decoded_every_time() -> None:
    remembered = RememberedValues(JsonCodec())
    raw = b'{"items":[1,2]}'
    first = remembered.loads(raw)
    first["items"].append(3)
    assert remembered.loads(raw) == {"items": [1, 2]}
    assert len(remembered) == 0


def test_the_memory_is_bounded() -> None:
    remembered = RememberedValues(JsonCodec(), bound=5)
    for i in range(23):
        assert remembered.loads(b"%d" % i) == i
        assert len(remembered) <= 5


def test_bad_bytes_are_still_a_decode_error() -> None:
    from streamjoin.errors import DecodeError

    remembered = RememberedValues(JsonCodec())
    with pytest.raises(DecodeError):
        remembered.loads(b"{not json")
    with pytest.raises(DecodeError):
        remembered.loads(b"{not json")  # (a failure is not remembered either)


def test_only_the_plain_json_codec_is_remembered() -> None:
    class MyJson(JsonCodec):
        pass

    assert isinstance(value_loader(JsonCodec()).__self__, RememberedValues)  # type: ignore[attr-defined]
    str_codec = StrCodec()
    assert value_loader(str_codec) == str_codec.loads
    custom = MyJson()
    assert value_loader(custom) == custom.loads
    plain = JsonCodec()
    assert value_loader(plain, bound=0) == plain.loads


def test_long_values_are_decoded_every_time() -> None:
    remembered = RememberedValues(JsonCodec())
    raw = json.dumps({"text": "x" * MAX_REMEMBERED_BYTES}).encode()
    assert remembered.loads(raw) == {"text": "x" * MAX_REMEMBERED_BYTES}
    assert len(remembered) == 0
