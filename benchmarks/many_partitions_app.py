"""The worker of ``many_partitions.py``: two counting tables over one topic of many partitions.

    BENCH_APP_ID=... BENCH_INPUT=... BENCH_MARKS=marks.txt BENCH_LAST_OFFSETS=t:p:o,... \
    STREAMJOIN_BROKER=kafka://127.0.0.1:PORT \
        python -m streamjoin.cli worker -A benchmarks.many_partitions_app:app

Per event: ``counts[key] += 1`` and ``totals[key] += int(value)``. When this process has
processed a partition's last offset it writes both tables' rows of that partition to
``<marks>.dump.p<partition>`` as JSON lines ``[table, key, value]``, which the benchmark
checks against what it produced.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import streamjoin
from benchmarks.progress_marks import Marks, parse_last_offsets, write_dump
from streamjoin.runtime.tasks.agent_runtime import Stream

MARKS_PATH = os.environ.get("BENCH_MARKS", "marks.txt")

app = streamjoin.App(
    os.environ.get("BENCH_APP_ID", "many-partitions"),
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    # one worker has no other member to hold a standby
    standby_replicas=0,
    consumer_options={"session_timeout_ms": 30_000, "heartbeat_interval_ms": 3_000},
)
source = app.topic(
    os.environ.get("BENCH_INPUT", "events"), key_serializer="str", value_serializer="str"
)
counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=source)
totals = app.table("totals", default=int, key_serializer="str", copartitioned_with=source)


def _rows(partition: int) -> Iterator[list[object]]:
    for key, n in counts.local_items(partition):
        yield ["counts", key, n]
    for key, n in totals.local_items(partition):
        yield ["totals", key, n]


def _dump(topic: str, partition: int) -> None:
    write_dump(f"{MARKS_PATH}.dump.p{partition}", _rows(partition))


marks = Marks(MARKS_PATH, parse_last_offsets(os.environ.get("BENCH_LAST_OFFSETS", "")), _dump)


@app.agent(source, name="count")
async def count(stream: Stream) -> None:
    async for event in stream:
        counts[event.key] += 1
        totals[event.key] += int(event.value)
        marks.seen(event.topic, event.partition, event.offset)
