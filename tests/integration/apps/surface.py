"""A test app for the stream surface: ``front`` reads $SJT_SOURCE through filter, an async
map and echo (to $SJT_COPY), and yields to ``back``, an agent with no topic of its own,
which yields to $SJT_OUT. Values starting with "drop" are filtered out."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import streamjoin
from streamjoin.stream import Stream

#: the value whose map raises when the app is built with crash_on
POISON = "v-70"


def surface_app(
    bootstrap: str,
    app_id: str,
    names: Mapping[str, str],
    guarantee: str,
    state: Path | None = None,
    *,
    crash_on: str | None = None,
    work_ms: int = 0,
) -> streamjoin.App:
    """``crash_on``: the value on which ``front``'s map raises (its on_error is "stop": the
    worker stops, as in a crash); ``work_ms``: how long the map takes per record."""
    app = streamjoin.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        processing_guarantee=guarantee,
        commit_interval=0.2,
        state_dir=state,
        topic_partitions=2,
        key_serializer="str",
        value_serializer="str",
        group_instance_id="w1",
        consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
    )
    source = app.topic(names["source"])
    copy = app.topic(names["copy"], partitions=1)
    out = app.topic(names["out"], partitions=1)

    async def check(value: str) -> str:
        if work_ms:
            await asyncio.sleep(work_ms / 1000)
        if value == crash_on:
            raise RuntimeError("crash in map")
        return value

    @app.agent(sink=[out])
    async def back(stream: Stream) -> AsyncIterator[str]:
        async for value in stream.values():
            yield value

    @app.agent(source, sink=[back])
    async def front(stream: Stream) -> AsyncIterator[str]:
        kept = stream.values().filter(lambda v: not v.startswith("drop")).map(check)
        async for value in kept.echo(copy):
            yield value

    return app


app = surface_app(
    os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092").removeprefix("kafka://"),
    os.environ.get("SJT_APP_ID", "surface"),
    {part: os.environ.get(f"SJT_{part.upper()}", part) for part in ("source", "copy", "out")},
    os.environ.get("SJT_GUARANTEE", "at_least_once"),
    work_ms=int(os.environ.get("SJT_WORK_MS", "0")),
)
