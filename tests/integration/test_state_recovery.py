"""Tables on the real broker: crash recovery, standby takeover, lag reporting across restarts.

The worker processes run tests/integration/apps/counter.py, which counts events
per key in a table and sends every new count to a sink topic.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from streamjoin.partitioner import partition_for_key
from tests.integration.support import (
    ROOT,
    Workers,
    committed_offsets,
    produce,
    read_all,
    sizes,
    wait_for_group,
)

PARTITIONS = 4
KEYS = [f"user-{i}" for i in range(12)]


def latest_counts(records: list[tuple[str, str, dict[str, bytes]]]) -> dict[str, int]:
    """The highest count seen per key in the sink."""
    out: dict[str, int] = {}
    for key, value, _ in records:
        out[key] = max(out.get(key, 0), int(value.split("=")[1]))
    return out


async def wait_committed(
    bootstrap: str, group: str, topic: str, total: int, workers: Workers
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(await committed_offsets(bootstrap, group, topic, PARTITIONS)) >= total:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"offsets never committed\n{workers.logs()}")


def events(n: int, offset: int = 0) -> list[tuple[str, str]]:
    return [(KEYS[(i * 7) % len(KEYS)], f"e{i}") for i in range(offset, offset + n)]


async def test_kill_at_a_quiescent_point_restores_exact_counts(
    kafka_bootstrap: str, counters: Workers
) -> None:
    env = counters.env
    group, source, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
    counters.start("w1", static=False)
    batch = events(300)
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, source) == [4], counters)
    await produce(kafka_bootstrap, source, batch)
    assert len(await read_all(kafka_bootstrap, sink, len(batch))) == len(batch)
    await wait_committed(kafka_bootstrap, group, source, len(batch), counters)
    await asyncio.sleep(0.5)  # quiescent: everything processed, flushed and committed

    # the inspection commands read the running worker's stores (read-only, no lock)
    true_counts = Counter(k for k, _ in batch)
    listing = run_cli(counters, "tables", "--state-dir", str(counters.state_dir("w1")))
    assert listing.count("counts") >= PARTITIONS, listing
    got = run_cli(
        counters, "table get", "--state-dir", str(counters.state_dir("w1")), "counts", "user-3"
    )
    assert got.strip() == str(true_counts["user-3"])

    counters.stop("w1", signal.SIGKILL)
    counters.start("w2", static=False)  # a fresh state dir: everything comes from the changelog
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, source) == [4], counters)
    await produce(kafka_bootstrap, source, [(k, "one-more") for k in KEYS])
    out = await read_all(kafka_bootstrap, sink, len(batch) + len(KEYS))
    assert latest_counts(out) == {k: true_counts[k] + 1 for k in KEYS}
    assert "restoring" in counters.log_of("w2")


async def test_kill_mid_stream_never_undercounts_and_bounds_overcounts(
    kafka_bootstrap: str, counters: Workers
) -> None:
    env = counters.env
    group, source, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
    counters.start("w1", static=False)
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, source) == [4], counters)
    batch = events(3000)
    producer = asyncio.create_task(produce(kafka_bootstrap, source, batch))
    await read_all(kafka_bootstrap, sink, 800, timeout=60)  # well into the stream
    counters.stop("w1", signal.SIGKILL)
    await producer
    committed = await committed_offsets(kafka_bootstrap, group, source, PARTITIONS)

    counters.start("w2", static=False)
    await wait_committed(kafka_bootstrap, group, source, len(batch), counters)
    out = await read_all(kafka_bootstrap, sink, len(batch), timeout=120)
    true_counts = Counter(k for k, _ in batch)
    final = latest_counts(out)
    # records past the committed offsets are the only ones that can be processed twice
    per_partition: dict[int, list[str]] = {}
    for key, _ in batch:
        per_partition.setdefault(partition_for_key(key.encode(), PARTITIONS), []).append(key)
    replayable = Counter(key for p, keys in per_partition.items() for key in keys[committed[p] :])
    for key in KEYS:
        assert final[key] >= true_counts[key], (key, final[key], true_counts[key])
        assert final[key] - true_counts[key] <= replayable[key], (key, committed)


async def test_standby_takes_over_without_replaying(
    kafka_bootstrap: str, counters: Workers
) -> None:
    counters.env["SJT_STANDBYS"] = "1"
    env = counters.env
    group, source, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
    changelog = f"{group}-counts-changelog"
    counters.start("w1", static=False)
    counters.start("w2", static=False)
    info = await wait_for_group(
        kafka_bootstrap, group, lambda i: sizes(i, source) == [2, 2], counters
    )
    for member in info.members:
        # each worker holds the other's partitions as standby
        assert sorted(member.standby.get(changelog, [])) == sorted(
            set(range(PARTITIONS)) - set(member.active[source])
        )
    batch = events(400)
    await produce(kafka_bootstrap, source, batch)
    await read_all(kafka_bootstrap, sink, len(batch))
    await wait_committed(kafka_bootstrap, group, source, len(batch), counters)
    await asyncio.sleep(2)  # standbys follow the changelog continuously

    before = counters.log_of("w2")
    assert counters.stop("w1") == 0
    await wait_for_group(kafka_bootstrap, group, lambda i: sizes(i, source) == [4], counters)
    await produce(kafka_bootstrap, source, [(k, "one-more") for k in KEYS])
    out = await read_all(kafka_bootstrap, sink, len(batch) + len(KEYS))
    true_counts = Counter(k for k, _ in batch)
    assert latest_counts(out) == {k: true_counts[k] + 1 for k in KEYS}
    takeover_log = counters.log_of("w2")[len(before) :]
    replayed = [int(n) for n in re.findall(r"(\d+) changelog records to replay", takeover_log)]
    assert sum(replayed) <= 5, takeover_log


async def test_restarted_worker_reports_its_lag_and_gets_its_partitions_back(
    kafka_bootstrap: str, counters: Workers
) -> None:
    env = counters.env
    group, source, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
    changelog = f"{group}-counts-changelog"
    counters.start("w1")
    counters.start("w2")
    info = await wait_for_group(
        kafka_bootstrap, group, lambda i: sizes(i, source) == [2, 2], counters
    )
    w2_partitions = next(set(m.active[source]) for m in info.members if m.instance_id == "w2")
    batch = events(200)
    await produce(kafka_bootstrap, source, batch)
    await read_all(kafka_bootstrap, sink, len(batch))
    await wait_committed(kafka_bootstrap, group, source, len(batch), counters)

    # w2 stops (a static member: no LeaveGroup; w1 takes over after the session timeout)
    assert counters.stop("w2") == 0
    await wait_for_group(
        kafka_bootstrap, group, lambda i: sizes(i, source) == [4], counters, timeout=90
    )
    await produce(kafka_bootstrap, source, events(40, offset=200))
    await read_all(kafka_bootstrap, sink, len(batch) + 40)

    counters.start("w2")  # same state dir: it reports what it holds on disk
    info = await wait_for_group(
        kafka_bootstrap,
        group,
        lambda i: (
            sizes(i, source) == [2, 2]
            and any(m.instance_id == "w2" and m.state_lag.get(changelog) for m in i.members)
        ),
        counters,
    )
    w2 = next(m for m in info.members if m.instance_id == "w2")
    assert w2_partitions <= set(w2.state_lag[changelog])  # it reported its old stores' lag
    assert set(w2.active[source]) == w2_partitions  # and got those partitions back


def run_cli(workers: Workers, command: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "streamjoin.cli", *command.split(), "-A", workers.app_spec, *args],
        cwd=ROOT,
        env=workers.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


WINDOWED_APP = '''
"""Clicks per key and minute in a windowed table (written by test_state_recovery.py)."""
import os

import streamjoin
from streamjoin.state.windows import TumblingWindows

app = streamjoin.App(
    os.environ["SJT_APP_ID"],
    broker=os.environ["SJT_BROKER"],
    state_dir=os.environ["SJT_STATE_DIR"],
    commit_interval=0.2,
)
clicks = app.topic(os.environ["SJT_SOURCE"], key_serializer="str", partitions=3)
per_minute = app.table(
    "per-minute",
    default=int,
    key_serializer="str",
    window=TumblingWindows(size_ms=60_000, retention_ms=3_600_000),
    copartitioned_with=clicks,
)


@app.agent(clicks, name="count")
async def count(stream):
    async for event in stream:
        per_minute[event.key] += 1
'''


async def test_table_get_prints_the_windows_of_a_windowed_tables_key(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`streamjoin table get` on a windowed table used to say a present key was missing."""
    (tmp_path / "windowed_app.py").write_text(WINDOWED_APP)
    env = {
        "SJT_APP_ID": unique_topic("win"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": unique_topic("clicks"),
        "SJT_STATE_DIR": str(tmp_path / "state"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "windowed_app", raising=False)
    app = importlib.import_module("windowed_app").app

    cli_command = (sys.executable, "-m", "streamjoin.cli")

    def table_get(key: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli_command, "table", "get", "-A", "windowed_app:app", "per-minute", key],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    try:
        async with app:
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
            await producer.start()
            try:
                for key, ts in (("user-1", 1_000), ("user-1", 2_000), ("user-1", 61_000)):
                    await producer.send_and_wait(
                        env["SJT_SOURCE"], b"1", key=key.encode(), timestamp_ms=ts
                    )
                await producer.send_and_wait(
                    env["SJT_SOURCE"], b"1", key=b"user-2", timestamp_ms=3_000
                )
            finally:
                await producer.stop()
            for _ in range(240):
                committed = await committed_offsets(
                    kafka_bootstrap, env["SJT_APP_ID"], env["SJT_SOURCE"], 3
                )
                if sum(committed) >= 4:
                    break
                await asyncio.sleep(0.25)
            else:
                raise AssertionError("the clicks were never committed")
            # read next to the running worker (read-only stores)
            found = table_get("user-1")
            assert found.returncode == 0, found.stderr
            assert json.loads(found.stdout) == [
                {"start": 0, "end": 60_000, "value": 2},
                {"start": 60_000, "end": 120_000, "value": 1},
            ]
            assert f"(partition {partition_for_key(b'user-1', 3)})" in found.stderr
        missing = table_get("user-9")
        assert missing.returncode == 1
        assert "'user-9' has no windows in the local state of table 'per-minute'" in (
            missing.stderr
        )
    finally:
        sys.modules.pop("windowed_app", None)
