"""Declarations hold no run-time state, on the real broker: two workers of one app run in
this process through two rebalances (the second joins, then leaves), and neither App's
declarations differ afterwards in any field (tests/declarations.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import streamjoin
from tests.declarations import differences, every_kind_app, fingerprint
from tests.integration.support import produce, read_all


async def _wait(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _traffic(bootstrap: str, prefix: str, start: int, count: int) -> None:
    rows = [(f"k{i % 7}", json.dumps({"ad": i})) for i in range(start, start + count)]
    await produce(bootstrap, f"{prefix}ads", rows)
    await produce(
        bootstrap, f"{prefix}clicks", [(k, json.dumps(i)) for i, (k, _) in enumerate(rows)]
    )
    await produce(
        bootstrap, f"{prefix}views", [(k, json.dumps(i)) for i, (k, _) in enumerate(rows)]
    )


async def test_two_workers_through_two_rebalances_change_no_declaration(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    prefix, app_id = unique_topic("decl") + "-", unique_topic("decl-app")

    def worker(name: str) -> streamjoin.App:
        return every_kind_app(
            app_id,
            prefix,
            broker=f"kafka://{kafka_bootstrap}",
            commit_interval=0.2,
            state_dir=tmp_path / name,
        )

    first, second = worker("w1"), worker("w2")
    before = {"w1": fingerprint(first), "w2": fingerprint(second)}
    await first.start()
    try:
        await _wait(lambda: len(first.assignment) > 0, "the first worker's assignment")
        everything = len(first.assignment)
        await _traffic(kafka_bootstrap, prefix, 0, 30)
        await read_all(kafka_bootstrap, f"{prefix}click-view", 30)
        await second.start()
        try:
            await _wait(
                lambda: bool(first.assignment) and bool(second.assignment),
                "the partitions to be shared by both workers",
            )
            await _traffic(kafka_bootstrap, prefix, 30, 30)
            await read_all(kafka_bootstrap, f"{prefix}click-view", 60)
        finally:
            await second.stop()
        await _wait(lambda: len(first.assignment) == everything, "the first to own all again")
        await _traffic(kafka_bootstrap, prefix, 60, 10)
        await read_all(kafka_bootstrap, f"{prefix}click-view", 70)
    finally:
        await first.stop()
    assert differences(before["w1"], fingerprint(first)) == []
    assert differences(before["w2"], fingerprint(second)) == []
