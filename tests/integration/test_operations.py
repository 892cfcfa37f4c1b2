"""Operating a worker on the real broker: its state directory, moving a group's offsets,
``streamjoin assignment``'s lag columns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import streamjoin
from streamjoin.errors import StateDirInUse
from streamjoin.runtime.group_info import describe_group
from streamjoin.runtime.streams import Stream


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
