"""A test app for the broker-restart test: counts events per key in a table and says, for
each event, which one it was.

Every event of $SJT_SOURCE (value: a unique event id) adds one to its key's count in the
table ``counts`` (so its changelog ``<app id>-counts-changelog`` holds the counts) and sends
``{"id": <event id>, "count": <the key's count after it>}`` to $SJT_OUTPUT under the same
key: a reader finds which inputs have an output, which have more than one, and per key the
sequence of counts. $SJT_GUARANTEE is the processing guarantee (at_least_once by default);
$SJT_SESSION_TIMEOUT_MS the group session timeout (10 s by default);
$SJT_PARTITIONS the partitions of both topics (4 by default); $SJT_TABLE_STORE the
table's store (rocksdb by default, or memory); $SJT_TTL_MS makes it a TTL table;
$SJT_STANDBYS the standby replicas (0 by default).
"""

from __future__ import annotations

import os

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "ledger"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    processing_guarantee=os.environ.get("SJT_GUARANTEE", "at_least_once"),
    standby_replicas=int(os.environ.get("SJT_STANDBYS", "0")),
    consumer_options={
        "session_timeout_ms": int(os.environ.get("SJT_SESSION_TIMEOUT_MS", "10000")),
        "heartbeat_interval_ms": 1_000,
    },
)
PARTITIONS = int(os.environ.get("SJT_PARTITIONS", "4"))
source = app.topic(
    os.environ["SJT_SOURCE"], key_serializer="str", value_serializer="str", partitions=PARTITIONS
)
output = app.topic(
    os.environ["SJT_OUTPUT"], key_serializer="str", value_serializer="json", partitions=PARTITIONS
)
counts = app.table(
    "counts",
    default=int,
    key_serializer="str",
    copartitioned_with=source,
    store=os.environ.get("SJT_TABLE_STORE", "rocksdb"),  # type: ignore[arg-type]
    ttl_ms=int(os.environ["SJT_TTL_MS"]) if "SJT_TTL_MS" in os.environ else None,
)


@app.agent(source, name="ledger")
async def ledger(stream: Stream) -> None:
    async for event in stream:
        counts[event.key] += 1
        await output.send(key=event.key, value={"id": event.value, "count": counts[event.key]})
