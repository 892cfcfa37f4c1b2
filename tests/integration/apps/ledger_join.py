"""The ledger (tests/integration/apps/ledger.py) and the demo's ad join in one app, so one
worker's commit covers both: a counting table with its changelog, and a stream-stream join
with its buffers' changelog (for the cluster fault tests and the cluster soak).

Besides the ledger's environment: impressions ($SJT_IMPRESSIONS, ``{"impression_id"}``)
and clicks ($SJT_CLICKS, ``{"click_id"}``) keyed by auction id are joined (inner, 10 minute
window, 30 s grace) into $SJT_JOINED as ``{"auction_id", "impression_id", "click_id"}``,
all with $SJT_PARTITIONS partitions.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from tests.integration.apps.ledger import PARTITIONS, app


def _topic(env: str) -> Any:
    return app.topic(
        os.environ[env], key_serializer="str", value_serializer="json", partitions=PARTITIONS
    )


impressions = _topic("SJT_IMPRESSIONS")
clicks = _topic("SJT_CLICKS")
joined = _topic("SJT_JOINED")


@app.join(
    impressions,
    clicks,
    window=timedelta(minutes=10),
    grace=timedelta(seconds=30),
    output=joined,
    name="ad-clicks",
)
def ad_clicks(auction_id: str, impression: dict[str, Any], click: dict[str, Any]) -> Any:
    return {
        "auction_id": auction_id,
        "impression_id": impression["impression_id"],
        "click_id": click["click_id"],
    }


__all__ = ["app"]
