"""The demo's ad-monetization join, parameterized by environment for integration tests."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import streamjoin

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "joiner"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.3,
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
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


@app.join(
    impressions,
    clicks,
    window=timedelta(minutes=10),
    grace=timedelta(seconds=30),
    output=attributed,
    name="ad-clicks",
)
def ad_clicks(auction_id: str, impression: dict[str, Any], click: dict[str, Any]) -> Any:
    return {
        "auction_id": auction_id,
        "impression_id": impression["impression_id"],
        "click_id": click["click_id"],
    }
