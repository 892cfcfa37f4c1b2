"""The App runtime on the real broker: in-process embedding and worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import (
    Workers,
    active_by_instance,
    committed_offsets,
    produce,
    read_all,
    wait_for_group,
)


async def test_embedded_app_processes_every_record_exactly_once(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    source_name, sink_name = unique_topic("in"), unique_topic("out")
    app = streamjoin.App(
        unique_topic("app"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path,
    )
    source = app.topic(source_name, key_serializer="str", value_serializer="str", partitions=4)
    sink = app.topic(sink_name, key_serializer="str", value_serializer="str", partitions=2)

    @app.agent(source)
    async def double(stream: Stream) -> None:
        async for key, value in stream.items():
            await sink.send(key=key, value=value * 2)

    records = [(f"key-{i % 13}", f"v{i}") for i in range(200)]
    async with app:
        await produce(kafka_bootstrap, source_name, records)
        out = await read_all(kafka_bootstrap, sink_name, len(records))
        assert sorted(v for _, v, _ in out) == sorted(v * 2 for _, v in records)
        await asyncio.sleep(0.5)  # a commit interval
    committed = await committed_offsets(kafka_bootstrap, app.id, source_name, 4)
    assert sum(committed) == len(records)


async def test_existing_topic_with_wrong_partition_count_is_a_startup_error(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    name = unique_topic("in")
    await ensure_topics(kafka_bootstrap, [TopicSpec(name, 3)])
    app = streamjoin.App(
        unique_topic("app"), broker=f"kafka://{kafka_bootstrap}", state_dir=tmp_path / "state"
    )
    topic = app.topic(name, partitions=5)

    @app.agent(topic)
    async def noop(stream: Stream) -> None:
        async for _ in stream:
            pass

    from streamjoin.errors import CopartitioningError

    with pytest.raises(CopartitioningError, match="exists with 3 partitions"):
        await app.start()
    assert not app.running


async def test_copartitioned_topics_with_different_counts_fail_at_startup(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    from streamjoin.errors import CopartitioningError

    app = streamjoin.App(unique_topic("app"), broker=f"kafka://{kafka_bootstrap}")
    a = app.topic(unique_topic("a"), partitions=4)
    b = app.topic(unique_topic("b"), partitions=6)
    app.copartition(a, b)
    with pytest.raises(CopartitioningError, match=r"4 partitions.*6 partitions"):
        await app.start()


@pytest.fixture
def workers(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Workers]:
    env = {
        **os.environ,
        "SJT_APP_ID": unique_topic("fwd"),
        "SJT_BROKER": f"kafka://{kafka_bootstrap}",
        "SJT_SOURCE": unique_topic("src"),
        "SJT_SINK": unique_topic("sink"),
        "SJT_PARTITIONS": "6",
        "PYTHONUNBUFFERED": "1",
    }
    group = Workers("tests.integration.apps.forwarder:app", env, tmp_path)
    yield group
    group.close()


async def test_three_workers_share_partitions_and_only_the_stopped_ones_move(
    kafka_bootstrap: str, workers: Workers
) -> None:
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    for name in ("w1", "w2", "w3"):
        workers.start(name)
    info = await wait_for_group(
        kafka_bootstrap,
        group,
        lambda i: (
            len(i.members) == 3 and all(len(m.active.get(source, [])) == 2 for m in i.members)
        ),
        workers,
    )
    before = active_by_instance(info, source)
    assert set().union(*before.values()) == set(range(6))

    await produce(kafka_bootstrap, source, [(f"k{i}", f"v{i}") for i in range(60)])
    out = await read_all(kafka_bootstrap, workers.env["SJT_SINK"], 60)
    assert len({v for _, v, _ in out}) == 60

    assert workers.stop("w3") == 0  # clean SIGTERM shutdown exits 0
    info = await wait_for_group(
        kafka_bootstrap,
        group,
        lambda i: (
            len(i.members) == 2 and sum(len(m.active.get(source, [])) for m in i.members) == 6
        ),
        workers,
        timeout=90,
    )
    after = active_by_instance(info, source)
    for name in ("w1", "w2"):
        # sticky: the survivors keep everything they had and split w3's partitions
        assert before[name] <= after[name], (before, after)
        assert len(after[name]) == 3
    assert after["w1"] | after["w2"] == set(range(6))


async def test_restarted_worker_with_same_instance_id_gets_its_partitions_back(
    kafka_bootstrap: str, workers: Workers
) -> None:
    group, source = workers.env["SJT_APP_ID"], workers.env["SJT_SOURCE"]
    for name in ("w1", "w2"):
        workers.start(name)
    info = await wait_for_group(
        kafka_bootstrap,
        group,
        lambda i: (
            len(i.members) == 2 and all(len(m.active.get(source, [])) == 3 for m in i.members)
        ),
        workers,
    )
    before = active_by_instance(info, source)
    workers.stop("w2", signal.SIGKILL)
    workers.start("w2")
    info = await wait_for_group(
        kafka_bootstrap,
        group,
        lambda i: (
            len(i.members) == 2 and all(len(m.active.get(source, [])) == 3 for m in i.members)
        ),
        workers,
    )
    assert active_by_instance(info, source) == before


async def test_poison_record_goes_to_dead_letter_and_processing_continues(
    kafka_bootstrap: str, workers: Workers
) -> None:
    group, source, sink = (
        workers.env["SJT_APP_ID"],
        workers.env["SJT_SOURCE"],
        workers.env["SJT_SINK"],
    )
    workers.start("w1")
    await wait_for_group(
        kafka_bootstrap, group, lambda i: len(i.members) == 1 and bool(i.members[0].active), workers
    )
    await produce(kafka_bootstrap, source, [("a", "one"), ("a", "poison"), ("a", "two")])
    out = await read_all(kafka_bootstrap, sink, 2)
    assert [v.split(":")[-1] for _, v, _ in out] == ["one", "two"]
    dead = await read_all(kafka_bootstrap, f"{group}-forward-dead-letters", 1)
    assert [(k, v) for k, v, _ in dead] == [("a", "poison")]
    assert b"poison record" in dead[0][2]["streamjoin-error"]


async def test_a_failing_commit_stops_the_worker_instead_of_leaving_it_in_the_group(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    """An unexpected error in the consumer's commit loop (CI saw StoreClosed there) must stop
    the worker with that error. It used to crash only the consumer service: the worker
    went on heartbeating, so the group kept its partitions on a member that never
    processed or committed them again."""
    source_name = unique_topic("in")
    app = streamjoin.App(
        unique_topic("app"),
        broker=f"kafka://{kafka_bootstrap}",
        commit_interval=0.2,
        state_dir=tmp_path,
    )
    source = app.topic(source_name, key_serializer="str", value_serializer="str", partitions=2)

    @app.agent(source)
    async def ignore(stream: Stream) -> None:
        async for _ in stream:
            pass

    await app.start()
    try:
        worker = app._worker
        assert worker is not None and worker.member is not None

        async def broken_commit(tasks: object = None) -> None:
            raise RuntimeError("injected commit failure")

        worker.member.commit = broken_commit  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="injected commit failure"):
            await asyncio.wait_for(app.wait(), timeout=30)
    finally:
        await app.stop()
    assert app.assignment == set()


def _batch_app(
    app_id: str, bootstrap: str, source_name: str, sink_name: str, state_dir: Path
) -> tuple[streamjoin.App, list[int]]:
    """``stream.take``: one summary record per batch and the batch's keys counted in a
    table, both after the loop (a bulk write); a batch with a poison record is dead-lettered
    as a whole."""
    app = streamjoin.App(
        app_id, broker=f"kafka://{bootstrap}", commit_interval=0.2, state_dir=state_dir
    )
    source = app.topic(source_name, key_serializer="str", value_serializer="str", partitions=4)
    sink = app.topic(sink_name, key_serializer="str", value_serializer="json", partitions=1)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)
    sizes: list[int] = []

    @app.agent(source, on_error="dead_letter", name="batches")
    async def batches(stream: Stream) -> None:
        async for batch in stream.take(50, within=0.2):
            sizes.append(len(batch))
            keys = [key for key, _ in batch.items()]
            if "poison" in (event.value for event in batch):
                raise ValueError("poison record")
            for key in keys:  # one task: every key of the batch is in its partition
                counts[key] += 1
            await sink.send(key="summary", value=keys)

    return app, sizes


async def _summarized(bootstrap: str, topic: str, at_least: int) -> list[str]:
    """Every key in the summary records, once they cover at least ``at_least`` events."""
    while True:
        out = await read_all(bootstrap, topic, 1)
        keys = [key for _, value, _ in out for key in json.loads(value)]
        if len(keys) >= at_least:
            return keys
        await asyncio.sleep(0.2)


async def test_batches_through_the_broker_count_every_record_once_across_a_restart(
    kafka_bootstrap: str, unique_topic: Callable[..., str], tmp_path: Path
) -> None:
    app_id, source_name, sink_name = unique_topic("app"), unique_topic("in"), unique_topic("out")
    dead_letters = f"{app_id}-batches-dead-letters"
    first = [(f"key-{i % 11}", f"v{i}") for i in range(600)]
    first[300] = ("key-3", "poison")
    second = [(f"key-{i % 11}", f"w{i}") for i in range(400)]

    app, sizes = _batch_app(app_id, kafka_bootstrap, source_name, sink_name, tmp_path)
    async with app:
        await produce(kafka_bootstrap, source_name, first)
        dead = await read_all(kafka_bootstrap, dead_letters, 1)
        await _summarized(kafka_bootstrap, sink_name, len(first) - len(dead))
        await asyncio.sleep(0.5)  # a commit interval
    assert max(sizes) > 1  # batches, not single events
    # a clean stop committed what was processed: the restarted app goes on from there
    app, _ = _batch_app(app_id, kafka_bootstrap, source_name, sink_name, tmp_path)
    async with app:
        await produce(kafka_bootstrap, source_name, second)
        keys = await _summarized(kafka_bootstrap, sink_name, len(first) + len(second) - len(dead))
        await asyncio.sleep(0.5)
        counted = {key: n for p in range(4) for key, n in app.tables["counts"].local_items(p)}
    dead = await read_all(kafka_bootstrap, dead_letters, 1)
    assert ("key-3", "poison") in [(k, v) for k, v, _ in dead]
    assert all(b"poison record" in headers["streamjoin-error"] for _, _, headers in dead)
    # every record exactly once: summarized, or dead-lettered with its batch
    seen = sorted(keys + [k for k, _, _ in dead])
    assert seen == sorted(k for k, _ in first + second)
    summarized: dict[str, int] = {}
    for key in keys:
        summarized[key] = summarized.get(key, 0) + 1
    assert counted == summarized
    committed = await committed_offsets(kafka_bootstrap, app_id, source_name, 4)
    assert sum(committed) == len(first) + len(second)
