"""A stateful test app for worker processes: counts events per key in a table.

Every update is also sent to $SJT_SINK as "<key>=<count>", so tests can read
the counts a worker holds (after a restore, the next event of a key shows the
restored count + 1). $SJT_WORK_MS (default 0) makes each event cost that much CPU,
so a backlog takes a predictable while to process. $SJT_GUARANTEE is the processing
guarantee (at_least_once by default); $SJT_SESSION_TIMEOUT_MS the consumer's session
timeout (10 s by default; the broker's minimum is 6 s).
"""

from __future__ import annotations

import os
import time

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "counter"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=float(os.environ.get("SJT_COMMIT_INTERVAL", "0.3")),
    processing_guarantee=os.environ.get("SJT_GUARANTEE", "at_least_once"),
    standby_replicas=int(os.environ.get("SJT_STANDBYS", "0")),
    consumer_options={
        "session_timeout_ms": int(os.environ.get("SJT_SESSION_TIMEOUT_MS", "10000")),
        "heartbeat_interval_ms": 1_000,
    },
    rebalance_protocol=os.environ.get("SJT_PROTOCOL", "cooperative"),
    high_availability=os.environ.get("SJT_HIGH_AVAILABILITY") == "1",
    acceptable_recovery_lag=int(os.environ.get("SJT_RECOVERY_LAG", "10000")),
    probing_rebalance_interval=float(os.environ.get("SJT_PROBING_S", "600")),
    status_log_interval=float(os.environ.get("SJT_STATUS_LOG_S", "30")),
)
source = app.topic(
    os.environ.get("SJT_SOURCE", "events"),
    key_serializer="str",
    value_serializer="str",
    partitions=int(os.environ.get("SJT_PARTITIONS", "4")),
)
sink = app.topic(
    os.environ.get("SJT_SINK", "counts"), key_serializer="str", value_serializer="str", partitions=1
)
WORK_S = float(os.environ.get("SJT_WORK_MS", "0")) / 1000
counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)


@app.agent(source, name="count")
async def count(stream: Stream) -> None:
    async for event in stream:
        if WORK_S:
            busy_until = time.perf_counter() + WORK_S
            while time.perf_counter() < busy_until:
                pass
        counts[event.key] += 1
        await sink.send(key=event.key, value=f"{event.key}={counts[event.key]}")
