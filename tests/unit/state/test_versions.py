"""Versioned tables' core (:mod:`streamjoin.state.versions`) against a brute-force model.

Random writes and deletes at random timestamps (out of order included) go through the
core over a real :class:`TablePartition`, with flushes, purges and restores from the
replayed changelog in between; every as-of query inside the history must equal the
model's answer (the latest write at or before it), and purging must bound what is kept.
Property tests use Hypothesis; on failure it prints the falsifying example.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamjoin.errors import ConfigurationError, HistoryExpired, StoreError
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.versions import (
    DELETED,
    STREAM_TIME_KEY,
    History,
    check_as_of,
    check_history_ms,
    decode_version,
    encode_version,
    key_of,
    purge,
    read_as_of,
    read_latest,
    timestamp_of,
    version_group,
    version_key,
    version_range,
    write_version,
)

KEYS = [b"", b"a", b"ab", b"b\xff", b"a-longer-key"]  # b"", a prefix pair, one > 8 bytes


@dataclass
class Model:
    """Every write ever made, and what a versioned table must answer from them."""

    history_ms: int
    writes: list[tuple[bytes, int, int, bytes | None]] = field(default_factory=list)

    def write(self, key: bytes, timestamp: int, value: bytes | None) -> bool:
        horizon = self.horizon
        if horizon is not None and timestamp < horizon:
            return False  # older than the history: dropped
        self.writes.append((key, timestamp, len(self.writes), value))
        return True

    @property
    def horizon(self) -> int | None:
        if not self.writes:
            return None
        return max(ts for _, ts, _, _ in self.writes) - self.history_ms

    def as_of(self, key: bytes, timestamp: int) -> bytes | None:
        mine = [w for w in self.writes if w[0] == key and w[1] <= timestamp]
        return max(mine, key=lambda w: (w[1], w[2]))[3] if mine else None

    def latest(self, key: bytes) -> bytes | None:
        return self.as_of(key, 1 << 62)


class Partition:
    """A versioned partition whose flushed writes form its changelog (restores replay it)."""

    def __init__(self, history_ms: int, grouped: bool = True) -> None:
        self.history_ms = history_ms
        self.grouped = grouped
        self.changelog: list[tuple[bytes, bytes | None]] = []
        self.state = self.partition(MemoryStorePartition(table="t"))
        self.history = History(history_ms)

    def partition(self, store: MemoryStorePartition) -> TablePartition:
        """A partition over ``store``, its buffered writes indexed per key as the table's
        are (or not: scans must agree either way)."""
        state = TablePartition("t", 0, store)
        if self.grouped:
            state.group_keys_by(version_group)
        return state

    def flush(self) -> None:
        purge(self.state, self.history)
        writes = self.state.take_pending()
        self.changelog.extend(writes.items())
        self.state.finish_flush(len(self.changelog) or None)

    def restore(self) -> None:
        """A new worker: the store rebuilt from the changelog, the index from the store."""
        self.flush()
        store = MemoryStorePartition(table="t")
        compacted: dict[bytes, bytes | None] = {}
        for key, value in self.changelog:  # (compaction keeps the last record per key)
            compacted[key] = value
        store.write(compacted, len(self.changelog) or None)
        self.state = self.partition(store)
        self.history = History.rebuild(self.history_ms, self.state.scan(b"", None))


writes = st.tuples(
    st.just("write"),
    st.sampled_from(KEYS),
    st.integers(0, 40),
    st.one_of(st.none(), st.binary(max_size=2)),
)
operations = st.lists(
    st.one_of(writes, writes, writes, st.tuples(st.sampled_from(["flush", "purge", "restore"]))),
    max_size=60,
)
#: a version whose successor is one ms past the horizon: still needed (a purge one ms
#: early loses it)
EDGE = [("write", b"a", 5, b"x"), ("write", b"a", 10, b"y"), ("write", b"b", 11, b"z"), ("flush",)]


#: a delete rewritten with a value at the same time, then superseded one ms past the
#: horizon: the delete's purge entry must not take the value (found by this test)
DELETED_THEN_REWRITTEN = [
    ("write", b"", 0, None),
    ("write", b"", 0, b""),
    ("write", b"", 1, None),
    ("flush",),
]


def check_answers(part: Partition, model: Model) -> None:
    horizon = model.horizon
    assert part.history.horizon == horizon
    newest = 0 if horizon is None else horizon + model.history_ms
    for key in KEYS:
        assert read_latest(part.state, key) == model.latest(key)
        for ts in range(max(horizon or 0, 0), newest + 2):
            assert read_as_of(part.state, key, ts) == model.as_of(key, ts), (key, ts)


@settings(max_examples=400, deadline=None)
@given(history_ms=st.integers(0, 15), ops=operations, grouped=st.booleans())
@example(history_ms=2, ops=EDGE, grouped=True)
@example(history_ms=1, ops=DELETED_THEN_REWRITTEN, grouped=False)
def test_as_of_answers_equal_the_model_through_purges_and_restores(
    history_ms: int, ops: list[tuple], grouped: bool
) -> None:
    part, model = Partition(history_ms, grouped), Model(history_ms)
    for op in ops:
        if op[0] == "write":
            _, key, ts, value = op
            stored = write_version(part.state, part.history, key, value, ts)
            assert stored == model.write(key, ts, value)
        elif op[0] == "flush":
            part.flush()
        elif op[0] == "purge":
            purge(part.state, part.history)
        else:
            part.restore()
        check_answers(part, model)


@settings(max_examples=200, deadline=None)
@given(history_ms=st.integers(0, 15), ops=operations)
def test_purging_keeps_only_versions_valid_inside_the_history(
    history_ms: int, ops: list[tuple]
) -> None:
    part, model = Partition(history_ms), Model(history_ms)
    for op in ops:
        if op[0] == "write":
            _, key, ts, value = op
            stored = write_version(part.state, part.history, key, value, ts)
            assert stored == model.write(key, ts, value)
    part.flush()
    part.flush()  # (a delete waits for the versions it ended: at most one more pass)
    horizon = model.horizon
    for key in KEYS:
        stored = list(part.state.scan(*version_range(key)))
        times = [timestamp_of(k) for k, _ in stored]
        assert times == sorted(set(times))
        for (_, value), successor in zip(stored, times[1:], strict=False):
            # a superseded version stays only while it was valid after the horizon
            assert horizon is not None and successor > horizon, (key, times, horizon)
            assert value != DELETED or times[0] != successor  # never a leading delete kept
        if stored and stored[0][1] == DELETED and horizon is not None:
            assert times[0] > horizon or len(stored) > 1
        if model.latest(key) is not None:
            assert decode_version(stored[-1][1]) == model.latest(key)
    assert part.state.lookup(STREAM_TIME_KEY) is not None or not model.writes


def test_the_layout_keeps_a_keys_versions_together_and_in_time_order() -> None:
    keys = sorted(version_key(k, t) for k in (b"a", b"ab", b"b") for t in (5, 300, 1 << 40))
    assert [key_of(k) for k in keys] == [b"a"] * 3 + [b"b"] * 3 + [b"ab"] * 3
    assert [timestamp_of(k) for k in keys[:3]] == [5, 300, 1 << 40]
    start, end = version_range(b"a")
    assert all(start <= k < end for k in keys[:3]) and not start <= keys[3] < end
    assert decode_version(encode_version(b"x")) == b"x"
    assert decode_version(encode_version(b"")) == b""
    assert decode_version(encode_version(None)) is None


def test_a_keys_group_holds_its_versions_and_the_scan_bounds_of_them() -> None:
    for key in (b"", b"a", b"ab\x00"):
        group = version_group(version_key(key, 7))
        start, end = version_range(key)
        assert group == version_group(start) == start and end.startswith(group)
        assert version_group(version_key(key + b"x", 7)) != group
    assert version_group(STREAM_TIME_KEY) is None


def test_a_non_versioned_store_is_refused_with_a_clear_error() -> None:
    with pytest.raises(StoreError, match="history_ms"):
        decode_version(b"plain json")
    with pytest.raises(StoreError, match="history_ms"):
        key_of(b"k")


def test_history_ms_is_validated() -> None:
    assert check_history_ms("t", 0) == 0
    for bad in (-1, True, 1.5, "10"):
        with pytest.raises(ConfigurationError, match="history_ms"):
            check_history_ms("t", bad)


def test_as_of_older_than_the_history_is_refused() -> None:
    check_as_of("t", 50, None)
    check_as_of("t", 50, 50)
    with pytest.raises(HistoryExpired, match="as_of=49 is older than the history kept"):
        check_as_of("t", 49, 50)
