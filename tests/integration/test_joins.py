"""Joins on the real broker: three workers, one killed mid-stream; co-partitioning errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

import streamjoin
from examples.ad_traffic import generate
from streamjoin.errors import CopartitioningError
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.transport.topic_admin import (
    TopicSpec,
    ensure_topics,
    fetch_partition_counts,
)
from tests.integration.support import (
    Workers,
    committed_offsets,
    produce,
    produce_traffic,
    read_all,
    sizes,
    wait_for_group,
)

PARTITIONS = 6


async def wait_all_committed(bootstrap: str, env: dict[str, str], totals: dict[str, int]) -> None:
    for _ in range(240):
        done = True
        for topic, total in totals.items():
            committed = await committed_offsets(bootstrap, env["SJT_APP_ID"], topic, PARTITIONS)
            done &= sum(committed) >= total
        if done:
            return
        await asyncio.sleep(0.5)
    raise AssertionError("inputs were never fully committed")


async def test_three_workers_one_killed_every_join_appears(
    kafka_bootstrap: str, joiners: Workers
) -> None:
    env = joiners.env
    group = env["SJT_APP_ID"]
    traffic = generate(3000, seed=11)
    for name in ("w1", "w2", "w3"):
        joiners.start(name, static=False)
    await wait_for_group(
        kafka_bootstrap, group, lambda i: sizes(i, env["SJT_IMPRESSIONS"]) == [2, 2, 2], joiners
    )
    half = len(traffic.records) // 2
    await produce_traffic(kafka_bootstrap, env, traffic.records[:half], linger_ms=5)
    # w3 dies mid-traffic: once half the joins the first half can make are out. (Clicks
    # trail their impressions, so the first half makes 205 of the 1,057 joins: a quarter
    # of all of them never came, and read_all waited its whole minute for it.)
    clicks_sent = {r.value["click_id"] for r in traffic.records[:half] if r.topic == "clicks"}
    joinable = sum(1 for join in traffic.expected_joins if join[2] in clicks_sent)
    assert joinable >= 100, joinable
    await read_all(kafka_bootstrap, env["SJT_OUTPUT"], joinable // 2)
    joiners.stop("w3", signal.SIGKILL)
    await produce_traffic(kafka_bootstrap, env, traffic.records[half:], linger_ms=5)
    await wait_for_group(
        kafka_bootstrap,
        group,
        lambda i: sizes(i, env["SJT_IMPRESSIONS"]) == [3, 3],
        joiners,
        timeout=90,
    )
    await wait_all_committed(
        kafka_bootstrap,
        env,
        {env["SJT_IMPRESSIONS"]: traffic.impressions, env["SJT_CLICKS"]: traffic.clicks},
    )
    out = await read_all(kafka_bootstrap, env["SJT_OUTPUT"], len(traffic.expected_joins))
    got = Counter(
        (v["auction_id"], v["impression_id"], v["click_id"])
        for v in (json.loads(value) for _, value, _ in out)
    )
    assert set(got) == traffic.expected_joins  # every expected join, nothing else
    duplicates = sum(n - 1 for n in got.values())
    # at-least-once: only events after w3's last commit are replayed; with a 0.3 s commit
    # interval that is a small fraction of the traffic
    assert duplicates <= len(traffic.expected_joins) // 3, duplicates


async def test_mismatched_partitions_fail_at_startup_and_group_by_fixes_it(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    orders_name, payments_name = unique_topic("orders"), unique_topic("payments")
    await ensure_topics(kafka_bootstrap, [TopicSpec(orders_name, 4), TopicSpec(payments_name, 6)])

    def make_app(repartition: bool) -> tuple[streamjoin.App, list[str]]:
        app = streamjoin.App(
            unique_topic("app"), broker=f"kafka://{kafka_bootstrap}", state_dir=tmp_path
        )
        orders = app.topic(orders_name, key_serializer="str")
        payments = app.topic(payments_name, key_serializer="str")
        right = (
            app.group_by(payments, lambda e: e.value["order"], name="by-order", partitions=4)
            if repartition
            else payments
        )
        matched: list[str] = []

        @app.join(orders, right, window=60_000, name="pay")
        def pay(key: str, order: object, payment: object) -> None:
            matched.append(key)

        return app, matched

    app, _ = make_app(repartition=False)
    with pytest.raises(CopartitioningError, match=r"4 partitions.*6 partitions.*group_by"):
        await app.start()
    assert not app.running

    app, matched = make_app(repartition=True)
    async with app:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        await producer.send_and_wait(orders_name, b'{"amount": 5}', key=b"o-1", timestamp_ms=1000)
        await producer.send_and_wait(
            payments_name, b'{"order": "o-1"}', key=b"pay-1", timestamp_ms=2000
        )
        await producer.stop()
        for _ in range(100):
            if matched:
                break
            await asyncio.sleep(0.1)
    assert matched == ["o-1"]


@pytest.mark.parametrize("idle_ms", [0, 10_000])
async def test_align_idle_ms_waits_for_a_side_written_late(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, idle_ms: int
) -> None:
    """A click written before its impression, whose timestamp is earlier than the clicks
    already read: late without ``align_idle_ms`` (the clicks went ahead as soon as the
    impressions looked caught up), joined with it (they waited for the impression)."""
    left_name, right_name = unique_topic("imp"), unique_topic("clk")
    await ensure_topics(kafka_bootstrap, [TopicSpec(left_name, 1), TopicSpec(right_name, 1)])
    app = streamjoin.App(
        unique_topic("app"),
        broker=f"kafka://{kafka_bootstrap}",
        state_dir=tmp_path,
        commit_interval=0.2,
        align_idle_ms=idle_ms,
    )
    left = app.topic(left_name, key_serializer="str")
    right = app.topic(right_name, key_serializer="str")
    matched: list[str] = []

    @app.join(left, right, window=1_000, name="late-left")
    def pair(key: str, impression: object, click: object) -> None:
        matched.append(key)

    async with app:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(right_name, b"1", key=b"a", timestamp_ms=100_000)
            await producer.send_and_wait(right_name, b"2", key=b"b", timestamp_ms=200_000)
            if idle_ms == 0:
                # the clicks are processed (stream time 200,000) before the impression exists
                for _ in range(150):
                    if (await committed_offsets(kafka_bootstrap, app.id, right_name, 1)) == [2]:
                        break
                    await asyncio.sleep(0.1)
                else:
                    pytest.fail("the clicks were not processed")
            else:
                await asyncio.sleep(0.3)
            await producer.send_and_wait(left_name, b"3", key=b"a", timestamp_ms=99_500)
        finally:
            await producer.stop()
        for _ in range(150):
            if matched or app.join_stats("late-left").late:
                break
            await asyncio.sleep(0.1)
    if idle_ms:
        assert matched == ["a"]
    else:
        assert matched == [] and app.join_stats("late-left").late == 1


ENRICH_APP = '''
"""A stream-table join whose topics give no partition count (written by test_joins.py)."""
import os

import streamjoin

app = streamjoin.App(
    os.environ["SJT_APP_ID"],
    broker=os.environ["SJT_BROKER"],
    commit_interval=0.2,
    topic_partitions=3,
)
ads = app.topic(os.environ["SJT_ADS"], key_serializer="str")
views = app.topic(os.environ["SJT_VIEWS"], key_serializer="str")
out = app.topic(os.environ["SJT_OUTPUT"], key_serializer="str")
ads_table = app.topic_table(ads)


@app.join(views, ads_table, how="left", output=out)
def enrich(key, view, ad):
    return {"view": view, "ad": ad}
'''


async def test_a_stream_table_join_without_partition_counts_runs_with_the_app_default(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """It used to fail at import (TableAccessError: no partition count yet); now the worker
    creates every topic of the join with the app's topic_partitions and joins correctly."""
    (tmp_path / "enrich_app.py").write_text(ENRICH_APP)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "SJT_APP_ID": unique_topic("enrich"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_ADS": unique_topic("ads"),
        "SJT_VIEWS": unique_topic("views"),
        "SJT_OUTPUT": unique_topic("out"),
    }
    workers = Workers("enrich_app:app", env, tmp_path)
    try:
        workers.start("w1", static=False)
        await wait_for_group(
            kafka_bootstrap, env["SJT_APP_ID"], lambda i: sizes(i, env["SJT_VIEWS"]) == [3], workers
        )
        changelog = f"{env['SJT_APP_ID']}-{env['SJT_ADS']}-table-changelog"
        topics = [env["SJT_ADS"], env["SJT_VIEWS"], env["SJT_OUTPUT"], changelog]
        assert await fetch_partition_counts(kafka_bootstrap, topics) == dict.fromkeys(topics, 3)

        keys = [f"ad-{i}" for i in range(24)]
        assert len({partition_for_key(k.encode(), 3) for k in keys}) == 3
        await produce(kafka_bootstrap, env["SJT_ADS"], [(k, json.dumps(k.upper())) for k in keys])
        for _ in range(240):  # every ad in the table before the views arrive
            committed = await committed_offsets(
                kafka_bootstrap, env["SJT_APP_ID"], env["SJT_ADS"], 3
            )
            if sum(committed) >= len(keys):
                break
            await asyncio.sleep(0.25)
        else:
            raise AssertionError(f"the ads were never materialized\n{workers.logs()}")
        views = [(k, "1") for k in keys] + [("ad-none", "2")]
        await produce(kafka_bootstrap, env["SJT_VIEWS"], views)
        out = await read_all(kafka_bootstrap, env["SJT_OUTPUT"], len(views))
        got = {key: json.loads(value) for key, value, _ in out}
        assert got == {
            **{k: {"view": 1, "ad": k.upper()} for k in keys},
            "ad-none": {"view": 2, "ad": None},
        }, workers.logs()
        assert workers.stop("w1") == 0
    finally:
        workers.close()


