"""The ad-monetization join (KIP-315's canonical example), and the demo that runs it.

The app: impressions and clicks keyed by auction id, 10 partitions each, joined
within 10 minutes of event time (30 s grace), emitting attributed clicks.

    streamjoin worker -A examples.ad_monetization:app --broker kafka://127.0.0.1:9092

The demo (``./scripts/demo`` runs ``python examples/ad_monetization.py``): starts a
local Kafka broker, three worker processes and a traffic generator (late and
out-of-order events, clicks outside the window, clicks without impressions),
stops one worker midway, and prints what happened: joins emitted vs expected,
the time to resume, and per rebalance the tasks that moved and how long each paused.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import streamjoin

app = streamjoin.App(
    "ad-monetization",
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.5,
    standby_replicas=int(os.environ.get("STREAMJOIN_STANDBYS", "1")),
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
)
impressions = app.topic("impressions", key_serializer="str", value_serializer="json", partitions=10)
clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=10)
attributed = app.topic(
    "attributed-clicks", key_serializer="str", value_serializer="json", partitions=10
)


@app.join(
    impressions,
    clicks,
    window=timedelta(minutes=10),
    grace=timedelta(seconds=30),
    how="inner",
    output=attributed,
)
async def ad_clicks(auction_id: str, impression: dict[str, Any], click: dict[str, Any]) -> Any:
    """An attributed click: who clicked which ad of which campaign, and what it cost."""
    return {
        "auction_id": auction_id,
        "impression_id": impression["impression_id"],
        "click_id": click["click_id"],
        "campaign": impression["campaign"],
        "ad_id": impression["ad_id"],
        "cost_micros": impression["bid_micros"],
        "user": click["user"],
    }


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.demo_runner import main

    raise SystemExit(main())
