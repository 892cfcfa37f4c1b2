"""The streamjoin side of ``benchmarks/join_throughput.py``: the demo's join on benchmark topics.

A copy of ``examples/ad_monetization.py`` (same join, window, grace, join
function and output record) whose app id and topic names come from the
environment, so every benchmark run gets fresh topics and a fresh consumer
group::

    JOINBENCH_APP_ID=... JOINBENCH_IMPRESSIONS=... JOINBENCH_CLICKS=... \
    JOINBENCH_OUTPUT=... JOINBENCH_INPUTS=70000 JOINBENCH_MARKS=marks.txt \
    STREAMJOIN_BROKER=kafka://127.0.0.1:PORT \
        python -m streamjoin.cli worker -A benchmarks.join_streamjoin_app:app

Timing marks. Both sides use a timestamp extractor that returns the record's
own timestamp (what the demo uses by default) and, on the way, writes
``FIRST <unix time> <process CPU time>`` to the file ``JOINBENCH_MARKS`` when the first input event
reaches the join and ``DONE <unix time>`` when the ``JOINBENCH_INPUTS``-th does. The
extractor is called once per input event, before the join handles it; its cost
(one Python call and a counter) is charged to streamjoin.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

import streamjoin
from streamjoin.events import Event

PARTITIONS = 10

app = streamjoin.App(
    os.environ.get("JOINBENCH_APP_ID", "join-bench"),
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    processing_guarantee=os.environ.get("JOINBENCH_GUARANTEE", "at_least_once"),
    # at-least-once: every 0.5 s; exactly-once: its default (0.1 s, as Kafka Streams)
    commit_interval=(None if os.environ.get("JOINBENCH_GUARANTEE") == "exactly_once" else 0.5),
    # one worker: there is no other member to hold a standby
    standby_replicas=0,
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
)
impressions = app.topic(
    os.environ.get("JOINBENCH_IMPRESSIONS", "impressions"),
    key_serializer="str",
    value_serializer="json",
    partitions=PARTITIONS,
)
clicks = app.topic(
    os.environ.get("JOINBENCH_CLICKS", "clicks"),
    key_serializer="str",
    value_serializer="json",
    partitions=PARTITIONS,
)
attributed = app.topic(
    os.environ.get("JOINBENCH_OUTPUT", "attributed-clicks"),
    key_serializer="str",
    value_serializer="json",
    partitions=PARTITIONS,
)

_expected_inputs = int(os.environ.get("JOINBENCH_INPUTS", "0"))
_marks_path = os.environ.get("JOINBENCH_MARKS")
_seen = 0


def _write_mark(what: str) -> None:
    line = f"{what} {time.time():.6f} {time.process_time():.6f}\n"
    if _marks_path:
        with open(_marks_path, "a") as f:
            f.write(line)
    else:
        sys.stdout.write(line)
        sys.stdout.flush()


def _mark(event: Event) -> int:
    """The record's timestamp (the default event time), counting inputs on the way."""
    global _seen
    _seen += 1
    if _seen == 1:
        _write_mark("FIRST")
    if _seen == _expected_inputs:
        _write_mark("DONE")
    return event.timestamp


@app.join(
    impressions,
    clicks,
    window=timedelta(minutes=10),
    grace=timedelta(seconds=30),
    how="inner",
    output=attributed,
    left_timestamp=_mark,
    right_timestamp=_mark,
)
async def ad_clicks(auction_id: str, impression: dict[str, Any], click: dict[str, Any]) -> Any:
    """An attributed click, exactly as the demo builds it."""
    return {
        "auction_id": auction_id,
        "impression_id": impression["impression_id"],
        "click_id": click["click_id"],
        "campaign": impression["campaign"],
        "ad_id": impression["ad_id"],
        "cost_micros": impression["bid_micros"],
        "user": click["user"],
    }