def topic_table_app(doc: str, join_function: str, app_options: str = "") -> str:
    """The source of a left stream-table join over a topic-backed table: ``join_function``
    is the source of ``enrich(key, event, user)``, ``app_options`` more App arguments."""
    return f'''
"""{doc} (written by test_joins.py)."""
import os

import streamjoin
from streamjoin.state import RocksDBOptions

app = streamjoin.App(
    os.environ["SJT_APP_ID"], broker=os.environ["SJT_BROKER"], commit_interval=0.2{app_options}
)
users = app.topic(os.environ["SJT_USERS"], key_serializer="str", partitions=3)
events = app.topic(os.environ["SJT_EVENTS"], key_serializer="str", partitions=3)
out = app.topic(os.environ["SJT_OUTPUT"], key_serializer="str", partitions=3)
users_table = app.topic_table(users)


@app.join(events, users_table, how="left", output=out)
{join_function}'''


ASOF_APP = topic_table_app(
    "A left stream-table join over a topic-backed table",
    """def enrich(key, event, user):
    return {"id": event, "user": user}
""",
)

CHANGING_ROWS_APP = topic_table_app(
    "A left stream-table join whose function changes the row it is given",
    """def enrich(key, event, user):
    seen = None if user is None else dict(user)
    if user is not None:
        user["tier"] = "changed by the join function"  # must not reach the next event
    return {"id": event, "user": seen}
""",
    # a read cache far smaller than the table (100 rows per partition): rows are evicted and
    # read again all the time
    app_options=", rocksdb=RocksDBOptions(read_cache_entries=16)",
)


