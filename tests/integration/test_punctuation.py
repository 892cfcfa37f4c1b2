"""Punctuation per task through the real broker: a wall-clock punctuation writes its task's
table and sends with no input arriving, and what it wrote survives a kill -9 of its
worker (the next worker restores it from the changelog and goes on from there)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from streamjoin import App
from streamjoin.punctuation import PunctuationContext
from streamjoin.stream import Stream
from tests.integration.support import Workers, read_to_end

PARTITIONS = 2


def _isolation(guarantee: str) -> str:
    return "read_committed" if guarantee == "exactly_once" else "read_uncommitted"


async def _runs(bootstrap: str, topic: str, guarantee: str) -> list[dict[str, int]]:
    """Everything in ``topic`` (once nothing writes to it any more)."""
    rows = await read_to_end(bootstrap, topic, 1, isolation_level=_isolation(guarantee))
    return [json.loads(value) for _, value in rows]


async def _wait_for_runs(
    bootstrap: str,
    topic: str,
    guarantee: str,
    enough: Callable[[list[dict[str, int]]], bool],
    timeout: float = 40.0,
) -> list[dict[str, int]]:
    """What ``topic`` holds from its start, read while a worker writes it, once ``enough``
    says so (or after ``timeout`` seconds)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        isolation_level=_isolation(guarantee),
    )
    await consumer.start()
    rows: list[dict[str, int]] = []
    deadline = time.monotonic() + timeout
    try:
        while not enough(rows) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            rows.extend(json.loads(r.value) for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return rows


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_wall_clock_punctuation_writes_and_sends_without_input(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    app = App(
        unique_topic("punct"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        processing_guarantee=guarantee,
        state_dir=str(tmp_path / "state"),
    )
    source = app.topic(unique_topic("events"), value_serializer="json", partitions=PARTITIONS)
    sink = app.topic(
        unique_topic("runs"), key_serializer="str", value_serializer="json", partitions=1
    )
    runs = app.table("runs", default=int, key_serializer="str", copartitioned_with=source)

    @app.agent(source)
    async def idle(stream: Stream) -> None:
        async for _ in stream:
            pass

    @app.punctuate(idle, every_ms=100, type="wall_clock")
    async def count_runs(context: PunctuationContext) -> None:
        runs["runs"] += 1
        await context.send(
            sink, key=str(context.partition), value={"p": context.partition, "n": runs["runs"]}
        )

    async with app:
        sent = await _wait_for_runs(
            kafka_bootstrap,
            sink.name,
            guarantee,
            lambda rows: all(sum(r["p"] == p for r in rows) >= 3 for p in range(PARTITIONS)),
        )
    for p in range(PARTITIONS):
        counts = [r["n"] for r in sent if r["p"] == p]
        assert counts[:3] == [1, 2, 3], sent  # each task counts in its own partition
    # the table's writes reached its changelog: each partition's last count, as sent
    final = await _runs(kafka_bootstrap, sink.name, guarantee)
    changelog = await read_to_end(
        kafka_bootstrap,
        f"{app.id}-runs-changelog",
        PARTITIONS,
        isolation_level=_isolation(guarantee),
    )
    assert sorted(int(value) for _, value in changelog)[-PARTITIONS:] == sorted(
        max(r["n"] for r in final if r["p"] == p) for p in range(PARTITIONS)
    )


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_punctuations_writes_survive_a_kill_9(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    sink = unique_topic("runs")
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("punct"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": unique_topic("events"),
        "SJT_SINK": sink,
        "SJT_PARTITIONS": str(PARTITIONS),
        "SJT_GUARANTEE": guarantee,
        "PYTHONUNBUFFERED": "1",
    }
    workers = Workers("tests.integration.apps.punctuator:app", env, tmp_path)
    try:
        workers.start("first", instance_id="worker")
        first = workers.procs["first"].pid
        before = await _wait_for_runs(
            kafka_bootstrap,
            sink,
            guarantee,
            lambda rows: all(
                sum(r["partition"] == p for r in rows) >= 8 for p in range(PARTITIONS)
            ),
        )
        assert all(r["pid"] == first for r in before), workers.logs()
        workers.stop("first", signal.SIGKILL)
        # the same member, with an empty state directory: the table is restored from its
        # changelog
        workers.start("second", instance_id="worker")
        second = workers.procs["second"].pid
        after = await _wait_for_runs(
            kafka_bootstrap,
            sink,
            guarantee,
            lambda rows: all(
                any(r["pid"] == second and r["partition"] == p for r in rows)
                for p in range(PARTITIONS)
            ),
        )
    finally:
        logs = workers.logs()
        workers.close()
    for p in range(PARTITIONS):
        sent_before = [r["runs"] for r in after if r["pid"] == first and r["partition"] == p]
        resumed = next(r["runs"] for r in after if r["pid"] == second and r["partition"] == p)
        assert len(sent_before) >= 8, logs
        # the count goes on from one the first worker had flushed (and sent: a flush sends
        # first), never from scratch
        assert resumed > 1, logs
        assert resumed - 1 in sent_before, (p, resumed, sent_before, logs)
        if guarantee == "exactly_once":
            # committed outputs and committed state are one transaction
            assert sent_before == list(range(1, len(sent_before) + 1)), logs
            assert resumed == sent_before[-1] + 1, logs
