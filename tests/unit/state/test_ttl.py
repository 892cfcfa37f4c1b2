"""TTL tables: the expiry core against a brute-force model, and TTL tables through the
in-memory test driver (reads, purging tombstones, the rebuilt index, the stored clock).

Property tests use Hypothesis; on failure it prints the falsifying example and a
``@reproduce_failure`` blob.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.errors import ConfigurationError, StoreError, TableAccessError
from streamjoin.runtime.metrics import samples
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.ttl import STREAM_TIME_KEY, Expiry, stamp, write_time_of
from streamjoin.state.windows import TumblingWindows
from streamjoin.testing.driver import TestDriver
from streamjoin.ttl_tables import TtlTable

TTL = 100
KEYS = [b"a", b"b", b"c", b"d", b"e"]


# ------------------------------------------------------------------ the core, modelled


@dataclass
class Model:
    """The definition, brute force: a key is visible iff it was written and not deleted,
    and stream time is less than ``ttl`` past its last write."""

    stream_time: int | None = None
    written: dict[bytes, int] = field(default_factory=dict)

    def observe(self, ts: int) -> int:
        if self.stream_time is None or ts > self.stream_time:
            self.stream_time = ts
        return self.stream_time

    def visible(self) -> set[bytes]:
        now = self.stream_time
        return {k for k, t in self.written.items() if now is None or t + TTL > now}


@dataclass
class Partition:
    """The core used as TtlTable uses it: a dict standing for the store."""

    expiry: Expiry = field(default_factory=lambda: Expiry(TTL))
    store: dict[bytes, bytes] = field(default_factory=dict)

    def visible(self) -> set[bytes]:
        return {
            k
            for k, v in self.store.items()
            if k != STREAM_TIME_KEY and not self.expiry.is_expired(write_time_of(v))
        }

    def flush(self, limit: int) -> list[bytes]:
        due = self.expiry.take_due(limit)
        for key in due:
            del self.store[key]
        clock = self.expiry.take_stream_time()
        if clock is not None:
            self.store[STREAM_TIME_KEY] = clock
        return due


#: times on a coarse grid, so that ``write time + TTL == stream time`` (the boundary) is common
times = st.integers(0, 40).map(lambda n: n * 25)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from(KEYS), times),
        st.tuples(st.just("delete"), st.sampled_from(KEYS), st.just(0)),
        st.tuples(st.just("advance"), st.just(b""), times),
        st.tuples(st.just("flush"), st.just(b""), st.integers(0, 3)),
        st.tuples(st.just("restart"), st.just(b""), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(operations)
def test_visible_keys_equal_the_model(ops: list[tuple[str, bytes, int]]) -> None:
    model, part = Model(), Partition()
    for op, key, n in ops:
        if op == "write":
            now = model.observe(n)
            assert part.expiry.observe(n) == now
            model.written[key] = now
            part.store[key] = stamp(now, b"v")
            part.expiry.written(key, now)
        elif op == "delete":
            model.written.pop(key, None)
            part.store.pop(key, None)
            part.expiry.deleted(key)
        elif op == "advance":
            model.observe(n)
            part.expiry.observe(n)
        elif op == "flush":
            visible_before = model.visible()
            purged = part.flush(limit=n)
            assert len(purged) <= n
            assert not set(purged) & visible_before, "a live key was purged"
            for key in purged:
                model.written.pop(key, None)  # (expired: invisible either way)
        else:  # a restart: what the last flush stored is all a restore gets back
            part.flush(limit=10**9)
            model.written = {k: t for k, t in model.written.items() if k in model.visible()}
            part.expiry = Expiry.rebuild(TTL, part.store.items())
            assert part.expiry.stream_time == model.stream_time
            assert set(part.store) - {STREAM_TIME_KEY} == model.visible()
        assert part.visible() == model.visible()
    part.flush(limit=10**9)
    assert set(part.store) - {STREAM_TIME_KEY} == model.visible(), "a full purge leaves the live"


def test_purging_pops_only_expired_keys_oldest_first() -> None:
    expiry = Expiry(10)
    for key, time in [(b"x", 5), (b"y", 1), (b"z", 30)]:
        expiry.observe(time)
        expiry.written(key, time)
    expiry.written(b"y", 25)  # rewritten: its old heap entry is stale
    expiry.observe(34)  # x: 5 + 10 <= 34; y: 25 + 10 > 34
    assert expiry.take_due() == [b"x"]
    expiry.observe(40)
    assert expiry.take_due(limit=1) == [b"y"]
    assert expiry.take_due() == [b"z"]
    assert expiry.live_keys() == 0


def test_rewrites_do_not_grow_the_index_without_bound() -> None:
    expiry = Expiry(10)
    for time in range(10_000):
        expiry.written(b"k", time)
    assert len(expiry._heap) <= 2 * expiry.live_keys() + 1025


def test_a_value_without_a_write_time_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match="8-byte write time"):
        write_time_of(b"abc")


# ------------------------------------------------------------------ TTL tables, driven


def ttl_app(ttl_ms: int = 1_000) -> streamjoin.App:
    app = streamjoin.App("ttl-unit")
    seen = app.topic("seen", key_serializer="str", value_serializer="json", partitions=2)
    last = app.table("last", key_serializer="str", copartitioned_with=seen, ttl_ms=ttl_ms)
    probes = app.topic("probes", key_serializer="str", value_serializer="json")

    @app.agent(seen, name="remember")
    async def remember(stream: Stream) -> None:
        async for event in stream:
            if event.value == "forget":
                del last[event.key]
            elif event.value != "tick":
                last[event.key] = event.value
            await probes.send(key=event.key, value=[last.get(event.key), event.key in last])

    return app


def changelog_pairs(driver: TestDriver) -> list[tuple[bytes, bytes | None]]:
    return [(r.key, r.value) for r in driver.raw_records("ttl-unit-last-changelog")]


async def test_keys_expire_by_stream_time_and_leave_tombstones() -> None:
    app = ttl_app()
    async with TestDriver(app) as driver:
        await driver.put("seen", key="ann", value="a1", partition=0, timestamp_ms=1_000)
        await driver.put("seen", key="bob", value="b1", partition=0, timestamp_ms=1_500)
        await driver.drain()
        # stream time 2_000 on partition 0: ann (written at 1_000) is gone at once
        await driver.put("seen", key="ann", value="tick", partition=0, timestamp_ms=2_000)
        await driver.drain()
        assert [e.value for e in driver.records("probes") if e.key == "ann"] == [
            ["a1", True],
            [None, False],
        ]
        table = app.tables["last"]
        assert dict(table.local_items(0)) == {"bob": "b1"}
        # the flush purged it: a tombstone, and the stored clock
        pairs = changelog_pairs(driver)
        assert (b"ann", None) in pairs
        assert (STREAM_TIME_KEY, stamp(2_000, b"")) in pairs
        expired = table.link.ttl_expired
        assert expired == {"last": 1}
        assert samples({"ttl_expired": expired})["streamjoin_table_expired_keys"] == [
            (("last",), 1.0)
        ]
        # a write keeps a key alive; an out-of-order event does not move stream time back
        await driver.put("seen", key="bob", value="b2", partition=0, timestamp_ms=2_400)
        await driver.put("seen", key="bob", value="tick", partition=0, timestamp_ms=100)
        await driver.drain()
        assert dict(table.local_items(0)) == {"bob": "b2"}


async def test_partitions_keep_their_own_stream_time() -> None:
    app = ttl_app()
    async with TestDriver(app) as driver:
        await driver.put("seen", key="ann", value="a", partition=0, timestamp_ms=0)
        await driver.put("seen", key="cid", value="c", partition=1, timestamp_ms=0)
        await driver.put("seen", key="ann", value="tick", partition=0, timestamp_ms=5_000)
        await driver.drain()
        table = app.tables["last"]
        assert dict(table.local_items(0)) == {}
        assert dict(table.local_items(1)) == {"cid": "c"}


async def test_a_reassigned_partition_rebuilds_its_index_and_clock() -> None:
    app = ttl_app()
    async with TestDriver(app) as driver:
        await driver.put("seen", key="ann", value="a", partition=0, timestamp_ms=1_000)
        await driver.put("seen", key="bob", value="b", partition=0, timestamp_ms=1_600)
        await driver.drain()
        await driver.revoke([("seen", 0)])
        await driver.assign([("seen", 0)])  # a new partition state over the flushed store
        table = app.tables["last"]
        state = table.active_partition(0)
        assert state.ttl is None
        expiry = table.expiry_of(state)  # type: ignore[attr-defined]
        assert expiry.stream_time == 1_600 and expiry.live_keys() == 2
        await driver.put("seen", key="cid", value="tick", partition=0, timestamp_ms=2_100)
        await driver.drain()
        assert dict(table.local_items(0)) == {"bob": "b"}
        assert (b"ann", None) in changelog_pairs(driver)


async def test_deleting_an_expired_key_is_a_key_error_and_reads_give_the_default() -> None:
    app = streamjoin.App("ttl-unit")
    seen = app.topic("seen", key_serializer="str", value_serializer="json", partitions=1)
    counts = app.table("n", default=int, key_serializer="str", copartitioned_with=seen, ttl_ms=10)
    errors: list[str] = []

    @app.agent(seen, name="count")
    async def count(stream: Stream) -> None:
        async for event in stream:
            if event.value == "drop":
                try:
                    del counts[event.key]
                except KeyError:
                    errors.append(event.key)
            else:
                counts[event.key] += 1

    async with TestDriver(app) as driver:
        for ts in (0, 5, 9):
            await driver.put("seen", key="k", value="+", timestamp_ms=ts)
        await driver.put("seen", key="k", value="+", timestamp_ms=19)  # 9 + 10 <= 19: reset
        await driver.put("seen", key="j", value="+", timestamp_ms=19)
        await driver.put("seen", key="j", value="drop", timestamp_ms=40)
        await driver.drain()
        assert errors == ["j"]
        assert dict(counts.local_items(0)) == {}


async def test_the_query_read_of_a_store_honours_expiry() -> None:
    app = ttl_app()
    async with TestDriver(app) as driver:
        await driver.put("seen", key="ann", value="a", partition=0, timestamp_ms=0)
        await driver.put("seen", key="bob", value="b", partition=0, timestamp_ms=900)
        await driver.drain()
        table = app.tables["last"]
        assert isinstance(table, TtlTable)
        store = table.active_partition(0).store
        assert store.get(b"ann") is not None  # stored, written at stream time 0
        assert table.stored_value(store, b"bob") == b'"b"'
        # the stored clock says 900: both live; a store whose clock says 1_000 hides ann
        store.write({STREAM_TIME_KEY: stamp(1_000, b"")}, None)
        assert table.stored_value(store, b"ann") is None
        assert table.stored_value(store, b"bob") == b'"b"'
        assert table.stored_value(store, STREAM_TIME_KEY) is None


def test_bad_ttl_declarations_are_configuration_errors() -> None:
    app = streamjoin.App("ttl-unit")
    with pytest.raises(ConfigurationError, match="ttl_ms must be > 0"):
        app.table("a", ttl_ms=0)
    with pytest.raises(ConfigurationError, match="ttl_ms must be an int"):
        app.table("b", ttl_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ttl_ms does not apply to windowed tables"):
        app.table("c", ttl_ms=1_000, window=TumblingWindows(size_ms=1_000))
    assert not app.tables


async def test_empty_keys_are_refused() -> None:
    app = streamjoin.App("ttl-unit")
    seen = app.topic("seen", key_serializer="raw", value_serializer="json", partitions=1)
    last = app.table("last", key_serializer="raw", copartitioned_with=seen, ttl_ms=10)
    failures: list[BaseException] = []

    @app.agent(seen, name="remember")
    async def remember(stream: Stream) -> None:
        async for event in stream:
            try:
                last[event.key] = 1
            except TableAccessError as exc:
                failures.append(exc)

    async with TestDriver(app) as driver:
        await driver.put_raw("seen", b"", b"1")
        await driver.drain()
    assert failures and "empty bytes" in str(failures[0])
