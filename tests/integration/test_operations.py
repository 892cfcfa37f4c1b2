"""Operating a worker on the real broker: its state directory, moving a group's offsets,
``streamjoin assignment``'s lag columns."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

import streamjoin
from streamjoin.errors import StateDirInUse
from streamjoin.runtime.group.group_info import describe_group
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from streamjoin.state.rocksdb import RocksDBStorePartition
from tests.integration.support import (
    ROOT,
    Workers,
    committed_offsets,
    counter_workers,
    produce,
    read_all,
    wait_for_group,
)
from tests.unit.state.state_store_support import corrupt_data_block

POISON_APP = "tests.integration.apps.poison_stop:app"


def _counting_app(bootstrap: str, app_id: str, source: str, state_dir: Path) -> streamjoin.App:
    app = streamjoin.App(
        app_id, broker=f"kafka://{bootstrap}", state_dir=state_dir, commit_interval=0.2
    )
    topic = app.topic(source, key_serializer="str", value_serializer="str", partitions=2)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=topic)

    @app.agent(topic, name="count")
    async def count(stream: Stream) -> None:
        async for key, _ in stream.items():
            counts[key] += 1

    return app


async def test_a_second_worker_on_the_same_state_dir_fails_before_joining(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app_id, source = unique_topic("app"), unique_topic("in")
    first = _counting_app(kafka_bootstrap, app_id, source, tmp_path)
    second = _counting_app(kafka_bootstrap, app_id, source, tmp_path)
    async with first:
        started = time.monotonic()
        with pytest.raises(StateDirInUse) as caught:
            await second.start()
        assert time.monotonic() - started < 2.0  # fails fast: no group join, no topics
        assert str(caught.value).startswith(f"state dir {tmp_path} in use by pid ")
        assert str(caught.value).endswith("; give each worker its own --state-dir")
        assert not second.running
        await asyncio.sleep(1.0)
        info = await describe_group(kafka_bootstrap, app_id)
        assert len(info.members) == 1
    # released on stop: the same directory serves the next worker
    async with second:
        assert second.running


def _poison_env(
    bootstrap: str, unique_topic: Callable[..., str], partitions: int
) -> dict[str, str]:
    return {
        **os.environ,
        "SJT_APP_ID": unique_topic("poison"),
        "SJT_BROKER": f"kafka://{bootstrap}",
        "SJT_SOURCE": unique_topic("in"),
        "SJT_SINK": unique_topic("out"),
        "SJT_PARTITIONS": str(partitions),
        "PYTHONUNBUFFERED": "1",
    }


async def streamjoin_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``streamjoin ARGS`` (the real command, in its own process)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "streamjoin.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_offsets_reset_skip_and_show_on_a_stopped_group(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    env = _poison_env(kafka_bootstrap, unique_topic, partitions=2)
    app_id, topic = env["SJT_APP_ID"], env["SJT_SOURCE"]
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:  # 10 records per partition, record i written at time 1_000_000 + i * 1000
        for i in range(10):
            for p in (0, 1):
                await producer.send_and_wait(
                    topic,
                    f"v{i}".encode(),
                    key=b"k",
                    partition=p,
                    timestamp_ms=1_000_000 + i * 1000,
                )
    finally:
        await producer.stop()
    a = ("-A", POISON_APP)

    shown = await streamjoin_cli(env, "offsets", "show", *a)
    assert shown.returncode == 0, shown.stderr
    assert f"group {app_id!r}: no active members" in shown.stdout
    assert [line.split() for line in shown.stdout.splitlines()[1:]] == [
        ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG"],
        [topic, "0", "-", "10", "10"],
        [topic, "1", "-", "10", "10"],
    ]

    moved = await streamjoin_cli(
        env, "offsets", "reset", *a, "--to-offset", "3", "--topic", topic, "--partition", "0"
    )
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.splitlines() == [
        f"{topic}[0]: none -> 3",
        f"committed 1 offsets for group {app_id!r}",
    ]
    assert await committed_offsets(kafka_bootstrap, app_id, topic, 2) == [3, 0]

    dry = await streamjoin_cli(env, "offsets", "reset", *a, "--to-earliest", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"{topic}[0]: 3 -> 0",
        f"{topic}[1]: none -> 0",
        "dry run: nothing committed (2 offsets would change)",
    ]
    assert await committed_offsets(kafka_bootstrap, app_id, topic, 2) == [3, 0]

    # the first record at or after 1_005_500 ms is record 6; ISO 8601 works as well
    by_time = await streamjoin_cli(env, "offsets", "reset", *a, "--to-time", "1005500")
    assert by_time.returncode == 0, by_time.stderr
    assert f"{topic}[0]: 3 -> 6" in by_time.stdout.splitlines()
    assert await committed_offsets(kafka_bootstrap, app_id, topic, 2) == [6, 6]
    iso = await streamjoin_cli(
        env, "offsets", "reset", *a, "--to-time", "1970-01-01T00:16:42Z", "--topic", topic
    )
    assert iso.returncode == 0, iso.stderr
    assert await committed_offsets(kafka_bootstrap, app_id, topic, 2) == [2, 2]  # 1_002_000 ms

    skipped = await streamjoin_cli(env, "offsets", "skip", *a, topic, "1", "2")
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.splitlines()[0] == f"{topic}[1]: 2 -> 3"
    assert await committed_offsets(kafka_bootstrap, app_id, topic, 2) == [2, 3]

    refused = await streamjoin_cli(env, "offsets", "skip", *a, topic, "1", "7")
    assert refused.returncode == 1
    assert "the group's next record in" in refused.stderr
    assert "would also skip 4 records before it (3..6)" in refused.stderr
    beyond = await streamjoin_cli(env, "offsets", "reset", *a, "--to-offset", "11")
    assert beyond.returncode == 1
    assert f"offset 11 is outside {topic}[0] (offsets 0..10" in beyond.stderr
    assert await committed_offsets(kafka_bootstrap, app_id, topic, 2) == [2, 3]


async def test_a_poison_record_under_stop_is_skipped_and_the_restarted_worker_goes_on(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    env = _poison_env(kafka_bootstrap, unique_topic, partitions=1)
    app_id, topic, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
    a = ("-A", POISON_APP)
    workers = Workers(POISON_APP, env, tmp_path)
    try:
        workers.start("w1", static=False)
        await wait_for_group(kafka_bootstrap, app_id, lambda i: len(i.members) == 1, workers)
        # moving offsets under a running worker is refused, and nothing moves
        refused = await streamjoin_cli(env, "offsets", "reset", *a, "--to-earliest")
        assert refused.returncode == 1
        assert f"group {app_id} has 1 active member; stop the workers first" in refused.stderr
        refused = await streamjoin_cli(env, "offsets", "skip", *a, topic, "0", "0", "--force")
        assert "stop the workers first" in refused.stderr

        await produce(kafka_bootstrap, topic, [("k", "a"), ("k", "b"), ("k", "poison")])
        await produce(kafka_bootstrap, topic, [("k", "c"), ("k", "d")])
        code = await asyncio.to_thread(workers.procs["w1"].wait, 60)
        assert code == 1, workers.logs()
        workers.procs.pop("w1")
        assert "poison record at offset 2" in workers.log_of("w1")
        assert [v for _, v, _ in await read_all(kafka_bootstrap, sink, 2)] == ["0:0:a", "0:1:b"]

        # the group's next record is the poison one: every restart would stop there again
        assert await committed_offsets(kafka_bootstrap, app_id, topic, 1) == [2]
        skipped = await streamjoin_cli(env, "offsets", "skip", *a, topic, "0", "2")
        assert skipped.returncode == 0, skipped.stderr
        assert skipped.stdout.splitlines() == [
            f"{topic}[0]: 2 -> 3",
            f"committed 1 offsets for group {app_id!r}",
        ]

        workers.start("w2", static=False)
        out = await read_all(kafka_bootstrap, sink, 4)
        assert [v for _, v, _ in out] == ["0:0:a", "0:1:b", "0:3:c", "0:4:d"]
        assert workers.procs["w2"].poll() is None  # still running past the poison record
    finally:
        workers.stop_all()
        workers.close()


async def test_assignment_shows_offsets_and_lag_per_partition_and_no_active_members(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    env = _poison_env(kafka_bootstrap, unique_topic, partitions=2)
    app_id, topic, sink = env["SJT_APP_ID"], env["SJT_SOURCE"], env["SJT_SINK"]
    workers = Workers(POISON_APP, env, tmp_path)
    try:
        workers.start("w1")
        await wait_for_group(kafka_bootstrap, app_id, lambda i: len(i.members) == 1, workers)
        await produce(kafka_bootstrap, topic, [(f"k{i}", f"v{i}") for i in range(20)])
        await read_all(kafka_bootstrap, sink, 20)
        deadline = time.monotonic() + 30
        while sum(await committed_offsets(kafka_bootstrap, app_id, topic, 2)) < 20:
            assert time.monotonic() < deadline, workers.logs()
            await asyncio.sleep(0.2)
        ends = await committed_offsets(kafka_bootstrap, app_id, topic, 2)

        running = await streamjoin_cli(env, "assignment", "-A", POISON_APP)
        assert running.returncode == 0, running.stderr
        lines = running.stdout.splitlines()
        assert lines[0] == f"group {app_id!r}: state Stable, 1 members"
        table = [line.split() for line in lines[lines.index("") + 1 :]]
        assert table == [
            ["TOPIC", "PARTITION", "OWNER", "COMMITTED", "END", "LAG"],
            [topic, "0", "w1", str(ends[0]), str(ends[0]), "0"],
            [topic, "1", "w1", str(ends[1]), str(ends[1]), "0"],
        ]
        # a static member stays in the group until its session times out: wait it out
        assert workers.stop("w1") == 0
        await produce(kafka_bootstrap, topic, [("k", "late-1"), ("k", "late-2")])
        deadline = time.monotonic() + 30
        while (await describe_group(kafka_bootstrap, app_id)).members:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)

        stopped = await streamjoin_cli(env, "assignment", "-A", POISON_APP)
        assert stopped.returncode == 0, stopped.stderr
        lines = stopped.stdout.splitlines()
        assert lines[0] == f"group {app_id!r}: no active members"
        assert "Empty" not in stopped.stdout and "Dead" not in stopped.stdout
        assert lines[1:3] == ["", lines[2]] and lines[2].split()[0] == "TOPIC"
        rows = [line.split() for line in lines[3:]]
        assert [r[2] for r in rows] == ["-", "-"]  # no owner
        assert sum(int(r[5]) for r in rows) == 2  # the two records written while stopped
        assert all(int(r[5]) == int(r[4]) - int(r[3]) for r in rows)
    finally:
        workers.stop_all()
        workers.close()


async def test_corruption_found_by_a_read_rebuilds_the_store_and_the_worker_goes_on(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A block checksum mismatch in a store that opened fine used to stop the worker with
    exit code 1 (the read's error went to the agent's on_error policy), and every restart
    stopped again at the same read."""
    partitions = 2
    workers = counter_workers(kafka_bootstrap, unique_topic, tmp_path, partitions)
    group, source, sink = (workers.env[k] for k in ("SJT_APP_ID", "SJT_SOURCE", "SJT_SINK"))
    keys = [f"k{i:02d}" for i in range(30)]
    try:
        workers.start("w1")
        await wait_for_group(kafka_bootstrap, group, lambda i: len(i.members) == 1, workers)
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys] * 2)
        await read_all(kafka_bootstrap, sink, 2 * len(keys))
        deadline = time.monotonic() + 30
        while sum(await committed_offsets(kafka_bootstrap, group, source, partitions)) < 60:
            assert time.monotonic() < deadline, workers.logs()
            await asyncio.sleep(0.2)
        assert workers.stop("w1") == 0

        # flip bytes in a data block of each partition's store: it still opens
        for p in range(partitions):
            store_dir = workers.state_dir("w1") / "stores" / "counts"  # (the table's database)
            store = RocksDBStorePartition(store_dir, table="counts", partition=p)
            first_key = next(iter(store.items()))[0]
            store.close()
            corrupt_data_block(store_dir, "counts", p, first_key)

        workers.start("w1")  # the same static member, on the same state dir
        await produce(kafka_bootstrap, source, [(k, "x") for k in keys])
        deadline = time.monotonic() + 60
        latest: dict[str, str] = {}
        while time.monotonic() < deadline:
            out = await read_all(kafka_bootstrap, sink, 3 * len(keys), timeout=5)
            latest = {k: v for k, v, _ in out}
            if all(latest.get(k) == f"{k}=3" for k in keys):
                break
        log = workers.log_of("w1")
        assert {k: latest.get(k) for k in keys} == {k: f"{k}=3" for k in keys}, workers.logs()
        assert "is corrupted" in log and "rebuild it from the changelog" in log, log[-4000:]
        assert "restoring counts[" in log, log[-4000:]
        assert workers.procs["w1"].poll() is None, log[-4000:]  # still running
    finally:
        workers.stop_all()
        workers.close()
