"""Stream-table and table-table backfills through the real broker agree exactly with workers
run over the same topics; a start time no partition's last record reaches does not fail."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

import streamjoin
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.topics import Topic

pytestmark = pytest.mark.spark
PARTITIONS = 3
BASE_MS = 1_700_000_000_000

Row = tuple[str, str, Any, int]  # topic, key, value (None: null), timestamp_ms


def enrich(user: str, click: dict[str, Any], profile: Any) -> dict[str, Any]:
    return {"user": user, "click": click["n"], "tier": None if profile is None else profile["tier"]}


def combine(user: str, profile: Any, score: Any) -> list[Any]:
    return [None if profile is None else profile["tier"], None if score is None else score["s"]]


async def produce(bootstrap: str, rows: list[Row]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for topic, key, value, ts in rows:
            payload = None if value is None else json.dumps(value).encode()
            await producer.send(topic, payload, key=key.encode(), timestamp_ms=ts)
        await producer.flush()
    finally:
        await producer.stop()


async def read(bootstrap: str, topic: str) -> list[tuple[int, str, Any, int]]:
    """(partition, key, decoded value or None, timestamp) of every record, offset order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]  # outputs: PARTITIONS too
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[tuple[int, str, Any, int]] = []

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        while await behind():
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out.extend(
                    (
                        r.partition,
                        r.key.decode(),
                        None if r.value is None else json.loads(r.value),
                        r.timestamp,
                    )
                    for r in records
                )
        return out
    finally:
        await consumer.stop()


