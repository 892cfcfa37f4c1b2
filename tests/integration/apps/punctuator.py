"""A test app for worker processes whose only work is a wall-clock punctuation.

Nothing is produced to $SJT_SOURCE: every $SJT_EVERY_MS (default 100) each running task
of the agent reading it adds 1 to its own row ``runs`` of the table ``runs`` (its task's
partition) and sends ``{"partition", "runs", "pid"}`` to $SJT_SINK, so a test reads how
far each task's count had got, and whether a restarted worker goes on from the count
its predecessor had flushed ($SJT_GUARANTEE: the processing guarantee).
"""

from __future__ import annotations

import os

import streamjoin
from streamjoin.punctuation import PunctuationContext
from streamjoin.stream import Stream

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "punctuator"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=float(os.environ.get("SJT_COMMIT_INTERVAL", "0.2")),
    processing_guarantee=os.environ.get("SJT_GUARANTEE", "at_least_once"),
    consumer_options={"session_timeout_ms": 6_000, "heartbeat_interval_ms": 1_000},
)
source = app.topic(
    os.environ.get("SJT_SOURCE", "events"),
    key_serializer="str",
    value_serializer="json",
    partitions=int(os.environ.get("SJT_PARTITIONS", "2")),
)
sink = app.topic(
    os.environ.get("SJT_SINK", "runs"), key_serializer="str", value_serializer="json", partitions=1
)
runs = app.table("runs", default=int, key_serializer="str", copartitioned_with=source)


@app.agent(source, name="idle")
async def idle(stream: Stream) -> None:
    async for _ in stream:
        pass


@app.punctuate(idle, every_ms=int(os.environ.get("SJT_EVERY_MS", "100")), type="wall_clock")
async def count_runs(context: PunctuationContext) -> None:
    runs["runs"] += 1
    value = {"partition": context.partition, "runs": runs["runs"], "pid": os.getpid()}
    await context.send(sink, key=str(context.partition), value=value)
