"""Timers, crontabs and app tasks on the real broker: in-process workers (``async with
app``) and ``streamjoin worker`` processes (the leader-only timer, across a leader change).
Each test runs for a few seconds."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer

import streamjoin
from streamjoin.errors import TimerFailed
from tests.integration.support import Workers, wait_for_group


def _app(app_id: str, bootstrap: str, state_dir: Path, **settings: object) -> streamjoin.App:
    return streamjoin.App(app_id, broker=f"kafka://{bootstrap}", state_dir=state_dir, **settings)


async def test_an_interval_timer_runs_once_per_interval_on_each_worker(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app_id = unique_topic("app")
    runs: dict[str, list[float]] = {"w1": [], "w2": []}
    apps = []
    for name in runs:
        app = _app(app_id, kafka_bootstrap, tmp_path / name, web_port=0)

        @app.timer(0.25, name="tick")
        async def tick(name: str = name) -> None:
            runs[name].append(time.monotonic())

        apps.append(app)
    async with apps[0], apps[1]:
        started = time.monotonic()
        await asyncio.sleep(1.4)
        url = (apps[0].web_url or "").rstrip("/")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/metrics") as response:
                exported = await response.text()
            async with http.get(f"{url}/status.json") as response:
                status = await response.json()
        elapsed = time.monotonic() - started
    for name, times in runs.items():
        # one run per interval: 5 in 1.4 s (a tick at 0.25 s, ..., 1.25 s), never faster
        assert abs(len(times) - elapsed / 0.25) <= 1.5, (name, times)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(0.2 <= gap <= 0.35 for gap in gaps), (name, gaps)
    assert status["timers"]["tick"]["kind"] == "interval"
    assert status["timers"]["tick"]["runs"] >= 4
    assert f'streamjoin_timer_runs_total{{timer="tick"}} {status["timers"]["tick"]["runs"]}' in (
        exported.replace(".0\n", "\n")
    )


async def test_a_crontab_with_seconds_fires_on_the_whole_second(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app = _app(unique_topic("app"), kafka_bootstrap, tmp_path)
    fired: list[float] = []

    @app.crontab("* * * * * *", timezone="Europe/Paris", name="every-second")
    async def every_second() -> None:
        fired.append(time.time())

    async with app:
        await asyncio.sleep(2.6)
    assert 2 <= len(fired) <= 3, fired
    # each at a whole second of the wall clock (a little after it, never before)
    assert all(t - int(t) < 0.25 for t in fired), fired
    assert len({int(t) for t in fired}) == len(fired)
    assert app.metrics()["timers"]["every-second"]["kind"] == "crontab"


async def test_exactly_once_timer_sends_of_an_app_without_agents_are_committed(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """An app reading no topic never commits a transaction: under exactly_once its timers'
    sends must still reach read_committed readers (not wait in a transaction that aborts)."""
    out = unique_topic("beats")
    app = _app(unique_topic("app"), kafka_bootstrap, tmp_path, processing_guarantee="exactly_once")
    beats = app.topic(out, key_serializer="str", value_serializer="json", partitions=1)
    sent: list[int] = []

    @app.timer(0.2, name="beat")
    async def beat() -> None:
        sent.append(len(sent))
        await beats.send(key="beat", value=sent[-1])

    async with app:
        await asyncio.sleep(1.0)
    assert len(sent) >= 3
    consumer = AIOKafkaConsumer(
        out,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        got = await consumer.getmany(timeout_ms=5000)
        values = [int(r.value) for batch in got.values() for r in batch]  # type: ignore[arg-type]
    finally:
        await consumer.stop()
    assert values == sent


async def test_an_app_task_runs_once_per_start_and_is_cancelled_on_stop(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app = _app(unique_topic("app"), kafka_bootstrap, tmp_path)
    out = app.topic(unique_topic("out"), value_serializer="str", partitions=1)
    starts: list[float] = []
    cancelled: list[float] = []

    @app.task
    async def background() -> None:
        starts.append(time.monotonic())
        await out.send(value="started")  # sends through the worker's producer
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(time.monotonic())
            raise

    for run in (1, 2):
        async with app:
            await asyncio.sleep(0.5)
            assert len(starts) == run and len(cancelled) == run - 1
        assert len(cancelled) == run
    assert app.failure is None


async def test_a_failing_timer_stops_the_worker_with_the_error(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app = _app(unique_topic("app"), kafka_bootstrap, tmp_path)

    @app.timer(0.2, name="broken")
    async def broken() -> None:
        raise ValueError("the database is gone")

    await app.start()
    with pytest.raises(TimerFailed, match="timer broken failed: ValueError: the database is gone"):
        await asyncio.wait_for(app.wait(), 10.0)
    assert not app.running
    assert app.metrics()["timers"]["broken"]["errors"] == 1


async def _ticks(
    bootstrap: str,
    topic: str,
    names: dict[str, str],
    until: Callable[[list[tuple[str, float]]], bool],
    timeout: float,
) -> list[tuple[str, float]]:
    """``(worker, wall time)`` of every tick in ``topic`` (``names``: pid -> worker), read
    until ``until`` holds."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    ticks: list[tuple[str, float]] = []
    deadline = time.monotonic() + timeout
    try:
        while not until(ticks):
            assert time.monotonic() < deadline, f"ticks so far: {ticks}"
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    who, at = record.value.decode().split(":")
                    ticks.append((names.get(who, who), float(at)))
    finally:
        await consumer.stop()
    return ticks


async def test_an_on_leader_timer_runs_on_one_worker_and_moves_with_the_leadership(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    group, sink = unique_topic("ticker"), unique_topic("ticks")
    env = {
        **os.environ,
        "SJT_APP_ID": group,
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SINK": sink,
        "SJT_INTERVAL": "0.2",
        "PYTHONUNBUFFERED": "1",
    }
    workers = Workers("tests.integration.apps.ticker:app", env, tmp_path)
    try:
        # dynamic members: one that stops leaves the group at once (a static member would
        # keep its place until its session times out)
        workers.start("w1", static=False)
        workers.start("w2", static=False)
        names = {str(proc.pid): name for name, proc in workers.procs.items()}
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 2, workers)
        stable = time.time() + 0.5  # past the rebalance that took the second worker in

        def steady_window(ticks: list[tuple[str, float]]) -> bool:
            return any(at > stable + 1.5 for _, at in ticks)

        ticks = await _ticks(kafka_bootstrap, sink, names, steady_window, 20.0)
        steady = [(who, at) for who, at in ticks if stable < at <= stable + 1.5]
        leaders = {who for who, _ in steady}
        assert len(leaders) == 1, (steady, workers.logs())  # one worker at a time
        assert len(steady) >= 5, steady  # about one per 0.2 s interval
        [leader] = leaders
        follower = "w2" if leader == "w1" else "w1"

        assert workers.stop(leader) == 0
        stopped = time.time()

        def taken_over(ticks: list[tuple[str, float]]) -> bool:
            return sum(who == follower and at > stopped for who, at in ticks) >= 3

        ticks = await _ticks(kafka_bootstrap, sink, names, taken_over, 20.0)
        after = [(who, at) for who, at in ticks if at > stopped]
        assert {who for who, _ in after} == {follower}, after
        log = workers.log_of(follower)
        assert "timer leader-tick started: every 0.2s, on the group's leader only" in log
        assert "timer leader-tick: this worker leads the group: runs its ticks" in log
    finally:
        workers.close()
