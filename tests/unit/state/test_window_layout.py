"""The windowed layout: pinned bytes, ordering, round trips, and expiry over both store backends.

Hypothesis prints the falsifying example and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from state_store_support import StoreFactory

from streamjoin.errors import IncompatibleWindowState, KeyEncodingError
from streamjoin.joins import core
from streamjoin.state import window_layout as layout
from streamjoin.state.base import StorePartition
from streamjoin.state.keys import MAX_UINT64, encode_uint64, length_prefixed, window_key
from streamjoin.state.window_layout import (
    DATA,
    INDEX,
    JOIN_STATE_KEY,
    META,
    STREAM_TIME_KEY,
    DataEntry,
)

user_keys = st.binary(max_size=6)
times = st.integers(0, MAX_UINT64)
sides = st.sampled_from([b"L", b"R"])
seqs = st.integers(0, MAX_UINT64)

# ------------------------------------------------------------------ pinned bytes


def test_namespaces_and_reserved_names_are_pinned() -> None:
    """Changing these bytes changes every windowed changelog: see docs/state.md."""
    assert (META, INDEX, DATA) == (b"\x00", b"\x01", b"\x02")
    assert STREAM_TIME_KEY == b"\x00stream-time"
    assert JOIN_STATE_KEY == b"\x00join-state"
    assert layout.namespace_range(INDEX) == (b"\x01", b"\x02")
    assert layout.namespace_range(DATA) == (b"\x02", b"\x03")


def test_key_shapes_are_pinned() -> None:
    assert layout.data_key(b"ab", 258) == b"\x02" + b"\x00\x00\x00\x02ab" + bytes(6) + b"\x01\x02"
    assert layout.data_key(b"ab", 258, space=b"L", suffix=b"s") == (
        b"\x02L" + window_key(b"ab", 258) + b"s"
    )
    assert layout.index_key(258, b"id") == b"\x01" + bytes(6) + b"\x01\x02" + b"id"
    assert layout.encode_meta_int(258) == bytes(6) + b"\x01\x02"


def test_the_join_core_uses_the_layout() -> None:
    assert core.META_KEY == JOIN_STATE_KEY
    assert core.EXPIRY_PREFIX == INDEX
    assert core.BUFFER_PREFIX == DATA


def test_the_fast_key_builders_are_pinned() -> None:
    """Known bytes: stores and changelogs written before must still read."""
    # windowed tables: the window's value, and its expiry index entry
    assert layout.table_keys(b"ab", 258) == (
        b"\x02" + b"\x00\x00\x00\x02ab" + bytes(6) + b"\x01\x02",
        b"\x01" + bytes(6) + b"\x01\x02" + b"\x00\x00\x00\x02ab",
    )
    assert layout.table_data_key(b"ab", 258) == layout.table_keys(b"ab", 258)[0]
    # join buffers: a buffered event (side, key, ts, seq) and its expiry entry
    prefixed = b"\x00\x00\x00\x02ab"
    assert layout.join_buffer_key(b"L", prefixed, 258, 3) == (
        b"\x02L" + prefixed + bytes(6) + b"\x01\x02" + bytes(7) + b"\x03"
    )
    assert layout.join_index_key(b"R", prefixed, 258, 3) == (
        b"\x01" + bytes(6) + b"\x01\x02" + b"R" + bytes(7) + b"\x03" + prefixed
    )
    assert layout.pack_u64(258) == bytes(6) + b"\x01\x02"
    assert layout.pack_key_length(2) == b"\x00\x00\x00\x02"


@pytest.mark.parametrize(
    ("key", "start"),
    [(b"", 0), (b"k", 60_000), (b"\x00\xff" * 10, (1 << 63) - 1), (b"x" * 70_000, 5)],
)
def test_the_table_key_builders_equal_the_checked_functions(key: bytes, start: int) -> None:
    """Ordinary keys are packed directly, others (a key of 70 kB) through the checks."""
    assert layout.table_keys(key, start) == (
        layout.data_key(key, start),
        layout.index_key(start, length_prefixed(key)),
    )
    assert layout.table_data_key(key, start) == layout.data_key(key, start)


def test_the_table_key_builders_check_what_they_do_not_pack() -> None:
    for start in (-1, MAX_UINT64 + 1):
        with pytest.raises(KeyEncodingError):
            layout.table_keys(b"k", start)
        with pytest.raises(KeyEncodingError):
            layout.table_data_key(b"k", start)


@given(sides, user_keys, st.integers(0, core.MAX_TIMESTAMP_MS), seqs)
def test_the_join_key_builders_equal_the_checked_functions(
    side: bytes, key: bytes, ts: int, seq: int
) -> None:
    """The join core builds these keys with the same packers, inline (per-event path)."""
    prefixed = length_prefixed(key)
    buffer_key = layout.join_buffer_key(side, prefixed, ts, seq)
    assert buffer_key == layout.data_key(key, ts, space=side, suffix=encode_uint64(seq))
    assert layout.split_data_key(buffer_key, 1, 8) == DataEntry(side, key, ts, encode_uint64(seq))
    index_key = layout.join_index_key(side, prefixed, ts, seq)
    assert index_key == layout.index_key(ts, side + encode_uint64(seq) + prefixed)
    assert layout.split_join_index_key(index_key) == (ts, side, seq, prefixed)


@pytest.mark.parametrize(
    "entry",
    [
        b"",
        layout.join_index_key(b"X", length_prefixed(b"k"), 1, 2),  # no such side
        layout.join_index_key(b"L", length_prefixed(b"k"), 1, 2)[:-1],  # key cut short
        b"\x02" + layout.join_index_key(b"L", length_prefixed(b"k"), 1, 2)[1:],  # not INDEX
    ],
)
def test_malformed_join_index_entries_are_refused(entry: bytes) -> None:
    with pytest.raises(KeyEncodingError, match="malformed join index entry"):
        layout.split_join_index_key(entry)


# ------------------------------------------------------------------ round trips


@given(times, st.binary(max_size=12))
def test_index_keys_round_trip(time_ms: int, entry_id: bytes) -> None:
    assert layout.split_index_key(layout.index_key(time_ms, entry_id)) == (time_ms, entry_id)


@given(st.binary(max_size=2), user_keys, times, st.binary(max_size=9))
def test_data_keys_round_trip(space: bytes, key: bytes, time_ms: int, suffix: bytes) -> None:
    encoded = layout.data_key(key, time_ms, space=space, suffix=suffix)
    assert encoded.startswith(layout.data_key_prefix(key, space))
    assert layout.split_data_key(encoded, len(space), len(suffix)) == DataEntry(
        space, key, time_ms, suffix
    )


@given(times)
def test_meta_ints_round_trip(value: int) -> None:
    assert layout.decode_meta_int(STREAM_TIME_KEY, layout.encode_meta_int(value)) == value


@given(user_keys)
def test_length_prefix_round_trips(key: bytes) -> None:
    assert layout.strip_length_prefix(length_prefixed(key)) == key


@pytest.mark.parametrize("raw", [b"300000", b"1700000000000", b"", bytes(9)])
def test_a_meta_int_of_another_layout_is_refused_not_misread(raw: bytes) -> None:
    # earlier windowed tables stored stream time as ASCII digits
    with pytest.raises(IncompatibleWindowState, match="must be reset"):
        layout.decode_meta_int(STREAM_TIME_KEY, raw)


@pytest.mark.parametrize(
    ("split", "entry"),
    [
        (layout.split_index_key, b""),
        (layout.split_index_key, b"\x01" + bytes(7)),
        (layout.split_index_key, layout.data_key(b"k", 1)),
        (layout.split_data_key, b""),
        (layout.split_data_key, layout.index_key(1, length_prefixed(b"k"))),
        (layout.split_data_key, b"\x02" + b"\x00\x00\x00\x05ab" + bytes(8)),
        (layout.strip_length_prefix, b"\x00\x00"),
        (layout.strip_length_prefix, b"\x00\x00\x00\x02a"),
    ],
)
def test_malformed_entries_are_refused(split: object, entry: bytes) -> None:
    with pytest.raises(KeyEncodingError, match=r"malformed|does not match its length"):
        split(entry)  # type: ignore[operator]


def test_bad_names_and_namespaces_are_refused() -> None:
    with pytest.raises(KeyEncodingError, match="metadata names are non-empty bytes"):
        layout.meta_key(b"")
    with pytest.raises(KeyEncodingError, match="unknown namespace"):
        layout.namespace_range(b"\x03")


# ------------------------------------------------------------------ ordering

data_entries = st.tuples(sides, user_keys, times, seqs)


@given(st.lists(data_entries, min_size=2, max_size=30))
def test_data_keys_sort_by_space_then_key_then_time(
    entries: list[tuple[bytes, bytes, int, int]],
) -> None:
    def encode(e: tuple[bytes, bytes, int, int]) -> bytes:
        return layout.data_key(e[1], e[2], space=e[0], suffix=encode_uint64(e[3]))

    by_bytes = sorted(entries, key=encode)
    by_fields = sorted(entries, key=lambda e: (e[0], len(e[1]), e[1], e[2], e[3]))
    assert by_bytes == by_fields


@given(st.lists(st.tuples(user_keys, times), max_size=30), user_keys)
def test_a_keys_windows_are_contiguous_and_in_time_order(
    pairs: list[tuple[bytes, int]], key: bytes
) -> None:
    encoded = sorted({layout.data_key(k, t) for k, t in [*pairs, (key, 0), (key, 5)]})
    entries = [layout.split_data_key(e) for e in encoded]
    mine = [i for i, e in enumerate(entries) if e.key == key]
    assert mine == list(range(mine[0], mine[-1] + 1))
    mine_times = [entries[i].time_ms for i in mine]
    assert mine_times == sorted(mine_times)


def test_a_key_and_its_extensions_never_interleave() -> None:
    encoded = sorted(
        layout.data_key(k, t) for k in (b"a", b"ab", b"a\xff", b"a\x00", b"") for t in (0, 1, 2**40)
    )
    owners = [layout.split_data_key(e).key for e in encoded]
    runs = [owners[i] for i in range(len(owners)) if i == 0 or owners[i] != owners[i - 1]]
    assert len(runs) == len(set(runs)) == 5


@given(st.lists(st.tuples(times, st.binary(max_size=8)), min_size=2, max_size=30))
def test_index_entries_are_in_time_order(entries: list[tuple[int, bytes]]) -> None:
    encoded = sorted(layout.index_key(t, entry_id) for t, entry_id in entries)
    assert [layout.split_index_key(e) for e in encoded] == sorted(entries)


@given(
    st.lists(st.binary(min_size=1, max_size=12), max_size=10),
    st.lists(st.tuples(times, st.binary(max_size=8)), max_size=10),
    st.lists(data_entries, max_size=10),
)
def test_namespaces_never_interleave(
    names: list[bytes],
    index: list[tuple[int, bytes]],
    data: list[tuple[bytes, bytes, int, int]],
) -> None:
    keys = [(0, layout.meta_key(n)) for n in names]
    keys += [(1, layout.index_key(t, i)) for t, i in index]
    keys += [(2, layout.data_key(k, t, space=s, suffix=encode_uint64(q))) for s, k, t, q in data]
    namespaces = [ns for ns, _ in sorted(keys, key=lambda nk: nk[1])]
    assert namespaces == sorted(namespaces)
    for ns, key in keys:
        start, end = layout.namespace_range(layout.NAMESPACES[ns])
        assert start <= key < end


# ------------------------------------------------------------------ ranges


@given(
    st.lists(st.tuples(st.sampled_from([b"", b"a", b"ab", b"\xff"]), st.integers(0, 50))),
    st.sampled_from([b"", b"a", b"ab", b"\xff"]),
    st.integers(0, 60),
    st.integers(0, 60),
)
def test_data_range_selects_exactly_a_keys_times_inclusive(
    pairs: list[tuple[bytes, int]], key: bytes, from_ms: int, to_ms: int
) -> None:
    start, end = layout.data_range(key, from_ms, to_ms)
    encoded = {layout.data_key(k, t): (k, t) for k, t in pairs}
    selected = {e for e in encoded if start <= e < end}
    assert selected == {e for e, (k, t) in encoded.items() if k == key and from_ms <= t <= to_ms}


@given(st.lists(st.tuples(times, st.binary(max_size=4))), times, times)
def test_index_range_selects_exactly_the_times_below(
    entries: list[tuple[int, bytes]], from_ms: int, before_ms: int
) -> None:
    start, end = layout.index_range(before_ms, from_ms)
    encoded = {layout.index_key(t, i): t for t, i in entries}
    selected = {e for e in encoded if start <= e < end}
    assert selected == {e for e, t in encoded.items() if from_ms <= t < before_ms}


def test_index_range_can_cover_everything() -> None:
    assert layout.index_range(MAX_UINT64 + 1) == (INDEX + bytes(8), b"\x02")


def test_data_range_over_a_store_with_inclusive_bounds(store: StorePartition) -> None:
    """Both backends order the layout's keys the same way (RocksDB compares bytes too)."""
    suffix = encode_uint64(MAX_UINT64)  # the widest suffix, at the top of the time range
    writes: dict[bytes, bytes | None] = {}
    for key in (b"a", b"ab", b"a\xff", b"", b"b"):
        for t in (40, 0, 2**40, 10, 5, MAX_UINT64):
            writes[layout.data_key(key, t, space=b"L", suffix=suffix)] = key + b"@%d" % t
            writes[layout.data_key(key, t, space=b"R", suffix=suffix)] = b"right"
    store.write(writes, None)

    def fetch(key: bytes, from_ms: int, to_ms: int) -> list[int]:
        scanned = store.items(*layout.data_range(key, from_ms, to_ms, space=b"L"))
        return [layout.split_data_key(k, 1, 8).time_ms for k, _ in scanned]

    assert fetch(b"a", 0, MAX_UINT64) == [0, 5, 10, 40, 2**40, MAX_UINT64]
    assert fetch(b"a", 5, 40) == [5, 10, 40]
    assert fetch(b"a", 6, 39) == [10]
    assert fetch(b"", 0, 10) == [0, 5, 10]
    assert fetch(b"a", 40, 5) == []
    assert fetch(b"zz", 0, MAX_UINT64) == []