async def wait_for_outputs(bootstrap: str, topic: str, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        found = len(await read(bootstrap, topic))
        if found >= count:
            return
        assert time.monotonic() < deadline, f"{topic}: {found} of {count} outputs"
        await asyncio.sleep(0.5)


def canonical(items: Any) -> Counter[str]:
    return Counter(json.dumps(i, sort_keys=True) for i in items)


async def enrich_app(
    bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    app_id: str,
    history_ms: int | None = None,
) -> tuple[streamjoin.App, Topic, Topic, Topic]:
    """(app, clicks, profiles, enriched): clicks left-joined with the topic table of
    profiles (versioned with ``history_ms``) into ``enriched``; the topics created."""
    app = streamjoin.App(
        app_id, broker=f"kafka://{bootstrap}", commit_interval=0.2, state_dir=tmp_path / "state"
    )
    clicks = app.topic(unique_topic("clicks"), key_serializer="str", partitions=PARTITIONS)
    profiles = app.topic(unique_topic("profiles"), key_serializer="str", partitions=PARTITIONS)
    out = app.topic(unique_topic("enriched"), key_serializer="str", partitions=PARTITIONS)
    table = app.topic_table(profiles, name="profiles", history_ms=history_ms)
    app.join(clicks, table, how="left", output=out, name="enrich")(enrich)
    await ensure_topics(bootstrap, [TopicSpec(t.name, PARTITIONS) for t in (clicks, profiles, out)])
    return app, clicks, profiles, out


async def test_stream_table_backfill_agrees_with_a_worker_and_survives_a_late_start(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.spark import KafkaSink, KafkaSource, backfill
    from streamjoin.spark.testing import shared_test_session

    app, clicks, profiles, out = await enrich_app(
        kafka_bootstrap, unique_topic, tmp_path, unique_topic("st")
    )

    # each topic partition in timestamp order (what a worker joins exactly as of each
    # record), rows and clicks interleaved, updates, deletes and equal timestamps
    rng = random.Random(3)
    rows: list[Row] = []
    ts = BASE_MS
    n = 0
    for _ in range(600):
        ts += rng.choice([0, 1, 5, 20])
        user = f"u{rng.randrange(25)}"
        if rng.random() < 0.3:
            profile = None if rng.random() < 0.2 else {"tier": rng.randrange(3)}
            rows.append((profiles.name, user, profile, ts))
        else:
            n += 1
            rows.append((clicks.name, user, {"n": n}, ts))
    # the last records all have one key (one partition): the others have nothing later
    tail_start = ts + 1_000
    for i in range(5):
        rows.append((clicks.name, "u0", {"n": 10_000 + i}, tail_start + i))
    await produce(kafka_bootstrap, rows)
    expected_count = sum(1 for r in rows if r[0] == clicks.name)

    async with app:
        await wait_for_outputs(kafka_bootstrap, out.name, expected_count)
    worker_out = await read(kafka_bootstrap, out.name)
    assert len(worker_out) == expected_count  # left join: one output per click

    spark = await asyncio.to_thread(shared_test_session)
    target = unique_topic("enriched-backfill")
    result = await asyncio.to_thread(
        backfill,
        app,
        "enrich",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(target),
        spark=spark,
    )
    assert result.records_read == len(rows) and result.outputs == expected_count
    assert canonical(await read(kafka_bootstrap, target)) == canonical(worker_out)

    # a start time after the last record of two partitions: those start at their end
    late_target = unique_topic("enriched-late")
    late = await asyncio.to_thread(
        backfill,
        app,
        "enrich",
        source=KafkaSource(kafka_bootstrap, start_timestamp_ms=tail_start),
        output=KafkaSink(late_target),
        spark=spark,
    )
    assert late.outputs == 5
    want = [o for o in worker_out if o[3] >= tail_start]
    assert canonical(await read(kafka_bootstrap, late_target)) == canonical(want)


async def test_table_table_backfill_emits_the_workers_changes(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    from streamjoin.spark import KafkaSink, KafkaSource, backfill
    from streamjoin.spark.testing import shared_test_session

    app = streamjoin.App(
        unique_topic("tt"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path / "state",
    )
    profiles = app.topic(unique_topic("profiles"), key_serializer="str", partitions=PARTITIONS)
    scores = app.topic(unique_topic("scores"), key_serializer="str", partitions=PARTITIONS)
    out = app.topic(unique_topic("joined"), key_serializer="str", partitions=PARTITIONS)
    left = app.topic_table(profiles, name="profiles")
    right = app.topic_table(scores, name="scores")
    app.join(left, right, how="inner", output=out, name="both")(combine)
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(t.name, PARTITIONS) for t in (profiles, scores, out)]
    )

    # one side per phase, the worker caught up before the next: the workers' two table
    # agents are not aligned with each other, phases make their order the timestamp order
    rng = random.Random(5)
    ts = BASE_MS
    phases: list[list[Row]] = []
    for phase in range(4):
        topic = profiles.name if phase % 2 == 0 else scores.name
        batch: list[Row] = []
        for _ in range(80):
            ts += rng.choice([1, 3])
            user = f"u{rng.randrange(15)}"
            if rng.random() < 0.15:
                value = None
            elif topic == profiles.name:
                value = {"tier": rng.randrange(3)}
            else:
                value = {"s": rng.randrange(4)}
            batch.append((topic, user, value, ts))
        phases.append(batch)

    from tests.unit.spark.table_histories import Rec, table_table_oracle

    history: list[Row] = []
    async with app:
        for batch in phases:
            history.extend(batch)
            await produce(kafka_bootstrap, batch)
            recs = [Rec(t, k, v, s, 0, i) for i, (t, k, v, s) in enumerate(history)]
            expected = table_table_oracle(recs, profiles.name, scores.name, "inner", combine)
            await wait_for_outputs(kafka_bootstrap, out.name, len(expected))
    worker_out = await read(kafka_bootstrap, out.name)
    assert any(value is None for _, _, value, _ in worker_out)  # a vanished row: tombstone

    def per_key(items: list[tuple[int, str, Any, int]]) -> dict[str, list[Any]]:
        keyed: dict[str, list[Any]] = {}
        for _, key, value, _ in items:
            keyed.setdefault(key, []).append(value)
        return keyed

    spark = await asyncio.to_thread(shared_test_session)
    target = unique_topic("joined-backfill")
    await asyncio.to_thread(
        backfill,
        app,
        "both",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(target),
        spark=spark,
    )
    backfilled = await read(kafka_bootstrap, target)
    assert per_key(backfilled) == per_key(worker_out)
    assert Counter((p, k) for p, k, _, _ in backfilled) == Counter(
        (p, k) for p, k, _, _ in worker_out
    )

    final_target = unique_topic("joined-final")
    await asyncio.to_thread(
        backfill,
        app,
        "both",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(final_target),
        final_only=True,
        spark=spark,
    )
    final = {
        key: values[-1] for key, values in per_key(worker_out).items() if values[-1] is not None
    }
    assert {k: v for _, k, v, _ in await read(kafka_bootstrap, final_target)} == final
    assert len(await read(kafka_bootstrap, final_target)) == len(final)


async def test_versioned_table_backfill_agrees_with_a_worker_on_late_events(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Clicks that arrive after newer rows of their user (older timestamps than rows the
    worker applied before them) get the row of their own time from a versioned table, as
    the Spark backfill joins them; a plain table would hand them the newer row."""
    from streamjoin.spark import KafkaSink, KafkaSource, backfill
    from streamjoin.spark.testing import shared_test_session

    app, clicks, profiles, out = await enrich_app(
        kafka_bootstrap, unique_topic, tmp_path, unique_topic("vt"), history_ms=60_000
    )

    # rows in time order; a third of the clicks carry a time up to 300 ms in the past
    rng = random.Random(11)
    rows: list[Row] = []
    ts = BASE_MS
    n = 0
    for _ in range(600):
        ts += rng.choice([1, 5, 20])
        user = f"u{rng.randrange(10)}"
        if rng.random() < 0.35:
            rows.append((profiles.name, user, {"tier": rng.randrange(5)}, ts))
        else:
            n += 1
            late = rng.random() < 0.35
            rows.append((clicks.name, user, {"n": n}, ts - rng.randrange(1, 300) if late else ts))
    await produce(kafka_bootstrap, rows)

    # The model: each click joined with its user's row as of the click's time. Many clicks
    # come after a newer row of their user (produced before them, with a later time): the
    # row a plain table may have applied already when the click is read.
    as_of: dict[int, Any] = {}
    newest: dict[int, Any] = {}
    seen: dict[str, list[tuple[int, Any]]] = {}
    for topic, user, value, stamp in rows:
        if topic == profiles.name:
            seen.setdefault(user, []).append((stamp, value))
            continue
        versions = [v for s, v in seen.get(user, []) if s <= stamp]
        as_of[value["n"]] = versions[-1]["tier"] if versions else None
        newest[value["n"]] = seen[user][-1][1]["tier"] if user in seen else None
    differ = sum(1 for k in as_of if as_of[k] != newest[k])
    assert differ >= 20, f"only {differ} clicks come after a newer row of another tier"

    async with app:
        await wait_for_outputs(kafka_bootstrap, out.name, n)
    worker_out = await read(kafka_bootstrap, out.name)
    assert {v["click"]: v["tier"] for _, _, v, _ in worker_out} == as_of
    assert len(worker_out) == n

    spark = await asyncio.to_thread(shared_test_session)
    target = unique_topic("enriched-backfill")
    result = await asyncio.to_thread(
        backfill,
        app,
        "enrich",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(target),
        spark=spark,
    )
    assert result.outputs == n
    assert canonical(await read(kafka_bootstrap, target)) == canonical(worker_out)
