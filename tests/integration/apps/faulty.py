"""A test app for fault handling: $SJT_SOURCE events are counted in a table and forwarded
to $SJT_SINK, unless their value says otherwise:

* ``poison``: raises (the agent's policy is $SJT_ON_ERROR, default ``stop``);
* ``fail-after-N``: waits N seconds, then raises;
* ``hang``: never finishes.

A left windowed join of $SJT_LEFT and $SJT_RIGHT (1 s window, no grace) writes
$SJT_JOINED: records with old timestamps are late events for it.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "faulty"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.3,
    consumer_options={"session_timeout_ms": 6_000, "heartbeat_interval_ms": 1_000},
)
PARTITIONS = int(os.environ.get("SJT_PARTITIONS", "2"))
source = app.topic(
    os.environ.get("SJT_SOURCE", "source"),
    key_serializer="str",
    value_serializer="str",
    partitions=PARTITIONS,
)
sink = app.topic(
    os.environ.get("SJT_SINK", "sink"), key_serializer="str", value_serializer="str", partitions=1
)
counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)


@app.agent(source, name="work", on_error=os.environ.get("SJT_ON_ERROR", "stop"))  # type: ignore[arg-type]
async def work(stream: Stream) -> None:
    async for event in stream:
        value = event.value or ""
        if value == "poison":
            raise ValueError("poison record")
        if value.startswith("fail-after-"):
            await asyncio.sleep(float(value.removeprefix("fail-after-")))
            raise RuntimeError("failed after waiting")
        if value == "hang":
            await asyncio.Event().wait()
        counts[event.key] += 1
        await sink.send(key=event.key, value=f"{event.key}={counts[event.key]}")


if os.environ.get("SJT_LEFT"):
    left = app.topic(
        os.environ["SJT_LEFT"], key_serializer="str", value_serializer="str", partitions=PARTITIONS
    )
    right = app.topic(
        os.environ["SJT_RIGHT"], key_serializer="str", value_serializer="str", partitions=PARTITIONS
    )
    joined = app.topic(
        os.environ["SJT_JOINED"], key_serializer="str", value_serializer="str", partitions=1
    )

    @app.join(left, right, window=timedelta(seconds=1), how="left", output=joined, name="pairs")
    def pair(key: str, left_value: str, right_value: str | None) -> str:
        return f"{left_value}+{right_value}"
