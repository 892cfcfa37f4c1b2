"""Exactly-once on the real broker, in process: outputs, table state and offsets move
together (the fault tests, kill -9 and zombies, are in test_exactly_once.py)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

import streamjoin
from streamjoin.errors import TransactionFailed
from streamjoin.runtime.group.transaction import TransactionalSender
from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.support import committed_offsets, produce

PARTITIONS = 3


async def read_committed(
    bootstrap: str, topic: str, expected: int, timeout: float = 60.0
) -> list[tuple[str, str]]:
    """What a read_committed reader sees in ``topic`` (waits for ``expected`` records, then
    reads on until nothing more comes)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        isolation_level="read_committed",
    )
    await consumer.start()
    out: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out.extend((r.key.decode(), r.value.decode()) for r in records)
            if len(out) >= expected and not batch:
                break
    finally:
        await consumer.stop()
    return out


def counting_app(
    bootstrap: str,
    app_id: str,
    source_name: str,
    sink_name: str,
    state_dir: Path,
    *,
    protocol: str = "cooperative",
    instance: str = "w1",
) -> streamjoin.App:
    """Counts events per key in a table and sends each new count."""
    app = streamjoin.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        processing_guarantee="exactly_once",
        state_dir=state_dir,
        group_instance_id=instance,
        rebalance_protocol=protocol,
    )
    source = app.topic(
        source_name, key_serializer="str", value_serializer="str", partitions=PARTITIONS
    )
    sink = app.topic(sink_name, key_serializer="str", value_serializer="str", partitions=1)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)

    @app.agent(source)
    async def count(stream: Stream) -> None:
        async for key, _value in stream.items():
            counts[key] += 1
            await sink.send(key=key, value=str(counts[key]))

    return app


async def test_outputs_state_and_offsets_commit_together_across_a_restart(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app_id, source, sink = unique_topic("eos"), unique_topic("in"), unique_topic("out")
    keys = [f"k{i % 7}" for i in range(300)]
    first = counting_app(kafka_bootstrap, app_id, source, sink, tmp_path / "a")
    async with first:
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys[:150]])
        out = await read_committed(kafka_bootstrap, sink, 150)
    assert len(out) == 150
    metrics = first.transaction_metrics()
    assert metrics["transactions-committed"] >= 1 and metrics["transactions-aborted"] == 0
    # A second incarnation elsewhere: the table is restored from its transactional changelog.
    async with counting_app(kafka_bootstrap, app_id, source, sink, tmp_path / "b"):
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys[150:]])
        out = await read_committed(kafka_bootstrap, sink, 300)
    assert len(out) == 300, f"{len(out)} outputs for 300 events"
    per_key: dict[str, list[int]] = {}
    for key, value in out:
        per_key.setdefault(key, []).append(int(value))
    for key, n in Counter(keys).items():
        assert sorted(per_key[key]) == list(range(1, n + 1)), key
    committed = await committed_offsets(kafka_bootstrap, app_id, source, PARTITIONS)
    assert sum(committed) == 300


