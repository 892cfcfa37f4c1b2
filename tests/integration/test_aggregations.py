"""Aggregations through the real broker: one worker, results read back against a model.

Session windows with emit="close" send each session's final count and sum once it
closes; a tumbling aggregation re-keyed through a repartition topic is read through the
interactive-query endpoint, as is the session table (whose windows carry their own ends).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

import streamjoin
from streamjoin.aggregations import Count, Sum
from streamjoin.errors import KeyNotFound
from streamjoin.query import TableClient
from streamjoin.state.windows import SessionWindows, TumblingWindows
from tests.integration.support import read_all

GAP_MS = 2_000


async def _produce(
    bootstrap: str, topic: str, records: list[tuple[str, dict[str, Any], int]]
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value, ts in records:
            await producer.send(
                topic, json.dumps(value).encode(), key=key.encode(), timestamp_ms=ts
            )
        await producer.flush()
    finally:
        await producer.stop()


def _sessions(
    records: list[tuple[str, dict[str, Any], int]],
) -> dict[tuple[str, int], dict[str, Any]]:
    """Brute force: (key, session start) -> {"start", "end", "value"} of every session."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for key in {k for k, _, _ in records}:
        mine = sorted((ts, v["amount"]) for k, v, ts in records if k == key)
        start, last, n, total = mine[0][0], mine[0][0], 0, 0
        for ts, amount in mine:
            if ts - last > GAP_MS:
                out[(key, start)] = {
                    "start": start,
                    "end": last + 1,
                    "value": {"n": n, "sum": total},
                }
                start, n, total = ts, 0, 0
            last, n, total = ts, n + 1, total + amount
        out[(key, start)] = {"start": start, "end": last + 1, "value": {"n": n, "sum": total}}
    return out


async def _query(client: TableClient, table: str, key: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        try:
            answer = await asyncio.to_thread(client.get, table, key, from_ms=0)
            windows: list[dict[str, Any]] = answer["windows"]
            return windows
        except KeyNotFound:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def test_session_and_tumbling_aggregations_in_a_real_worker(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    orders, final = unique_topic("orders"), unique_topic("final")
    app = streamjoin.App(
        unique_topic("agg"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path / "state",
        web_port=0,
    )
    app.topic(orders, key_serializer="str", value_serializer="json", partitions=3)
    app.topic(final, key_serializer="str", value_serializer="json", partitions=3)
    app.aggregate(
        orders,
        window=SessionWindows(gap_ms=GAP_MS),
        agg={"n": Count(), "sum": Sum("amount")},
        name="sessions",
        emit="close",
        emit_to=final,
    )
    app.aggregate(
        orders,
        # (re-keyed records from 3 source partitions interleave: grace covers it)
        window=TumblingWindows(size_ms=10_000, grace_ms=60_000, retention_ms=None),
        agg=Sum("amount"),
        name="per-shop",
        key=lambda event: event.value["shop"],
    )
    base = 1_700_000_000_000
    records: list[tuple[str, dict[str, Any], int]] = [
        (
            f"user-{i % 4}",
            {"amount": i, "shop": f"shop-{i % 3}"},
            base + 400 * i + 2_000 * (i // 10),
        )
        for i in range(40)
    ]
    # a last record far ahead closes every session before it (on its own partition: the
    # other partitions' sessions close with their own last records' stream time)
    closer = max(ts for *_, ts in records) + 10 * GAP_MS
    closers: list[tuple[str, dict[str, Any], int]] = [
        (f"user-{i}", {"amount": 0, "shop": "shop-0"}, closer) for i in range(4)
    ]
    async with app:
        assert app.web_url is not None
        await _produce(kafka_bootstrap, orders, records + closers)
        want = _sessions(records)
        got = await read_all(kafka_bootstrap, final, expected=len(want), timeout=60)
        sent = {(key, json.loads(value)["start"]): json.loads(value) for key, value, _ in got}
        assert len(got) == len(sent)  # each final result once
        assert sent == want
        host = app.web_url.removeprefix("http://").rstrip("/")
        client = TableClient([host], retry_for=20)
        per_shop: dict[str, int] = {}
        for _, value, _ts in records + closers:
            per_shop[value["shop"]] = per_shop.get(value["shop"], 0) + value["amount"]
        for shop, total in per_shop.items():
            windows = await _query(client, "per-shop", shop)
            deadline = time.monotonic() + 30
            while sum(w["value"] for w in windows) != total and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                windows = await _query(client, "per-shop", shop)
            assert sum(w["value"] for w in windows) == total
        # the closer's session is still open: the table has it, with its own end
        windows = await _query(client, "sessions", "user-0")
        assert {"start": closer, "end": closer + 1, "value": {"n": 1, "sum": 0}} in windows
