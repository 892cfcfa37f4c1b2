"""A test app whose agent stops on a poison record: forwards every record of $SJT_SOURCE
to $SJT_SINK as "<partition>:<offset>:<value>", and raises on the value "poison" under
``on_error="stop"`` (so every restart stops at it again, until its offset is skipped)."""

from __future__ import annotations

import os

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "poison-stop"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.2,
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
)
source = app.topic(
    os.environ.get("SJT_SOURCE", "source"),
    key_serializer="str",
    value_serializer="str",
    partitions=int(os.environ.get("SJT_PARTITIONS", "1")),
)
sink = app.topic(
    os.environ.get("SJT_SINK", "sink"), key_serializer="str", value_serializer="str", partitions=1
)


@app.agent(source, on_error="stop", name="forward")
async def forward(stream: Stream) -> None:
    async for event in stream:
        if event.value == "poison":
            raise ValueError(f"poison record at offset {event.offset}")
        await sink.send(key=event.key, value=f"{event.partition}:{event.offset}:{event.value}")
