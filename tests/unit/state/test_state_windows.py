"""Window arithmetic and the windowed store (both backends): fetch order, expiry vs a model.

Hypothesis prints the falsifying example and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from state_store_support import StoreFactory

from streamjoin.state import windows as windows_module
from streamjoin.state.base import StorePartition
from streamjoin.state.keys import MAX_UINT64, WINDOW_EXPIRY_PREFIX
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.windows import (
    HoppingWindows,
    TumblingWindows,
    WindowedStore,
    WindowError,
)

# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("ts", "expected"),
    [(0, [(0, 10)]), (9, [(0, 10)]), (10, [(10, 20)]), (12345, [(12340, 12350)])],
)
def test_tumbling_windows(ts: int, expected: list[tuple[int, int]]) -> None:
    assert TumblingWindows(size_ms=10, retention_ms=10).windows_for(ts) == expected


@pytest.mark.parametrize(
    ("size", "step", "ts", "expected"),
    [
        (10, 5, 0, [(0, 10)]),  # near the epoch: no negative starts
        (10, 5, 4, [(0, 10)]),
        (10, 5, 5, [(0, 10), (5, 15)]),
        (10, 5, 9, [(0, 10), (5, 15)]),
        (10, 5, 10, [(5, 15), (10, 20)]),
        (10, 3, 9, [(0, 10), (3, 13), (6, 16), (9, 19)]),  # size not a multiple of step
        (10, 3, 10, [(3, 13), (6, 16), (9, 19)]),
        (10, 10, 10, [(10, 20)]),  # step == size: tumbling
    ],
)
def test_hopping_windows(size: int, step: int, ts: int, expected: list[tuple[int, int]]) -> None:
    assert HoppingWindows(size_ms=size, step_ms=step, retention_ms=size).windows_for(ts) == expected


@given(st.integers(1, 40), st.data(), st.integers(0, 500))
def test_hopping_windows_are_exactly_the_covering_aligned_windows(
    size: int, data: st.DataObject, ts: int
) -> None:
    step = data.draw(st.integers(1, size))
    expected = [(s, s + size) for s in range(0, ts + 1, step) if s <= ts < s + size]
    assert HoppingWindows(size, step, size).windows_for(ts) == expected


@pytest.mark.parametrize("ts", [-1, True, 1.5])
def test_bad_timestamps_are_rejected(ts: Any) -> None:
    with pytest.raises(WindowError):
        TumblingWindows(10, 10).windows_for(ts)
    with pytest.raises(WindowError):
        HoppingWindows(10, 5, 10).windows_for(ts)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TumblingWindows(0, 10),
        lambda: TumblingWindows(10, 9),
        lambda: TumblingWindows(10, 0),
        lambda: HoppingWindows(10, 0, 10),
        lambda: HoppingWindows(10, 11, 20),
        lambda: HoppingWindows(10, 5, 9),
        lambda: HoppingWindows(-10, 5, 10),
        lambda: HoppingWindows(True, 1, 10),
    ],
)
def test_invalid_window_definitions_are_rejected(make: Any) -> None:
    with pytest.raises(WindowError):
        make()


def test_expiry_boundary_keeps_while_stream_time_is_below_end_plus_retention() -> None:
    for windows in (TumblingWindows(10, 15), HoppingWindows(10, 5, 15)):
        assert not windows.expired(window_end_ms=10, stream_time_ms=24)
        assert windows.expired(window_end_ms=10, stream_time_ms=25)
        assert windows.expired(window_end_ms=10, stream_time_ms=1000)


# ------------------------------------------------------------------ windowed store


@pytest.fixture
def wstore(store: StorePartition) -> WindowedStore:
    return WindowedStore(store, HoppingWindows(size_ms=10, step_ms=5, retention_ms=20))


def test_put_get_delete(wstore: WindowedStore) -> None:
    wstore.put(b"k", 5, b"v5", changelog_offset=3)
    assert wstore.get(b"k", 5) == b"v5"
    assert wstore.get(b"k", 10) is None
    assert wstore.store.changelog_offset() == 3
    wstore.delete(b"k", 5, changelog_offset=4)
    assert wstore.get(b"k", 5) is None
    assert list(wstore.store.items()) == []  # the expiry index entry went too
    assert wstore.store.changelog_offset() == 4


def test_fetch_returns_one_keys_windows_in_start_order_with_inclusive_bounds(
    wstore: WindowedStore,
) -> None:
    for key in (b"a", b"ab", b"a\xff", b"", b"b"):
        for start in (40, 0, 2**40, 10, 5):
            wstore.put(key, start, key + b"@" + str(start).encode())
    assert wstore.fetch(b"a", 0, MAX_UINT64) == [
        (s, b"a@" + str(s).encode()) for s in (0, 5, 10, 40, 2**40)
    ]
    assert [s for s, _ in wstore.fetch(b"a", 5, 40)] == [5, 10, 40]
    assert [s for s, _ in wstore.fetch(b"a", 6, 39)] == [10]
    assert [s for s, _ in wstore.fetch(b"", 0, 10)] == [0, 5, 10]
    assert wstore.fetch(b"a", 40, 5) == []
    assert wstore.fetch(b"zz", 0, MAX_UINT64) == []


def test_put_many_is_one_atomic_write(wstore: WindowedStore) -> None:
    wstore.put(b"k", 0, b"old")
    wstore.put_many([(b"k", 0, None), (b"k", 5, b"a"), (b"j", 5, b"b")], changelog_offset=9)
    assert wstore.fetch(b"k", 0, 100) == [(5, b"a")]
    assert wstore.get(b"j", 5) == b"b"
    assert wstore.store.changelog_offset() == 9


def test_expire_removes_exactly_the_expired_windows(wstore: WindowedStore) -> None:
    # size 10, retention 20: window [s, s+10) expires at stream time s + 30
    for start in (0, 5, 10, 15):
        wstore.put(b"k", start, b"x")
        wstore.put(b"other", start, b"y")
    assert wstore.expire(29) == 0
    assert wstore.expire(35) == 4  # starts 0 and 5, both keys
    assert [s for s, _ in wstore.fetch(b"k", 0, 100)] == [10, 15]
    assert wstore.expire(35, changelog_offset=7) == 0
    assert wstore.store.changelog_offset() == 7  # the offset is stored even if nothing expired
    assert wstore.expire(10**6) == 4
    assert list(wstore.store.items()) == []


def test_expire_reads_only_the_expired_index_entries() -> None:
    class CountingStore(MemoryStorePartition):
        rows_read = 0

        def items(
            self, start: bytes | None = None, end: bytes | None = None
        ) -> Iterator[tuple[bytes, bytes]]:
            assert start is not None and start.startswith(WINDOW_EXPIRY_PREFIX)
            for row in super().items(start, end):
                CountingStore.rows_read += 1
                yield row

    store = CountingStore()
    wstore = WindowedStore(store, TumblingWindows(size_ms=10, retention_ms=10))
    wstore.put_many((b"k%d" % k, start, b"v") for k in range(20) for start in range(0, 1000, 10))
    assert wstore.expire(stream_time_ms=100) == 20 * 9  # starts 0..80 expired (end + 10 <= 100)
    assert CountingStore.rows_read == 20 * 9


def test_expire_in_chunks_stores_the_offset_with_the_last_chunk(
    wstore: WindowedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(windows_module, "EXPIRE_BATCH", 3)
    offsets: list[int | None] = []
    real_write = wstore.store.write

    def recording_write(writes: Mapping[bytes, bytes | None], offset: int | None) -> None:
        offsets.append(offset)
        real_write(writes, offset)

    monkeypatch.setattr(wstore.store, "write", recording_write)
    wstore.put_many((b"k", s, b"v") for s in range(0, 45, 5))  # 9 windows
    offsets.clear()
    assert wstore.expire(10**6, changelog_offset=5) == 9
    assert offsets == [None, None, None, 5]  # 3 full chunks, then an empty scan + the offset
    assert list(wstore.store.items()) == []


@settings(
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    size=st.integers(1, 20),
    extra_retention=st.integers(0, 20),
    puts=st.lists(st.tuples(st.sampled_from([b"", b"a", b"ab", b"\xff"]), st.integers(0, 200))),
    stream_times=st.lists(st.integers(0, 300), max_size=5),
)
def test_expiry_matches_a_model(
    store_factory: StoreFactory,
    size: int,
    extra_retention: int,
    puts: list[tuple[bytes, int]],
    stream_times: list[int],
) -> None:
    windows = TumblingWindows(size_ms=size, retention_ms=size + extra_retention)
    wstore = WindowedStore(store_factory.fresh(), windows)
    model: set[tuple[bytes, int]] = set()
    for key, start in puts:
        wstore.put(key, start, b"v")
        model.add((key, start))
    for now in stream_times:
        expired = {(k, s) for k, s in model if windows.expired(s + size, now)}
        assert wstore.expire(now) == len(expired)
        model -= expired
        for key in {k for k, _ in puts}:
            assert [s for s, _ in wstore.fetch(key, 0, MAX_UINT64)] == sorted(
                s for k, s in model if k == key
            )
    wstore.store.close()
