"""A test app for final results of sliding and session aggregations: events of $SJT_SOURCE
(JSON ``{"amount": int}``) aggregated per key twice, both with ``emit="close"``:

* in session windows (300 ms gap), final results to $SJT_SESSIONS;
* in sliding windows (200 ms difference), final results to $SJT_SLIDING.

Each result's value is ``{"start", "end", "value": {"n", "sum", "min", "max"}}``.
$SJT_GUARANTEE is the processing guarantee (at_least_once by default); $SJT_PARTITIONS the
source's partition count (4).
"""

from __future__ import annotations

import os

import streamjoin
from streamjoin.aggregations import Count, Max, Min, Sum
from streamjoin.state.windows import SessionWindows, SlidingWindows

GAP_MS = 300
DIFFERENCE_MS = 200

_guarantee = os.environ.get("SJT_GUARANTEE", "at_least_once")
app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "aggregator"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    processing_guarantee=_guarantee,
    consumer_options={"session_timeout_ms": 6_000, "heartbeat_interval_ms": 1_000},
    **({} if _guarantee == "exactly_once" else {"commit_interval": 0.3}),
)
source = app.topic(
    os.environ.get("SJT_SOURCE", "events"),
    key_serializer="str",
    value_serializer="json",
    partitions=int(os.environ.get("SJT_PARTITIONS", "4")),
)


WINDOWS: dict[str, SessionWindows | SlidingWindows] = {
    "sessions": SessionWindows(gap_ms=GAP_MS),
    "sliding": SlidingWindows(difference_ms=DIFFERENCE_MS),
}
for _name, _window in WINDOWS.items():
    app.aggregate(
        source,
        window=_window,
        agg={"n": Count(), "sum": Sum("amount"), "min": Min("amount"), "max": Max("amount")},
        name=_name,
        emit="close",
        emit_to=app.topic(
            os.environ.get(f"SJT_{_name.upper()}", _name),
            key_serializer="str",
            value_serializer="json",
        ),
    )