async def test_an_aborted_transaction_is_processed_again_and_counted_once(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A transaction that fails (injected: its commit raises once) is aborted; the worker
    gives its partitions up, gets them back, and processes those events again on top of
    stores that never saw the aborted writes."""
    app_id, source, sink = unique_topic("eos"), unique_topic("in"), unique_topic("out")
    app = counting_app(kafka_bootstrap, app_id, source, sink, tmp_path)
    keys = [f"k{i % 5}" for i in range(100)]
    async with app:
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys[:40]])
        assert len(await read_committed(kafka_bootstrap, sink, 40)) == 40
        worker = app._worker
        assert worker is not None and isinstance(worker.sender, TransactionalSender)
        sender = worker.sender
        real_commit = sender.commit
        failures = [TransactionFailed("injected failure")]

        async def failing_once(offsets: Any, commit_offsets: Any) -> None:
            if failures and offsets:
                raise failures.pop()
            await real_commit(offsets, commit_offsets)

        sender.commit = failing_once  # type: ignore[method-assign]
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys[40:]])
        out = await read_committed(kafka_bootstrap, sink, 100)
    assert not failures, "the failure was never injected"
    assert app.transaction_metrics()["transactions-aborted"] == 1
    per_key: dict[str, list[int]] = {}
    for key, value in out:
        per_key.setdefault(key, []).append(int(value))
    for key, n in Counter(keys).items():
        assert sorted(per_key[key]) == list(range(1, n + 1)), (key, per_key[key])


@pytest.mark.parametrize("protocol", ["cooperative", "eager"])
async def test_two_workers_rebalancing_commit_every_event_once(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, protocol: str
) -> None:
    """A second worker joins while events flow and leaves again: the partitions that move
    are revoked with a transaction commit (cooperative: only those; eager: all), and a
    read_committed reader sees every count exactly once, in order."""
    app_id, source, sink = unique_topic("eos"), unique_topic("in"), unique_topic("out")
    keys = [f"k{i % 9}" for i in range(600)]
    first = counting_app(kafka_bootstrap, app_id, source, sink, tmp_path / "a", protocol=protocol)
    second = counting_app(
        kafka_bootstrap, app_id, source, sink, tmp_path / "b", protocol=protocol, instance="w2"
    )
    async with first:
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys[:200]])
        async with second:
            await produce(kafka_bootstrap, source, [(k, "x") for k in keys[200:300]])
            deadline = time.monotonic() + 30
            while not second.assignment and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            moved = first.assignment, second.assignment
            await produce(kafka_bootstrap, source, [(k, "x") for k in keys[300:400]])
            await read_committed(kafka_bootstrap, sink, 400)
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys[400:]])
        out = await read_committed(kafka_bootstrap, sink, 600)
    assert moved[0] and moved[1], f"the second worker never got partitions: {moved}"
    per_key: dict[str, list[int]] = {}
    for key, value in out:
        per_key.setdefault(key, []).append(int(value))
    for key, n in Counter(keys).items():
        assert per_key[key] == list(range(1, n + 1)), (key, per_key[key])


async def test_a_dead_letter_commits_or_aborts_with_its_offset(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Poison records go to the dead-letter topic in the same transaction as their offsets:
    the first transaction holding them is aborted (injected), so they are dead-lettered
    again when their events are processed again, and a read_committed reader of the
    dead-letter topic finds each exactly once."""
    app_id, source_name, sink_name = unique_topic("eos"), unique_topic("in"), unique_topic("out")
    app = streamjoin.App(
        app_id,
        broker=f"kafka://{kafka_bootstrap}",
        processing_guarantee="exactly_once",
        state_dir=tmp_path,
        group_instance_id="w1",
    )
    source = app.topic(
        source_name, key_serializer="str", value_serializer="str", partitions=PARTITIONS
    )
    sink = app.topic(sink_name, key_serializer="str", value_serializer="str", partitions=1)

    @app.agent(source, on_error="dead_letter", name="check")
    async def check(stream: Stream) -> None:
        async for key, value in stream.items():
            if value.startswith("poison"):
                raise ValueError(f"poison record {value}")
            await sink.send(key=key, value=value)

    records = [(f"k{i % 4}", f"poison-{i}" if i % 10 == 3 else f"ok-{i}") for i in range(60)]
    poison = sorted(v for _, v in records if v.startswith("poison"))
    async with app:
        worker = app._worker
        assert worker is not None and isinstance(worker.sender, TransactionalSender)
        sender = worker.sender
        real_commit = sender.commit
        failures = [TransactionFailed("injected failure")]

        async def failing_once(offsets: Any, commit_offsets: Any) -> None:
            if failures and offsets:
                raise failures.pop()
            await real_commit(offsets, commit_offsets)

        sender.commit = failing_once  # type: ignore[method-assign]
        await produce(kafka_bootstrap, source_name, records)
        out = await read_committed(kafka_bootstrap, sink_name, len(records) - len(poison))
        dead = await read_committed(kafka_bootstrap, f"{app_id}-check-dead-letters", len(poison))
    assert not failures, "the failure was never injected"
    assert app.transaction_metrics()["transactions-aborted"] == 1
    assert sorted(v for _, v in out) == sorted(v for _, v in records if v.startswith("ok"))
    assert sorted(v for _, v in dead) == poison
