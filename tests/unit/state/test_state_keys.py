"""Sortable key encodings: round trips, ordering, prefix ranges.

Hypothesis prints the falsifying example and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamjoin.errors import KeyEncodingError
from streamjoin.state.keys import (
    MAX_UINT64,
    decode_uint64,
    encode_uint64,
    length_prefixed,
    prefix_range,
    split_window_key,
    window_key,
    window_key_prefix,
)

user_keys = st.binary(max_size=12)
starts = st.integers(0, MAX_UINT64)


@given(user_keys, starts)
def test_window_key_round_trips(key: bytes, start: int) -> None:
    assert split_window_key(window_key(key, start)) == (key, start)


@given(st.lists(st.tuples(user_keys, starts), min_size=2, max_size=30))
def test_encoded_byte_order_is_length_then_key_then_start(pairs: list[tuple[bytes, int]]) -> None:
    by_bytes = sorted(pairs, key=lambda p: window_key(*p))
    by_fields = sorted(pairs, key=lambda p: (len(p[0]), p[0], p[1]))
    assert by_bytes == by_fields


@given(st.lists(st.tuples(user_keys, starts), max_size=30), user_keys)
def test_all_windows_of_a_key_are_contiguous(pairs: list[tuple[bytes, int]], key: bytes) -> None:
    encoded = sorted(window_key(k, s) for k, s in {*pairs, (key, 0), (key, 5)})
    mine = [i for i, e in enumerate(encoded) if split_window_key(e)[0] == key]
    assert mine == list(range(mine[0], mine[-1] + 1))


def test_a_key_and_its_extension_never_interleave() -> None:
    keys = sorted(
        window_key(k, s) for k in (b"a", b"ab", b"a\xff", b"a\x00") for s in (0, 1, 2**40)
    )
    owners = [split_window_key(e)[0] for e in keys]
    # each key's three windows form one run
    runs = [owners[i] for i in range(len(owners)) if i == 0 or owners[i] != owners[i - 1]]
    assert len(runs) == len(set(runs)) == 4


def test_window_key_layout() -> None:
    assert window_key(b"ab", 258) == b"\x00\x00\x00\x02ab" + b"\x00" * 6 + b"\x01\x02"
    assert window_key_prefix(b"ab") == b"\x00\x00\x00\x02ab"


@pytest.mark.parametrize(
    "encoded",
    [
        b"",
        b"\x00\x00\x00\x00",
        b"\x00\x00\x00\x05ab" + b"\x00" * 8,
        b"\x00\x00\x00\x00" + b"\x00" * 9,
    ],
)
def test_malformed_window_keys_raise(encoded: bytes) -> None:
    with pytest.raises(KeyEncodingError):
        split_window_key(encoded)


@pytest.mark.parametrize("value", [-1, MAX_UINT64 + 1, True, 1.0])
def test_uint64_rejects_out_of_range_and_non_ints(value: object) -> None:
    with pytest.raises(KeyEncodingError):
        encode_uint64(value)


def test_non_bytes_keys_are_rejected() -> None:
    with pytest.raises(KeyEncodingError):
        length_prefixed("a")
    # (window_key's callers pass encoded keys: compiled, its bytes annotation is checked
    # at the call, a TypeError; as Python, length_prefixed's check words it)
    with pytest.raises((KeyEncodingError, TypeError)):
        window_key("a", 0)  # type: ignore[arg-type]


@given(st.integers(0, MAX_UINT64), st.integers(0, MAX_UINT64))
def test_uint64_order_and_round_trip(a: int, b: int) -> None:
    assert decode_uint64(encode_uint64(a)) == a
    assert (encode_uint64(a) < encode_uint64(b)) == (a < b)


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        (b"", None),
        (b"\xff", None),
        (b"\xff\xff", None),
        (b"a", b"b"),
        (b"a\xff", b"b"),
        (b"a\xff\xff", b"b"),
        (b"\x00", b"\x01"),
        (b"\x01\xfe", b"\x01\xff"),
    ],
)
def test_prefix_range_examples(prefix: bytes, end: bytes | None) -> None:
    assert prefix_range(prefix) == (prefix, end)


@given(st.binary(max_size=4), st.binary(max_size=6))
def test_prefix_range_covers_exactly_the_prefixed_keys(prefix: bytes, key: bytes) -> None:
    start, end = prefix_range(prefix)
    in_range = start <= key and (end is None or key < end)
    assert in_range == key.startswith(prefix)
