"""Versioned tables through the test driver, and the stream-table join on them.

A stream record that arrives after a newer row of its key (out of order within its own
partition) must meet the row as of its timestamp: the same answer as the brute-force
as-of oracle and the Spark backfill's runner, where a plain topic table answers with the
row it holds when the record arrives (checked too, so these tests can fail).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

import streamjoin
from streamjoin.codecs import JSON, STR
from streamjoin.errors import ConfigurationError, HistoryExpired, SparkJobError
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.metrics import samples
from streamjoin.spark.runners import StreamTableRunner
from streamjoin.state.versions import decode_version, timestamp_of, version_range
from streamjoin.state.windows import TumblingWindows
from streamjoin.testing.driver import TestDriver
from streamjoin.versioned_tables import VersionedTable
from tests.unit.spark.table_histories import Rec, raw, runner_order, stream_table_oracle

PARTITIONS = 3
HISTORY_MS = 10_000


def enrich(key: str, click: Any, user: Any) -> dict[str, Any]:
    return {"click": click["n"], "user": user}


def canonical(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


def rows_in_order_clicks_late(seed: int, count: int = 300, keys: int = 6) -> list[Rec]:
    """Production order: ``users`` rows in timestamp order (a table's topic), ``clicks``
    jittered back by up to 400 ms (out of order within their partitions)."""
    rng = random.Random(seed)
    offsets: dict[tuple[str, int], int] = {}
    now, out = 1_700_000_000_000, []
    for i in range(count):
        now += rng.randint(0, 40)
        topic = "users" if rng.random() < 0.35 else "clicks"
        key = f"k{rng.randrange(keys)}"
        partition = partition_for_key(key.encode(), PARTITIONS)
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        if topic == "users":
            value = None if rng.random() < 0.15 else {"n": i, "v": rng.randrange(4)}
            ts = now
        else:
            value, ts = {"n": i}, now - rng.randint(0, 400)
        out.append(Rec(topic, key, value, ts, partition, offset))
    return out


def join_app(how: str, history_ms: int | None) -> streamjoin.App:
    app = streamjoin.App("versioned-join-unit")
    users = app.topic("users", key_serializer="str", partitions=PARTITIONS)
    clicks = app.topic("clicks", key_serializer="str", partitions=PARTITIONS)
    out = app.topic("enriched", key_serializer="str", partitions=PARTITIONS)
    table = app.topic_table(users, history_ms=history_ms)
    app.join(clicks, table, how=how, output=out)(enrich)
    return app


async def worker_outputs(records: list[Rec], how: str, history_ms: int | None) -> list[Any]:
    async with TestDriver(join_app(how, history_ms)) as driver:
        for rec in records:
            await driver.put(rec.topic, key=rec.key, value=rec.value, timestamp_ms=rec.timestamp_ms)
        await driver.drain()
        return [(e.key, e.value, e.timestamp) for e in driver.records("enriched")]


def spark_outputs(records: list[Rec], how: str) -> list[Any]:
    runner = StreamTableRunner(
        how,  # type: ignore[arg-type]
        enrich,
        STR,
        JSON,
        STR,
        JSON,
        STR,
        JSON,
        PARTITIONS,
    )
    sides = {"clicks": "left", "users": "right"}
    out = []
    for p in range(PARTITIONS):
        mine = runner_order([r for r in records if r.partition == p], runner.side_rank, sides)
        outputs = runner.run((sides[r.topic], r.key.encode(), raw(r), r.timestamp_ms) for r in mine)
        out += [(STR.loads(o.key), JSON.loads(o.value), o.timestamp_ms) for o in outputs]
    return out


def counted(items: list[Any]) -> Counter[str]:
    return Counter(canonical(list(item)) for item in items)


@pytest.mark.parametrize("how", ["inner", "left"])
async def test_a_versioned_join_equals_the_as_of_oracle_and_the_spark_runner(how: str) -> None:
    plain_differs = False
    for seed in range(4):
        records = rows_in_order_clicks_late(seed)
        want = counted(stream_table_oracle(records, "clicks", "users", how, enrich))
        assert counted(await worker_outputs(records, how, HISTORY_MS)) == want, seed
        assert counted(spark_outputs(records, how)) == want, seed
        plain = counted(await worker_outputs(records, how, None))
        plain_differs = plain_differs or plain != want
    assert plain_differs  # out-of-order clicks meet a newer row in a plain table


async def test_an_out_of_order_click_meets_the_row_of_its_time() -> None:
    records = [
        Rec("users", "a", {"n": 0, "v": 1}, 100, 0, 0),
        Rec("users", "a", {"n": 1, "v": 2}, 200, 0, 1),
        Rec("clicks", "a", {"n": 2}, 250, 0, 0),
        Rec("clicks", "a", {"n": 3}, 150, 0, 1),  # after the row of 200, but as of 150
        Rec("clicks", "a", {"n": 4}, 50, 0, 2),  # before any row: inner drops it
    ]
    versioned = await worker_outputs(records, "inner", HISTORY_MS)
    assert versioned == [
        ("a", {"click": 2, "user": {"n": 1, "v": 2}}, 250),
        ("a", {"click": 3, "user": {"n": 0, "v": 1}}, 150),
    ]
    plain = await worker_outputs(records, "inner", None)
    assert plain[1] == ("a", {"click": 3, "user": {"n": 1, "v": 2}}, 150)  # the newer row


async def test_late_writes_and_too_late_clicks_are_counted_and_exported() -> None:
    app = join_app("left", HISTORY_MS)
    (table,) = [t for t in app.tables.values() if isinstance(t, VersionedTable)]
    late = 1_000  # older than the history once a row of 1_000 + HISTORY_MS + 1 was written
    async with TestDriver(app) as driver:
        for topic, ts in [("users", 1_000), ("users", late + HISTORY_MS + 1), ("users", late)]:
            await driver.put(topic, key="a", value={"v": ts}, timestamp_ms=ts)
        for ts in (late, late + HISTORY_MS + 1, late):
            await driver.put("clicks", key="a", value={"n": ts}, timestamp_ms=ts)
        await driver.drain()
        assert [e.timestamp for e in driver.records("enriched")] == [late + HISTORY_MS + 1]
        assert (table.late_writes, table.too_late) == (1, 2)
        link = app.runtime_link
        exported = samples({"late_writes": link.late_writes, "too_late": link.too_late})
        assert exported["streamjoin_table_late_writes"] == [((table.name,), 1.0)]
        assert exported["streamjoin_table_too_late_lookups"] == [((table.name,), 2.0)]


def versioned_app(history_ms: int) -> tuple[streamjoin.App, VersionedTable, list[Any]]:
    """An agent writing ``{"key", "value"}`` events (value None deletes) into a versioned
    table and recording what ``get`` answers for ``{"read", "as_of"}`` events."""
    app = streamjoin.App("versioned-table-unit")
    events = app.topic("events", key_serializer="str", partitions=1)
    table = app.table("prices", copartitioned_with=events, history_ms=history_ms)
    assert isinstance(table, VersionedTable)
    answers: list[Any] = []

    @app.agent(events)
    async def apply(stream: Any) -> None:
        async for event in stream:
            v = event.value
            if "read" in v:
                try:
                    answers.append(table.get(v["read"], as_of=v.get("as_of")))
                except HistoryExpired as exc:
                    answers.append(type(exc).__name__)
            elif v["value"] is None:
                table.delete(v["key"])
            else:
                table[v["key"]] = v["value"]

    return app, table, answers


async def test_get_as_of_reads_history_deletes_and_refuses_what_is_too_old() -> None:
    app, table, answers = versioned_app(history_ms=200)
    async with TestDriver(app) as driver:

        async def put(ts: int, **value: Any) -> None:
            await driver.put("events", key="x", value=value, timestamp_ms=ts)

        await put(1000, key="p", value=1)
        await put(1100, key="p", value=2)
        await put(1050, key="p", value=9)  # out of order: a past version
        await put(1200, key="p", value=None)  # deleted from 1200
        await put(999, key="q", value=5)  # older than the history (1200 - 200): dropped
        await put(1200, read="p", as_of=1099)
        await put(1200, read="p", as_of=1150)
        await put(1200, read="p", as_of=1200)
        await put(1200, read="p")
        await put(1200, read="p", as_of=999)
        await put(1200, read="q")
        await driver.drain()
        assert answers == [9, 2, None, None, "HistoryExpired", None]
        assert table.late_writes == 1
        await put(1300, key="p", value=3)
        await driver.drain()  # a flush purges what fell out of the history
        tables = app.runtime_link.tables
        assert tables is not None
        state = tables.active_partition("prices", 0)
        assert state is not None
        # horizon 1100: 1000 and 1050 were superseded by then; 1100 was valid at 1100
        assert _versions(table, state) == [(1100, b"2"), (1200, None), (1300, b"3")]


def _versions(table: VersionedTable, state: Any) -> list[tuple[int, Any]]:
    return [
        (timestamp_of(k), decode_version(v))
        for k, v in state.scan(*version_range(table.key_codec.dumps("p")))
    ]


def test_history_ms_refuses_bad_values_and_combinations() -> None:
    app = streamjoin.App("versioned-config")
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigurationError, match="history_ms"):
            app.table(f"t{bad!r}", history_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="does not combine with window="):
        app.table("w", history_ms=10, window=TumblingWindows(size_ms=1000))
    with pytest.raises(ConfigurationError, match="does not combine with ttl_ms="):
        app.table("ttl", history_ms=10, ttl_ms=10)
    assert isinstance(app.table("ok", history_ms=0), VersionedTable)
    assert isinstance(app.topic_table("src", history_ms=5), VersionedTable)
    assert not isinstance(app.topic_table("plain"), VersionedTable)


def test_the_spark_bootstrap_refuses_a_versioned_table() -> None:
    """Bootstrap writes the latest value per key: it would lose a versioned table's history
    (and its store layout), so it says so instead."""
    from streamjoin.spark.bootstrap_job import bootstrap
    from streamjoin.spark.sources import FileSource

    app = streamjoin.App("versioned-boot")
    app.topic_table(app.topic("users", partitions=1), history_ms=1000)
    with pytest.raises(SparkJobError, match="versioned table"):
        bootstrap(app, "users-table", source=FileSource(["nowhere.json"]))
