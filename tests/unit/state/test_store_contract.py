"""The StorePartition contract, run against both backends (memory and RocksDB).

Property tests use Hypothesis; on failure it prints the falsifying example and a
``@reproduce_failure`` blob (rerun with ``--hypothesis-seed`` to replay a run).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from state_store_support import StoreFactory, write_both

from streamjoin.errors import StoreError
from streamjoin.state.base import StorePartition

# Keys chosen to trip up ordering: empty, NULs, 0xff runs, prefixes of each other.
TRICKY_KEYS = [
    b"",
    b"\x00",
    b"\x00\x00",
    b"\x00\xff",
    b"\x01",
    b"a",
    b"a\x00",
    b"a\xff",
    b"ab",
    b"b",
    b"\x7f",
    b"\x80",
    b"\xfe\xff",
    b"\xff",
    b"\xff\x00",
    b"\xff\xff",
    b"\xff\xff\xff",
]

PROPERTY_SETTINGS = settings(
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def fill(store: StorePartition, keys: list[bytes]) -> None:
    store.write({k: b"v:" + k for k in keys}, None)


def test_empty_store(store: StorePartition) -> None:
    assert store.get(b"a") is None
    assert not store.contains(b"a")
    assert list(store.items()) == []
    assert store.changelog_offset() is None
    assert store.count() == 0


def test_put_get_overwrite_and_empty_values(store: StorePartition) -> None:
    store.write({b"a": b"1", b"": b"empty key", b"z": b""}, None)
    assert store.get(b"a") == b"1"
    assert store.get(b"") == b"empty key"
    assert store.get(b"z") == b""  # an empty value is a value, not a delete
    assert store.contains(b"z")
    store.write({b"a": b"2"}, None)
    assert store.get(b"a") == b"2"


def test_none_deletes_and_deleting_a_missing_key_is_fine(store: StorePartition) -> None:
    store.write({b"a": b"1", b"b": b"2"}, None)
    store.write({b"a": None, b"missing": None}, None)
    assert store.get(b"a") is None
    assert not store.contains(b"a")
    assert list(store.items()) == [(b"b", b"2")]


def test_items_are_sorted_by_unsigned_bytes(store: StorePartition) -> None:
    fill(store, list(reversed(TRICKY_KEYS)))
    assert [k for k, _ in store.items()] == sorted(TRICKY_KEYS)
    assert all(v == b"v:" + k for k, v in store.items())


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (None, None),
        (b"", None),
        (None, b""),
        (b"a", b"b"),
        (b"a", b"ab"),
        (b"a\x00", b"a\xff"),
        (b"\xff", None),
        (b"\xff", b"\xff\xff"),
        (b"\x00", b"\x01"),
        (b"aa", b"az"),  # bounds that are not keys
        (b"b", b"a"),  # empty: start after end
        (b"a", b"a"),  # empty: start == end
    ],
)
def test_items_bounds_start_inclusive_end_exclusive(
    store: StorePartition, start: bytes | None, end: bytes | None
) -> None:
    fill(store, TRICKY_KEYS)
    expected = [
        k for k in sorted(TRICKY_KEYS) if (start is None or k >= start) and (end is None or k < end)
    ]
    assert [k for k, _ in store.items(start, end)] == expected
    if start is not None and end is not None:
        assert [k for k, _ in store.range_items(start, end)] == expected


@PROPERTY_SETTINGS
@given(
    ops=st.lists(
        st.tuples(st.binary(max_size=4), st.one_of(st.none(), st.binary(max_size=3))),
        max_size=40,
    ),
    start=st.one_of(st.none(), st.binary(max_size=3)),
    end=st.one_of(st.none(), st.binary(max_size=3)),
)
def test_items_match_a_dict_model(
    store_factory: StoreFactory,
    ops: list[tuple[bytes, bytes | None]],
    start: bytes | None,
    end: bytes | None,
) -> None:
    store = store_factory.fresh()
    model: dict[bytes, bytes] = {}
    for i in range(0, len(ops), 7):  # several batches, each a dict (last write per key wins)
        write_both(store, model, dict(ops[i : i + 7]))
    expected = sorted(
        (k, v)
        for k, v in model.items()
        if (start is None or k >= start) and (end is None or k < end)
    )
    assert list(store.items(start, end)) == expected
    if start is not None and end is not None:
        assert store.range_items(start, end) == expected
    assert all(store.get(k) == v for k, v in model.items())
    store.close()


def test_offset_is_stored_with_the_write_and_none_keeps_it(store: StorePartition) -> None:
    store.write({b"a": b"1"}, 10)
    assert store.changelog_offset() == 10
    store.write({b"b": b"2"}, None)
    assert store.changelog_offset() == 10
    store.write({}, 12)  # an offset alone (e.g. a changelog record that changed nothing)
    assert store.changelog_offset() == 12
    store.write({b"c": b"3"}, 12)  # same offset again is allowed (idempotent replay)
    assert store.changelog_offset() == 12


def test_offset_zero_is_an_offset(store: StorePartition) -> None:
    store.write({b"a": b"1"}, 0)
    assert store.changelog_offset() == 0


def test_offset_never_moves_back_and_the_rejected_write_applies_nothing(
    store: StorePartition,
) -> None:
    store.write({b"a": b"1"}, 10)
    with pytest.raises(StoreError, match="older than the stored offset 10"):
        store.write({b"a": b"2", b"b": b"2"}, 9)
    assert store.get(b"a") == b"1"
    assert store.get(b"b") is None
    assert store.changelog_offset() == 10


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_malformed_offsets_are_rejected(store: StorePartition, bad: Any) -> None:
    with pytest.raises(StoreError, match="changelog offset must be an int >= 0"):
        store.write({b"a": b"1"}, bad)
    assert store.get(b"a") is None


def test_a_failing_write_applies_nothing(store: StorePartition) -> None:
    store.write({b"a": b"1"}, 1)
    bad: dict[Any, Any] = {b"a": b"2", b"b": b"2", b"c": "not bytes", b"d": b"4"}
    with pytest.raises(TypeError):
        store.write(bad, 2)
    assert list(store.items()) == [(b"a", b"1")]
    assert store.changelog_offset() == 1
    with pytest.raises(TypeError):
        store.write({"str key": b"x"}, 3)  # type: ignore[dict-item]
    assert store.changelog_offset() == 1


def test_count_and_size(store: StorePartition) -> None:
    store.write({b"k%d" % i: b"x" * 10 for i in range(100)}, 5)
    assert store.count() == 100  # fresh distinct keys: exact even for RocksDB's estimate
    assert store.size_bytes() > 0


def test_metadata_is_not_user_data(store: StorePartition) -> None:
    store.write({b"a": b"1"}, 7)
    assert list(store.items()) == [(b"a", b"1")]
    assert store.count() == 1


def test_closed_store_refuses_everything_and_close_is_idempotent(store: StorePartition) -> None:
    store.write({b"a": b"1"}, 1)
    store.close()
    store.close()
    for call in (
        lambda: store.get(b"a"),
        lambda: store.contains(b"a"),
        lambda: store.items(),
        lambda: store.range_items(b"", b"z"),
        lambda: store.write({b"b": b"2"}, 2),
        lambda: store.changelog_offset(),
        lambda: store.count(),
        lambda: store.size_bytes(),
    ):
        with pytest.raises(StoreError, match="closed"):
            call()


def test_a_scan_cut_short_by_close_raises_instead_of_ending_quietly(
    store: StorePartition,
) -> None:
    fill(store, [b"a", b"b", b"c"])
    scan = store.items()
    assert next(scan)[0] == b"a"
    store.close()
    with pytest.raises(StoreError, match="closed"):
        next(scan)


def test_stores_satisfy_the_protocol(store: StorePartition) -> None:
    assert isinstance(store, StorePartition)