async def topic_table_env(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    module: str,
    source: str,
    app_id: str,
) -> dict[str, str]:
    """Write app ``source`` as ``<module>.py``, create its three topics (3 partitions) and
    return the workers' environment."""
    (tmp_path / f"{module}.py").write_text(source)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "SJT_APP_ID": unique_topic(app_id),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_USERS": unique_topic("users"),
        "SJT_EVENTS": unique_topic("events"),
        "SJT_OUTPUT": unique_topic("out"),
    }
    await ensure_topics(
        kafka_bootstrap,
        [TopicSpec(env[n], 3, 1) for n in ("SJT_USERS", "SJT_EVENTS", "SJT_OUTPUT")],
    )
    return env


async def produce_at(
    bootstrap: str, topic: str, records: list[tuple[str, str | None, int]]
) -> None:
    """Send ``(key, json value or None for a tombstone, timestamp_ms)`` records in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for key, value, timestamp in records:
            payload = None if value is None else value.encode()
            await producer.send(topic, payload, key=key.encode(), timestamp_ms=timestamp)
        await producer.flush()
    finally:
        await producer.stop()


async def test_a_stream_table_join_sees_each_rows_update_and_delete_through_restarts(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Rows are read by key for every event, from the store's read cache (16 entries here,
    set through App(rocksdb=...), so it evicts constantly) and the table's remembered
    values: an updated or deleted row must reach the next event (in the pending writes,
    then in the store after a flush), a restart must read the stored rows, and a join
    function that changes the row it was given must not change the next event's."""
    env = await topic_table_env(
        kafka_bootstrap, unique_topic, tmp_path, "changing_rows_app", CHANGING_ROWS_APP, "rows"
    )
    base = 1_767_225_600_000
    keys = [f"user-{i}" for i in range(300)]
    deleted = set(keys[:30])

    def row(version: str, i: int) -> dict[str, object]:
        return {"tier": version, "n": i}

    expected: dict[int, dict[str, object] | None] = {}

    def events_at(start_id: int, count: int, start_ms: int, version: str | None) -> list:
        out = []
        for j in range(count):
            key = keys[j % len(keys)]
            want = (
                None
                if version is None or (version == "v2" and key in deleted)
                else (row(version, j % len(keys)))
            )
            expected[start_id + j] = want
            out.append((key, json.dumps(start_id + j), start_ms + j))
        return out

    v1 = [(k, json.dumps(row("v1", i)), base - 1_000) for i, k in enumerate(keys)]
    await produce_at(kafka_bootstrap, env["SJT_USERS"], v1)
    await produce_at(kafka_bootstrap, env["SJT_EVENTS"], events_at(0, 3_000, base, "v1"))

    workers = Workers("changing_rows_app:app", env, tmp_path)
    try:
        workers.start("w1")  # phase A: rows v1, events read them from RocksDB
        await read_all(kafka_bootstrap, env["SJT_OUTPUT"], 3_000, timeout=120)
        assert workers.stop("w1") == 0

        # phase B (a restart over a backlog): events that read v1 (cached as they are read),
        # then every row updated or deleted, then events that must see the new rows after
        # the flushes that write them into the store
        await produce_at(
            kafka_bootstrap, env["SJT_EVENTS"], events_at(10_000, 3_000, base + 10_000, "v1")
        )
        v2 = [
            (k, None if k in deleted else json.dumps(row("v2", i)), base + 20_000)
            for i, k in enumerate(keys)
        ]
        await produce_at(kafka_bootstrap, env["SJT_USERS"], v2)
        await produce_at(
            kafka_bootstrap, env["SJT_EVENTS"], events_at(100_000, 20_000, base + 30_000, "v2")
        )
        workers.start("w1")
        out = await read_all(kafka_bootstrap, env["SJT_OUTPUT"], len(expected), timeout=180)
        assert workers.stop("w1") == 0
    finally:
        workers.close()

    got = Counter(value for _, value, _ in out)
    duplicates = [v for v, n in got.items() if n > 1]
    assert not duplicates, f"{len(duplicates)} duplicated outputs, e.g. {duplicates[:3]}"
    results = {v["id"]: v["user"] for v in (json.loads(value) for value in got)}
    assert set(results) == set(expected), f"{len(set(expected) - set(results))} missing"
    wrong = {i: (results[i], want) for i, want in expected.items() if results[i] != want}
    assert not wrong, f"{len(wrong)} wrong, e.g. {list(wrong.items())[:4]}"


