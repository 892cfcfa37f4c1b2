"""A test app for the exactly-once tests: a stream-stream join AND a counting table.

* The demo's ad join: impressions ($SJT_IMPRESSIONS) and clicks ($SJT_CLICKS), inner,
  10 minute window, 30 s grace, results to $SJT_OUTPUT as
  ``{"auction_id", "impression_id", "click_id"}``.
* A counter: events of $SJT_EVENTS counted per key in the table ``counts``; every update
  is sent to $SJT_COUNTS as "<key>=<count>", so a reader sees the whole sequence of
  counts per key (exactly 1..n under exactly-once).
* If $SJT_BATCH_COUNTS is set, the same count again by an agent that takes its events in
  batches (``stream.take``), into the table ``batch-counts`` and that topic.

Both run in every worker, so one worker's commit (one transaction under exactly-once)
covers join outputs, join-state changelogs, the table's changelog and the offsets of
three input topics at once.

$SJT_GUARANTEE is the processing guarantee (at_least_once by default);
$SJT_SESSION_TIMEOUT_MS the consumer's session timeout (10 s by default; the broker's
minimum is 6 s); $SJT_COMMIT_INTERVAL the commit interval in seconds (the App's default
for the guarantee when unset); $SJT_WORK_MS (0 by default) makes every input event cost
that much CPU, so a backlog takes a predictable while to process.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import streamjoin
from streamjoin.events import Event
from streamjoin.runtime.tasks.agent_runtime import Stream

_interval = os.environ.get("SJT_COMMIT_INTERVAL")
app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "eos"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    processing_guarantee=os.environ.get("SJT_GUARANTEE", "at_least_once"),
    consumer_options={
        "session_timeout_ms": int(os.environ.get("SJT_SESSION_TIMEOUT_MS", "10000")),
        "heartbeat_interval_ms": 1_000,
    },
    # unset: the App's default for the guarantee (100 ms under exactly-once)
    **({"commit_interval": float(_interval)} if _interval else {}),
)
PARTITIONS = int(os.environ.get("SJT_PARTITIONS", "6"))
WORK_S = float(os.environ.get("SJT_WORK_MS", "0")) / 1000


def _topic(env: str, value_serializer: str) -> Any:
    return app.topic(
        os.environ[env],
        key_serializer="str",
        value_serializer=value_serializer,
        partitions=PARTITIONS,
    )


impressions = _topic("SJT_IMPRESSIONS", "json")
clicks = _topic("SJT_CLICKS", "json")
attributed = _topic("SJT_OUTPUT", "json")
events = _topic("SJT_EVENTS", "str")
count_updates = _topic("SJT_COUNTS", "str")
counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=events)


def _work() -> None:
    busy_until = time.perf_counter() + WORK_S
    while time.perf_counter() < busy_until:
        pass


def costly_event_time(event: Event) -> int:
    _work()
    return event.timestamp


@app.join(
    impressions,
    clicks,
    window=timedelta(minutes=10),
    grace=timedelta(seconds=30),
    output=attributed,
    name="ad-clicks",
    left_timestamp=costly_event_time if WORK_S else None,
    right_timestamp=costly_event_time if WORK_S else None,
)
def ad_clicks(auction_id: str, impression: dict[str, Any], click: dict[str, Any]) -> Any:
    return {
        "auction_id": auction_id,
        "impression_id": impression["impression_id"],
        "click_id": click["click_id"],
    }


@app.agent(events, name="count")
async def count(stream: Stream) -> None:
    async for event in stream:
        if WORK_S:
            _work()
        counts[event.key] += 1
        await count_updates.send(key=event.key, value=f"{event.key}={counts[event.key]}")


if "SJT_BATCH_COUNTS" in os.environ:
    # The same count by an agent that takes its events in batches (``stream.take``): a
    # batch's events count as processed together, so a crash inside one must replay all of
    # it and a commit must never split it.
    batch_counts = app.table(
        "batch-counts", default=int, key_serializer="str", copartitioned_with=events
    )
    batch_count_updates = _topic("SJT_BATCH_COUNTS", "str")

    @app.agent(events, name="count-batches")
    async def count_batches(stream: Stream) -> None:
        async for batch in stream.take(16, within=0.05):
            for event in batch:
                batch_counts[event.key] += 1
                update = f"{event.key}={batch_counts[event.key]}"
                await batch_count_updates.send(key=event.key, value=update)
