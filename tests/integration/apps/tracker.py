"""A stateful test app that records who processed what, and when: for rebalance measurements.

It counts events per key in a table (so its tasks have state, a changelog and standbys) and,
for every event, appends one line to ``$SJT_TRACE_DIR/<worker>.<pid>.trace``: worker, pid,
topic, partition, offset, wall-clock time, key and the key's new count
(``benchmarks.rebalance_analysis.Processed`` is the format and reads it back). A file per
process, written with one ``write`` per event, survives a kill -9 up to the event being
processed, and costs the broker nothing (a sink topic would add load and batching delay).

Environment: $SJT_BROKER, $SJT_APP_ID, $SJT_SOURCE, $SJT_PARTITIONS (12), $SJT_STANDBYS (0),
$SJT_SESSION_TIMEOUT_MS (10000), $SJT_COMMIT_INTERVAL (0.3 s), $SJT_TRACE_DIR (required),
$SJT_WORKER (the name in the trace; default: the worker's --instance-id, else its pid), and
$SJT_REBALANCE_PROTOCOL: when set, passed as ``rebalance_protocol`` to the App (unset: the
App's default), so the same app measures eager and cooperative rebalancing;
$SJT_HIGH_AVAILABILITY: "1" or "0" sets the App's ``high_availability``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import streamjoin
from benchmarks.rebalance_analysis import TRACE_SUFFIX, Processed
from streamjoin.runtime.tasks.agent_runtime import Stream

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "tracker"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=float(os.environ.get("SJT_COMMIT_INTERVAL", "0.3")),
    standby_replicas=int(os.environ.get("SJT_STANDBYS", "0")),
    consumer_options={
        "session_timeout_ms": int(os.environ.get("SJT_SESSION_TIMEOUT_MS", "10000")),
        "heartbeat_interval_ms": 1_000,
    },
)


PROTOCOL = os.environ.get("SJT_REBALANCE_PROTOCOL")
if PROTOCOL:
    app.configure(rebalance_protocol=PROTOCOL)
if os.environ.get("SJT_HIGH_AVAILABILITY"):
    app.configure(high_availability=os.environ["SJT_HIGH_AVAILABILITY"] == "1")

source = app.topic(
    os.environ.get("SJT_SOURCE", "events"),
    key_serializer="str",
    value_serializer="str",
    partitions=int(os.environ.get("SJT_PARTITIONS", "12")),
)
counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)
TRACE_DIR = Path(os.environ["SJT_TRACE_DIR"])


class Trace:
    """This process's trace file, opened at the first event (the CLI sets the instance id
    after this module is imported)."""

    def __init__(self) -> None:
        self.fd = -1
        self.worker = ""

    def write(self, record: Processed) -> None:
        os.write(self.fd, record.to_line().encode())

    def open(self) -> None:
        pid = os.getpid()
        self.worker = os.environ.get("SJT_WORKER") or app.config.group_instance_id or str(pid)
        path = TRACE_DIR / f"{self.worker}.{pid}{TRACE_SUFFIX}"
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


trace = Trace()


@app.agent(source, name="track")
async def track(stream: Stream) -> None:
    async for event in stream:
        counts[event.key] += 1
        if trace.fd < 0:
            trace.open()
        trace.write(
            Processed(
                trace.worker,
                os.getpid(),
                event.topic,
                event.partition,
                event.offset,
                time.time(),
                event.key,
                counts[event.key],
            )
        )
