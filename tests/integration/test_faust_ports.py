"""The windowed-aggregation port of Faust's example (examples/faust_ports/) run as a user
runs it: ``streamjoin worker`` on the real broker. Its own timer produces readings; once it
stops, every window's final count and mean must reach the sink, the last window's too,
closed by ``close_idle_after`` since no later reading moves stream time past it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.support import Workers, produce, read_all, read_to_end

READINGS = 25  # 0.1 s apart: about 2.5 s of readings, in 1-second windows
WINDOW_MS = 1_000


async def test_windowed_aggregation_port_sends_every_windows_final_result(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    prefix = unique_topic("faust") + "-"
    env = {
        **os.environ,
        "FAUST_PORTS_PREFIX": prefix,
        "FAUST_PORTS_WINDOW_S": str(WINDOW_MS / 1000),
        "FAUST_PORTS_READINGS": str(READINGS),
        "FAUST_PORTS_IDLE_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    workers = Workers("examples.faust_ports.windowed_aggregation:app", env, tmp_path)
    started = time.monotonic()
    workers.start("w1", extra=["--broker", f"kafka://{kafka_bootstrap}"])
    try:
        readings = await read_all(kafka_bootstrap, f"{prefix}raw-event", READINGS, timeout=30)
        by_window: dict[int, list[float]] = defaultdict(list)
        for _key, value, _headers in readings:
            reading = json.loads(value)
            date_ms = int(datetime.fromisoformat(reading["date"]).timestamp() * 1000)
            by_window[date_ms - date_ms % WINDOW_MS].append(reading["value"])
        assert sum(map(len, by_window.values())) == READINGS  # the timer stopped after them

        finals = await read_all(kafka_bootstrap, f"{prefix}agg-event", len(by_window), timeout=15)
    finally:
        workers.stop_all()
        workers.close()
    results = {json.loads(v)["start"]: (json.loads(v), h) for _k, v, h in finals}
    assert sorted(results) == sorted(by_window), workers.logs()  # the last window too
    assert len(finals) == len(by_window)  # one final result per window
    for start, values in by_window.items():
        record, headers = results[start]
        assert record["end"] == start + WINDOW_MS
        assert int(headers["window-start"]) == start
        assert record["value"]["count"] == len(values)
        assert record["value"]["mean"] == pytest.approx(sum(values) / len(values))
    assert "processing window" in workers.logs()  # the on_window_close callback ran
    assert time.monotonic() - started < 30


async def test_page_views_port_counts_views_per_page_through_its_repartition_topic(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Faust's page-views tutorial as ported: views keyed by user, regrouped by page id,
    counted per page; the table's changelog ends with every page's count."""
    prefix = unique_topic("faust") + "-"
    env = {**os.environ, "FAUST_PORTS_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
    views = [(f"u{i % 11}", f"p{(i * 7) % 5}") for i in range(300)]
    workers = Workers("examples.faust_ports.page_views:app", env, tmp_path)
    workers.start("w1", extra=["--broker", f"kafka://{kafka_bootstrap}"])
    try:
        await produce(
            kafka_bootstrap,
            f"{prefix}page_views",
            [(user, json.dumps({"id": page, "user": user})) for user, page in views],
        )
        model = dict(Counter(page for _, page in views))
        changelog = f"{prefix}page-views-page_views-changelog"
        deadline = time.monotonic() + 30
        while True:
            counts = {k: json.loads(v) for k, v in await read_to_end(kafka_bootstrap, changelog, 4)}
            if counts == model or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        workers.stop_all()
        workers.close()
    assert counts == model, workers.logs()
