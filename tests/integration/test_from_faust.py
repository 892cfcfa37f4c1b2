"""Faust's example apps as ported (examples/from_faust/), run as a user runs them:
``streamjoin worker`` (and the app's own commands) on the real broker.

The windowed aggregation's own timer produces readings; once it stops, every window's
final count and mean must reach the sink, the last window's too, closed by
``close_idle_after`` since no later reading moves stream time past it. Page views, word
count and withdrawals are checked against what was sent."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from tests.integration.support import Workers, produce, read_all, read_to_end, wait_for_group

CLI = [sys.executable, "-m", "streamjoin.cli"]
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
    workers = Workers("examples.from_faust.windowed_aggregation:app", env, tmp_path)
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
    workers = Workers("examples.from_faust.page_views:app", env, tmp_path)
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


async def test_word_count_port_counts_every_word_its_own_task_sent(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Faust's word-count example as ported: its own task sends the posts, one agent splits
    them into words sent to the counting agent (its own topic, keyed by word), which counts
    them in a table; the table's changelog ends with every word's count, the task prints
    the tally of the worker's partitions, and the app's page answers a word's count."""
    from examples.from_faust import word_count

    prefix = unique_topic("faust") + "-"
    env = {**os.environ, "FAUST_PORTS_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
    workers = Workers("examples.from_faust.word_count:app", env, tmp_path)
    workers.start("w1", extra=["--broker", f"kafka://{kafka_bootstrap}", "--web-port", "0"])
    model = {word: word_count.POSTS_PER_WORD for word in word_count.WORDS}
    try:
        changelog = f"{prefix}word-counts-word_counts-changelog"
        deadline = time.monotonic() + 40
        while True:
            counts = {k: json.loads(v) for k, v in await read_to_end(kafka_bootstrap, changelog, 8)}
            tallied = "$$ TALLY $$" in workers.log_of("w1")
            if (counts == model and tallied) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        info = await wait_for_group(
            kafka_bootstrap,
            f"{prefix}word-counts",
            lambda i: bool(i.members) and bool(i.members[0].host),
            workers,
        )
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(f"http://{info.members[0].host}/count/fox") as response,
        ):
            page = (response.status, await response.json())
    finally:
        workers.stop_all()
        workers.close()
    assert counts == model, workers.logs()
    assert f"$$ TALLY $$ {dict(sorted(model.items()))}" in workers.log_of("w1")
    assert page == (200, {"fox": word_count.POSTS_PER_WORD})


async def test_withdrawals_port_sums_what_its_produce_command_sent(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Faust's withdrawals example as ported: its ``produce`` app command (Faust's
    ``app.command`` with click options) sends withdrawals without a worker; the worker sums
    them per user and hour, answered by the query endpoint, and re-keys them by country."""
    prefix = unique_topic("faust") + "-"
    env = {
        **os.environ,
        "FAUST_PORTS_PREFIX": prefix,
        "STREAMJOIN_BROKER": f"kafka://{kafka_bootstrap}",
        "PYTHONUNBUFFERED": "1",
    }
    sent = 300
    command = await asyncio.to_thread(
        subprocess.run,
        [
            *CLI,
            *("-A", "examples.from_faust.withdrawals:app", "produce"),
            *("--max-messages", str(sent), "--max-latency", "0"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert command.returncode == 0, command.stderr
    assert "+SEND 0" in command.stdout
    records = await read_all(kafka_bootstrap, f"{prefix}withdrawals", sent, timeout=20)
    assert len(records) == sent
    totals: dict[str, float] = defaultdict(float)
    for key, value, _headers in records:
        withdrawal = json.loads(value)
        assert withdrawal["user"] == key
        totals[key] += withdrawal["amount"]

    workers = Workers("examples.from_faust.withdrawals:app", env, tmp_path)
    workers.start("w1", extra=["--web-port", "0"])
    group = f"{prefix}faust-withdrawals"
    try:
        info = await wait_for_group(
            kafka_bootstrap, group, lambda i: bool(i.members) and bool(i.members[0].host), workers
        )
        host = info.members[0].host
        answers: dict[str, float] = {}
        deadline = time.monotonic() + 40
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while time.monotonic() < deadline:
                for user in sorted(set(totals) - set(answers)):
                    async with session.get(f"http://{host}/tables/user_to_total/{user}") as r:
                        if r.status == 200:
                            windows = (await r.json())["windows"]
                            total = sum(w["value"] for w in windows)
                            if total == pytest.approx(totals[user]):
                                answers[user] = total
                if len(answers) == len(totals):
                    break
                await asyncio.sleep(0.5)
        regrouped = await read_all(
            kafka_bootstrap, f"{group}-withdrawals-by-country-repartition", sent, timeout=20
        )
    finally:
        workers.stop_all()
        workers.close()
    missing = {u: t for u, t in totals.items() if u not in answers}
    assert not missing, f"users whose hourly totals never matched: {missing}\n{workers.logs()}"
    by_country = Counter(key for key, _v, _h in regrouped)
    assert sum(by_country.values()) == sent
    assert all(key.startswith("country_") for key in by_country)