async def test_a_stream_table_join_over_a_backlog_joins_each_event_as_of_its_timestamp(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Rows and events are all in the topics before the worker starts (rows produced first,
    timestamped before the events). The table's topic and the stream are read by one agent in
    timestamp order, so every event sees the row of its key as of its own timestamp: every
    event after its row is enriched (this used to leave events unenriched: the table's and the
    join's agents ran independently), and an event timestamped before its row gets None even
    though the row was produced first."""
    env = await topic_table_env(
        kafka_bootstrap, unique_topic, tmp_path, "asof_app", ASOF_APP, "asof"
    )
    base = 1_767_225_600_000
    keys = [f"user-{i}" for i in range(2000)]
    # rows an hour before the events; the "late-*" rows come mid-stream (at base + 5 s)
    rows = [(k, json.dumps(k.upper()), base - 3_600_000 + i) for i, k in enumerate(keys)]
    late_keys = [f"late-{i}" for i in range(6)]
    rows += [(k, json.dumps(k.upper()), base + 5_000) for k in late_keys]
    await produce_at(kafka_bootstrap, env["SJT_USERS"], rows)
    events = [(keys[i % len(keys)], json.dumps(i), base + i) for i in range(20_000)]
    expected: dict[int, str | None] = {i: keys[i % len(keys)].upper() for i in range(20_000)}
    # per late key: one event before its row (None), one at its timestamp and one after (row)
    for j, k in enumerate(late_keys):
        for n, (timestamp, want) in enumerate(
            [(base + 4_999, None), (base + 5_000, k.upper()), (base + 25_000, k.upper())]
        ):
            event_id = 100_000 + 10 * j + n
            events.append((k, json.dumps(event_id), timestamp))
            expected[event_id] = want
    events.sort(key=lambda e: e[2])  # the stream itself in time order, as a producer writes it
    await produce_at(kafka_bootstrap, env["SJT_EVENTS"], events)

    workers = Workers("asof_app:app", env, tmp_path)
    try:
        workers.start("w1", static=False)
        out = await read_all(kafka_bootstrap, env["SJT_OUTPUT"], len(events), timeout=120)
        got = {v["id"]: v["user"] for v in (json.loads(value) for _, value, _ in out)}
        assert set(got) == set(expected), workers.logs()
        unenriched = sorted(i for i, user in got.items() if user is None and expected[i])
        wrong = {i: (got[i], expected[i]) for i in got if got[i] != expected[i]}
        assert not unenriched, f"{len(unenriched)} unenriched, e.g. {unenriched[:5]}"
        assert not wrong, f"{len(wrong)} wrong, e.g. {list(wrong.items())[:6]}"
        assert workers.stop("w1") == 0
    finally:
        workers.close()
