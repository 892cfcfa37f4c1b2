"""A test app for worker processes: one timer that runs only on the group's leader.

Every $SJT_INTERVAL seconds the leader sends ``<pid>:<wall time>`` to $SJT_SINK, so a
test can tell which worker process ran each tick. The app reads no topic: its workers join
the group only to elect the leader.
"""

from __future__ import annotations

import os
import time

import streamjoin

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "ticker"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    consumer_options={"session_timeout_ms": 6_000, "heartbeat_interval_ms": 500},
)
sink = app.topic(
    os.environ.get("SJT_SINK", "ticks"), key_serializer="str", value_serializer="str", partitions=1
)


@app.timer(float(os.environ.get("SJT_INTERVAL", "0.2")), on_leader=True, name="leader-tick")
async def leader_tick() -> None:
    who = str(os.getpid())
    await sink.send(key=who, value=f"{who}:{time.time():.3f}")
