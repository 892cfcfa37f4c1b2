"""``quick_partition.partition_of``: the same partitions and the same errors as
``partitioner.partition_for_key``, for any key and count."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.partitioner import partition_for_key, pure_partition_for_key
from streamjoin.quick_partition import partition_of


@settings(max_examples=400, deadline=None)
@given(key=st.binary(max_size=64), count=st.integers(min_value=1, max_value=2**70))
def test_partition_of_is_the_partitioners_answer(key: bytes, count: int) -> None:
    assert partition_of(key, count) == pure_partition_for_key(key, count)
    assert partition_of(key, count) == partition_for_key(key, count)


def test_partition_of_other_buffers_as_the_partitioner() -> None:
    for key in (bytearray(b"foobar"), memoryview(b"foobar")):
        assert partition_of(key, 7) == partition_for_key(b"foobar", 7)


@pytest.mark.parametrize(
    ("key", "count"),
    [(None, 3), (b"k", 0), (b"k", -2), (b"k", "3"), (b"k", 3.0), (b"k", True), ("k", 3)],
)
def test_partition_of_refuses_what_the_partitioner_refuses(key: Any, count: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as expected:
        partition_for_key(key, count)
    with pytest.raises((TypeError, ValueError)) as got:
        partition_of(key, count)
    assert type(got.value) is type(expected.value)
    assert str(got.value) == str(expected.value)
