"""A test app for final window results: events of $SJT_SOURCE counted per key in a windowed
table with ``emit="close"``, whose final results go to $SJT_FINALS (key: the key, value:
the count as JSON, window bounds in the ``window-start``/``window-end`` headers).

$SJT_WINDOW is ``tumbling`` (1 s windows) or ``hopping`` (2 s windows every 1 s), with
$SJT_GRACE_MS of grace (default 0); $SJT_GUARANTEE the processing guarantee
(at_least_once by default); $SJT_PARTITIONS the source's partition count (4).
"""

from __future__ import annotations

import os
from typing import Any

import streamjoin
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.windows import HoppingWindows, TumblingWindows

_guarantee = os.environ.get("SJT_GUARANTEE", "at_least_once")
app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "closer"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    processing_guarantee=_guarantee,
    consumer_options={"session_timeout_ms": 6_000, "heartbeat_interval_ms": 1_000},
    **({} if _guarantee == "exactly_once" else {"commit_interval": 0.3}),
)
source = app.topic(
    os.environ.get("SJT_SOURCE", "events"),
    key_serializer="str",
    value_serializer="str",
    partitions=int(os.environ.get("SJT_PARTITIONS", "4")),
)
finals = app.topic(
    os.environ.get("SJT_FINALS", "finals"), key_serializer="str", value_serializer="json"
)
GRACE_MS = int(os.environ.get("SJT_GRACE_MS", "0"))
window: Any = (
    HoppingWindows(size_ms=2_000, step_ms=1_000, grace_ms=GRACE_MS)
    if os.environ.get("SJT_WINDOW") == "hopping"
    else TumblingWindows(size_ms=1_000, grace_ms=GRACE_MS)
)
counts = app.table(
    "counts",
    default=int,
    key_serializer="str",
    window=window,
    copartitioned_with=source,
    emit="close",
    emit_to=finals,
)


@app.agent(source, name="count")
async def count(stream: Stream) -> None:
    async for event in stream:
        counts.update(event.key, lambda n: n + 1)