# ------------------------------------------------------------------ expiry over a store


def _expire(store: StorePartition, before_ms: int) -> int:
    """What a windowed table's expiry does: the index below the cutoff, and its windows."""
    writes: dict[bytes, bytes | None] = {}
    for index_key, _ in store.items(*layout.index_range(before_ms)):
        start, prefixed_key = layout.split_index_key(index_key)
        writes[index_key] = None
        writes[layout.data_key(layout.strip_length_prefix(prefixed_key), start)] = None
    store.write(writes, None)
    return len(writes) // 2


@settings(
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    puts=st.lists(st.tuples(st.sampled_from([b"", b"a", b"ab", b"\xff"]), st.integers(0, 200))),
    cutoffs=st.lists(st.integers(0, 300), max_size=5),
)
def test_expiry_through_the_index_matches_a_model(
    store_factory: StoreFactory, puts: list[tuple[bytes, int]], cutoffs: list[int]
) -> None:
    store = store_factory.fresh()
    model: set[tuple[bytes, int]] = set()
    for key, start in puts:
        store.write(
            {
                layout.data_key(key, start): b"v",
                layout.index_key(start, length_prefixed(key)): b"",
            },
            None,
        )
        model.add((key, start))
    for cutoff in cutoffs:
        expired = {(k, s) for k, s in model if s < cutoff}
        assert _expire(store, cutoff) == len(expired)
        model -= expired
        for key in {k for k, _ in puts}:
            scanned = store.items(*layout.data_range(key, 0, MAX_UINT64))
            assert [layout.split_data_key(k).time_ms for k, _ in scanned] == sorted(
                s for k, s in model if k == key
            )
    store.close()
