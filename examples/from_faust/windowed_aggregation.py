"""Port of Faust's ``examples/windowed_aggregation.py``: the count and mean of the values of
each 10-second window, sent to a sink topic once the window closes.

    streamjoin worker -A examples.from_faust.windowed_aggregation:app \\
        --broker kafka://127.0.0.1:9092

A timer produces one random reading every 0.1 s (as in Faust). Faust kept every event of a
window in a list-valued table and summed them in ``on_window_close``; here the aggregation is
declared (``app.aggregate`` with ``Count`` and ``Mean``), so only a sum and a count are kept
per window, and each window's final result goes to the sink when stream time passes its end
(or, once readings stop, ``CLOSE_IDLE_AFTER`` later: Faust's cleanup timer did that for the
last window). The environment variables only let tests run it on fresh topics, quickly.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import streamjoin
from streamjoin.aggregations import Count, Mean
from streamjoin.events import Event
from streamjoin.state.windows import TumblingWindows

log = logging.getLogger(__name__)

PREFIX = os.environ.get("FAUST_PORTS_PREFIX", "")
WINDOW = timedelta(seconds=float(os.environ.get("FAUST_PORTS_WINDOW_S", "10")))
WINDOW_EXPIRES = timedelta(seconds=1)
CLOSE_IDLE_AFTER = timedelta(seconds=float(os.environ.get("FAUST_PORTS_IDLE_S", "2")))
#: how many readings the timer produces before it stops (0: forever, as in Faust)
READINGS = int(os.environ.get("FAUST_PORTS_READINGS", "0"))
#: every reading has this key: Faust kept all of them under the table key "events"
KEY = "events"


@dataclass
class RawModel:
    date: datetime
    value: float


app = streamjoin.App(
    f"{PREFIX}windowed-agg",
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.5,
)
source = app.topic(
    f"{PREFIX}raw-event", key_serializer="str", value_serializer=RawModel, partitions=1
)
sink = app.topic(f"{PREFIX}agg-event", key_serializer="str", value_serializer="json")


def event_time_ms(event: Event) -> int:
    """Faust's ``relative_to_field(RawModel.date)``: windows by the reading's date."""
    date: datetime = event.value.date
    return int(date.timestamp() * 1000)


def window_processor(key: str, window: tuple[int, int], result: dict[str, Any]) -> None:
    """Faust's ``on_window_close_callback``: here it only logs; the result itself is
    already on its way to the sink (``emit_to``)."""
    start, _end = window
    log.info(
        "processing window: %d events, mean: %.2f, timestamp %d",
        result["count"],
        result["mean"],
        start,
    )


tumbling_table = app.aggregate(
    source,
    name="tumbling_table",
    window=TumblingWindows(WINDOW, retention=WINDOW_EXPIRES),
    agg={"count": Count(), "mean": Mean("value")},
    timestamp=event_time_ms,
    emit="close",
    emit_to=sink,
    on_window_close=window_processor,
    close_idle_after=CLOSE_IDLE_AFTER,
)

_produced = itertools.count()


@app.timer(timedelta(milliseconds=100))
async def produce() -> None:
    if READINGS and next(_produced) >= READINGS:
        return
    reading = RawModel(date=datetime.now(UTC), value=random.random())
    await source.send(key=KEY, value=reading)
