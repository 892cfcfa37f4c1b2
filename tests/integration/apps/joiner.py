"""The demo's ad-monetization join, parameterized by environment for integration tests.

$SJT_HOW picks the join type (inner by default; a left join also emits impressions
that never got a click, with ``click_id`` None); $SJT_SESSION_TIMEOUT_MS the consumer's
session timeout (10 s by default; the broker's minimum is 6 s); $SJT_WINDOW_MS the join
window (10 minutes by default; the grace period is 30 s); $SJT_WORK_MS (0 by
default) makes every input event cost that much CPU (spent reading its event time), so a
backlog takes a predictable while to process. $SJT_GUARANTEE is the processing guarantee
(at_least_once by default).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import streamjoin
from streamjoin.events import Event

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "joiner"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.3,
    processing_guarantee=os.environ.get("SJT_GUARANTEE", "at_least_once"),
    consumer_options={
        "session_timeout_ms": int(os.environ.get("SJT_SESSION_TIMEOUT_MS", "10000")),
        "heartbeat_interval_ms": 1_000,
    },
)
PARTITIONS = int(os.environ.get("SJT_PARTITIONS", "6"))
impressions = app.topic(
    os.environ["SJT_IMPRESSIONS"],
    key_serializer="str",
    value_serializer="json",
    partitions=PARTITIONS,
)
clicks = app.topic(
    os.environ["SJT_CLICKS"], key_serializer="str", value_serializer="json", partitions=PARTITIONS
)
attributed = app.topic(
    os.environ["SJT_OUTPUT"], key_serializer="str", value_serializer="json", partitions=PARTITIONS
)

WORK_S = float(os.environ.get("SJT_WORK_MS", "0")) / 1000


def costly_event_time(event: Event) -> int:
    busy_until = time.perf_counter() + WORK_S
    while time.perf_counter() < busy_until:
        pass
    return event.timestamp


@app.join(
    impressions,
    clicks,
    window=timedelta(milliseconds=int(os.environ.get("SJT_WINDOW_MS", "600000"))),
    grace=timedelta(seconds=30),
    how=os.environ.get("SJT_HOW", "inner"),  # type: ignore[arg-type]
    output=attributed,
    name="ad-clicks",
    left_timestamp=costly_event_time if WORK_S else None,
    right_timestamp=costly_event_time if WORK_S else None,
)
def ad_clicks(
    auction_id: str, impression: dict[str, Any] | None, click: dict[str, Any] | None
) -> Any:
    if impression is None:  # an unmatched click (outer joins only)
        return None
    return {
        "auction_id": auction_id,
        "impression_id": impression["impression_id"],
        "click_id": None if click is None else click["click_id"],
    }
