"""The worker of ``group_scale.py``: one small counting table, mostly idle.

    BENCH_APP_ID=... BENCH_INPUT=... STREAMJOIN_BROKER=kafka://127.0.0.1:PORT \
    [BENCH_PROTOCOL=cooperative|eager] [BENCH_STANDBYS=0] [BENCH_HEARTBEAT_MS=3000] \
        python -m streamjoin.cli worker -A benchmarks.group_scale_app:app

Everything else is the App's defaults (session timeout, heartbeat interval unless
``BENCH_HEARTBEAT_MS`` is set), so the rebalances measured are the ones users get.
"""

from __future__ import annotations

import os

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

_heartbeat = os.environ.get("BENCH_HEARTBEAT_MS")

app = streamjoin.App(
    os.environ.get("BENCH_APP_ID", "group-scale"),
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    rebalance_protocol=os.environ.get("BENCH_PROTOCOL", "cooperative"),
    standby_replicas=int(os.environ.get("BENCH_STANDBYS", "0")),
    consumer_options={"heartbeat_interval_ms": int(_heartbeat)} if _heartbeat else {},
)
source = app.topic(
    os.environ.get("BENCH_INPUT", "events"), key_serializer="str", value_serializer="str"
)
counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)


@app.agent(source, name="count")
async def count(stream: Stream) -> None:
    async for event in stream:
        counts[event.key] += 1
