"""Metrics and the status page of running workers, through the real broker: /metrics,
/status.json and / served by embedded apps and by a ``streamjoin worker`` process."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.support import produce

PARTITIONS = 4
ROOT = Path(__file__).parents[2]


def counting_app(
    app_id: str, bootstrap: str, source_name: str, state_dir: Path, **settings: Any
) -> streamjoin.App:
    app = streamjoin.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        commit_interval=0.2,
        state_dir=state_dir,
        standby_replicas=1,
        web_port=0,
        consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
        **settings,
    )
    source = app.topic(
        source_name, key_serializer="str", value_serializer="str", partitions=PARTITIONS
    )
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)

    @app.agent(source, name="count")
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    return app


async def get_json(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        found: dict[str, Any] = await response.json()
        return found


async def get_text(url: str) -> tuple[str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return response.content_type, await response.text()


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    content_type, text = await get_text(url + "metrics")
    assert content_type == "text/plain"
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 45.0) -> Any:
    """Poll ``check`` until it returns something true; fails with its last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"never {what}; last: {last!r}")


def roles(status: dict[str, Any], role: str) -> set[int]:
    return {row["partition"] for row in status["tables"] if row["role"] == role}


async def test_two_workers_serve_metrics_and_status_with_roles_lag_and_standbys(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app_id, source_name = unique_topic("metrics-app"), unique_topic("events")
    first = counting_app(
        app_id, kafka_bootstrap, source_name, tmp_path / "a", status_log_interval=1.0
    )
    second = counting_app(app_id, kafka_bootstrap, source_name, tmp_path / "b")
    records = [(f"key-{i % 17}", f"v{i}") for i in range(300)]
    caplog.set_level(logging.INFO, logger="streamjoin.status")
    async with first:
        url = first.web_url
        assert url is not None and re.fullmatch(r"http://127\.0\.0\.1:\d+/", url)
        await produce(kafka_bootstrap, source_name, records)

        async def caught_up() -> dict[str, Any] | None:
            status = await get_json(url + "status.json")
            rows = status["partitions"]
            done = (
                len(rows) == PARTITIONS
                and sum(r["records_in"] for r in rows) == len(records)
                and all(r["lag"] == 0 and r["lag_processed"] == 0 for r in rows)
            )
            return status if done else None

        status = await eventually(caught_up, "processed everything with lag 0")
        assert {r["role"] for r in status["partitions"]} == {"active"}
        assert sum(r["end_offset"] for r in status["partitions"]) == len(records)
        assert sum(r["committed_offset"] for r in status["partitions"]) == len(records)
        assert status["worker"]["app_id"] == app_id
        assert status["worker"]["member_id"]
        assert status["worker"]["generation"] >= 1
        assert status["rebalance"]["last"]["generation"] == status["worker"]["generation"]
        assert status["rebalance"]["last"]["seconds"] >= 0
        assert roles(status, "active") == set(range(PARTITIONS))
        assert status["processing_latency"]["count"]["count"] == len(records)

        values = await scrape(url)
        by_partition = {
            labels: v
            for (name, labels), v in values.items()
            if name == "streamjoin_records_in_total"
        }
        assert sum(by_partition.values()) == len(records)
        assert len(by_partition) == PARTITIONS
        lags = [v for (name, _), v in values.items() if name == "streamjoin_consumer_lag"]
        assert lags == [0.0] * PARTITIONS
        active = (("kind", "source"), ("role", "active"))
        assert values[("streamjoin_partitions", active)] == PARTITIONS
        count = (("agent", "count"),)
        assert values[("streamjoin_processing_latency_seconds_count", count)] == len(records)
        assert values[("streamjoin_commits_total", ())] >= 1
        assert values[("streamjoin_commit_latency_seconds_count", ())] >= 1
        # the table's writes reached its changelog in flushes
        assert values[("streamjoin_changelog_flush_records_count", ())] >= 1
        assert values[("streamjoin_rebalances_total", ())] >= 1

        # the same values in Python
        assert first.metrics()["throughput"]["records_in"] == len(records)

        content_type, page = await get_text(url)
        assert content_type == "text/html"
        assert "Source partitions" in page and source_name in page

        # a second worker: two active tasks each, and a standby of each of the other's
        async with second:
            other = second.web_url
            assert other is not None and other != url

            async def split() -> tuple[dict[str, Any], dict[str, Any]] | None:
                a = await get_json(url + "status.json")
                b = await get_json(other + "status.json")
                balanced = (
                    len(roles(a, "active")) == len(roles(b, "active")) == PARTITIONS // 2
                    and roles(a, "standby") == roles(b, "active")
                    and roles(b, "standby") == roles(a, "active")
                )
                return (a, b) if balanced else None

            a, b = await eventually(split, "split into two actives with standbys")
            assert roles(a, "active") | roles(b, "active") == set(range(PARTITIONS))
            for status in (a, b):
                assert {r["role"] for r in status["partitions"]} == {"active"}
                standby_lags = [r["lag"] for r in status["tables"] if r["role"] == "standby"]
                assert all(lag is None or lag >= 0 for lag in standby_lags)
            values = await scrape(other)
            standby = (("kind", "table"), ("role", "standby"))
            assert values[("streamjoin_partitions", standby)] == PARTITIONS // 2
    assert any(
        r.name == "streamjoin.status" and r.getMessage().startswith("status: in ")
        for r in caplog.records
    )
    # the server stopped with the worker
    with pytest.raises(aiohttp.ClientConnectionError):
        await get_json(url + "status.json")


def start_worker(env: dict[str, str], state_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """``streamjoin worker`` on the counter test app, serving on a free port."""
    args = ["-A", "tests.integration.apps.counter:app", "--state-dir", str(state_dir)]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "streamjoin.cli", "worker", *args, "--metrics-port", "0"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


async def test_the_worker_command_serves_the_status_page_on_metrics_port(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("cnt"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": unique_topic("events"),
        "SJT_SINK": unique_topic("counts"),
        "SJT_PARTITIONS": "2",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "worker.log"
    proc = start_worker(env, tmp_path / "state", log_path)
    try:

        async def announced() -> str | None:
            found = re.search(r"status page and metrics on (http://\S+/)", log_path.read_text())
            return found.group(1) if found else None

        url = await eventually(announced, "announced its status page", timeout=60)
        await produce(kafka_bootstrap, env["SJT_SOURCE"], [("a", "1"), ("b", "2"), ("a", "3")])

        seen: list[dict[str, Any]] = [{}]

        async def counted() -> dict[str, Any] | None:
            status = seen[0] = await get_json(url + "status.json")
            rows = status["partitions"]
            total = sum(r["records_in"] for r in rows)
            return status if total == 3 and all(r["lag"] == 0 for r in rows) else None

        try:
            status = await eventually(counted, "counted the three records")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen[0]}") from None
        assert status["records_out"][env["SJT_SINK"]] == 3
        content_type, page = await get_text(url)
        assert content_type == "text/html" and env["SJT_SOURCE"] in page
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
