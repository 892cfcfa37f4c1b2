"""The App runtime on the real broker: in-process embedding and worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import streamjoin
from streamjoin.runtime.admin import TopicSpec, ensure_topics
from streamjoin.runtime.streams import Stream
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
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    name = unique_topic("in")
    await ensure_topics(kafka_bootstrap, [TopicSpec(name, 3)])
    app = streamjoin.App(unique_topic("app"), broker=f"kafka://{kafka_bootstrap}")
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
        assert worker is not None and worker.consumer is not None

        async def broken_commit(tasks: object = None) -> None:
            raise RuntimeError("injected commit failure")

        worker.consumer.commit = broken_commit  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="injected commit failure"):
            await asyncio.wait_for(app.wait(), timeout=30)
    finally:
        await app.stop()
    assert app.assignment == set()
