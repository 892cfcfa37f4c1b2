"""A test app for worker processes: forwards every record of $SJT_SOURCE to $SJT_SINK.

Each output record carries the worker's instance id in a header, so tests can
tell who processed what. A value of "poison" raises (dead-lettered).
"""

from __future__ import annotations

import os

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "forwarder"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.2,
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
)
source = app.topic(
    os.environ.get("SJT_SOURCE", "source"),
    key_serializer="str",
    value_serializer="str",
    partitions=int(os.environ.get("SJT_PARTITIONS", "6")),
)
sink = app.topic(
    os.environ.get("SJT_SINK", "sink"), key_serializer="str", value_serializer="str", partitions=1
)


@app.agent(source, on_error="dead_letter", name="forward")
async def forward(stream: Stream) -> None:
    async for event in stream:
        if event.value == "poison":
            raise ValueError("poison record")
        who = (app.config.group_instance_id or "anonymous").encode()
        await sink.send(
            key=event.key,
            value=f"{event.partition}:{event.offset}:{event.value}",
            headers=[("worker", who)],
        )
