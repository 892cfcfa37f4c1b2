"""``close_idle_after=`` on the real broker: a left join whose right side never arrives and
whose input stops emits its unmatched results on wall-clock time, with the commit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

import streamjoin
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

IDLE_S = 2.0
COMMIT_S = 0.3


async def first_results(
    bootstrap: str, topic: str, expected: int, isolation_level: str, timeout: float
) -> tuple[list[Any], float]:
    """The first ``expected`` records of ``topic`` and when the last of them was read
    (monotonic seconds)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        isolation_level=isolation_level,
    )
    await consumer.start()
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                out.extend(json.loads(r.value) for r in records)
        return out, time.monotonic()
    finally:
        await consumer.stop()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_an_idle_left_join_emits_its_unmatched_orders_without_new_input(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path, guarantee: str
) -> None:
    orders_name, payments_name = unique_topic("orders"), unique_topic("payments")
    out_name = unique_topic("unpaid")
    await ensure_topics(
        kafka_bootstrap,
        [TopicSpec(orders_name, 2), TopicSpec(payments_name, 2), TopicSpec(out_name, 1)],
    )
    app = streamjoin.App(
        unique_topic("app"),
        broker=f"kafka://{kafka_bootstrap}",
        state_dir=tmp_path,
        commit_interval=COMMIT_S,
        processing_guarantee=guarantee,
    )
    orders = app.topic(orders_name, key_serializer="str", value_serializer="json")
    payments = app.topic(payments_name, key_serializer="str", value_serializer="json")
    output = app.topic(out_name, key_serializer="str", value_serializer="json")

    @app.join(
        orders,
        payments,
        window=timedelta(milliseconds=500),
        how="left",
        output=output,
        close_idle_after=IDLE_S,
    )
    def paid(order_id: str, order: Any, payment: Any) -> Any:
        return {"order": order_id, "paid": payment is not None}

    keys = [f"o{i}" for i in range(6)]
    async with app:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            sent_at = time.monotonic()  # (no partition can be idle since before this)
            now_ms = int(time.time() * 1000)
            for i, key in enumerate(keys):
                await producer.send(orders_name, b"{}", key=key.encode(), timestamp_ms=now_ms + i)
            await producer.flush()
        finally:
            await producer.stop()
        got, read_at = await first_results(
            kafka_bootstrap,
            out_name,
            len(keys),
            "read_committed" if guarantee == "exactly_once" else "read_uncommitted",
            timeout=30,
        )
        stats = app.join_stats("paid")
    assert sorted(r["order"] for r in got) == keys
    assert not any(r["paid"] for r in got)
    elapsed = read_at - sent_at
    # Never before the partition was idle for close_idle_after; within it, plus up to two
    # commit intervals (activity is seen at a commit, the close happens at one), plus the
    # time the records take to be fetched, processed and read back.
    assert IDLE_S <= elapsed <= IDLE_S + 2 * COMMIT_S + 2.0, elapsed
    assert stats.idle_emitted == len(keys) and stats.late == 0
