"""The streamjoin side of ``window_kinds.py`` (configured by environment, set by it).

    BENCH_WINDOW=hopping|session BENCH_EMIT=update|close BENCH_SIZE_MS=.. BENCH_STEP_MS=..
    BENCH_GAP_MS=.. BENCH_GRACE_MS=.. BENCH_RETENTION_MS=.. BENCH_APP_ID=.. BENCH_INPUT=..
    BENCH_OUTPUT=.. BENCH_MARKS=marks.txt BENCH_LAST_OFFSETS=t:p:o,... \
    STREAMJOIN_BROKER=kafka://127.0.0.1:PORT \
        python -m streamjoin.cli worker -A benchmarks.window_kinds_streamjoin_app:app

* hopping: a windowed table of ``HoppingWindows`` (``app.table(..., window=..., emit=...)``)
  and an agent doing ``counts.update(key, add_one)`` per event, as a Faust user writes it;
  with ``BENCH_EMIT=close`` the table sends each window's final count to ``BENCH_OUTPUT``
  (``emit="close", emit_to=...``);
* session: ``app.aggregate(input, window=SessionWindows(...), agg=Count(), emit=...)``
  (sessions exist only as aggregations), final results to ``BENCH_OUTPUT`` when closing.
  The progress marks are taken in the count's ``add`` (once per event), the only place
  an aggregation runs user code per event.

Emit on update: once a partition's last offset is processed, its windows are written to
``<marks>.dump.p<partition>`` as JSON lines ``[key, window start ms, count]`` (sessions:
``[key, start, last event, count]``), half a second later for the aggregation (whose
mark comes before the event's window is written).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import streamjoin
from benchmarks.progress_marks import Marks, parse_last_offsets, write_dump
from streamjoin.context import current_record
from streamjoin.state.windows import HoppingWindows

WINDOW = os.environ.get("BENCH_WINDOW", "hopping")
EMIT = os.environ.get("BENCH_EMIT", "update")
MARKS_PATH = os.environ.get("BENCH_MARKS", "marks.txt")


def _ms(name: str) -> int:
    return int(os.environ[f"BENCH_{name}_MS"])


app = streamjoin.App(
    os.environ.get("BENCH_APP_ID", "window-kinds-bench"),
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    # one worker has no other member to hold a standby
    standby_replicas=0,
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
)
source = app.topic(
    os.environ.get("BENCH_INPUT", "events"), key_serializer="str", value_serializer="json"
)
last = parse_last_offsets(os.environ.get("BENCH_LAST_OFFSETS", ""))


def _add_one(n: int) -> int:
    return n + 1


output = app.topic(
    os.environ.get("BENCH_OUTPUT", "window-results"), key_serializer="str", value_serializer="json"
)

if WINDOW == "hopping":
    counts = app.table(
        "counts",
        default=int,
        key_serializer="str",
        value_serializer="json",
        copartitioned_with=source,
        window=HoppingWindows(
            size_ms=_ms("SIZE"),
            step_ms=_ms("STEP"),
            grace_ms=_ms("GRACE"),
            retention_ms=_ms("RETENTION"),
        ),
        emit=EMIT,
        emit_to=output if EMIT == "close" else None,
    )

    def _dump(_topic: str, partition: int) -> None:
        if EMIT == "update":
            write_dump(
                f"{MARKS_PATH}.dump.p{partition}",
                ([key, start, n] for (key, start), n in counts.local_items(partition)),
            )

    marks = Marks(MARKS_PATH, last, _dump)

    @app.agent(source)
    async def count(stream: Any) -> None:
        async for event in stream:
            counts.update(event.key, _add_one)  # type: ignore[attr-defined]
            marks.seen(event.topic, event.partition, event.offset)

elif WINDOW == "session":
    from streamjoin.aggregations import Count
    from streamjoin.state import window_layout as layout
    from streamjoin.state.windows import SessionWindows

    def _dump_soon(_topic: str, partition: int) -> None:
        if EMIT == "update":
            asyncio.get_running_loop().call_later(0.5, _dump_sessions, partition)

    def _dump_sessions(partition: int) -> None:
        rows = []
        view = sessions.active_partition(partition)
        for data_key, raw in list(view.scan(*layout.namespace_range(layout.DATA))):
            _, key_bytes, start, _ = layout.split_data_key(data_key)
            end = sessions.window_end(start, raw)  # (the last event + 1)
            key = sessions.key_codec.loads(key_bytes)
            rows.append([key, start, end - 1, sessions.value_codec.loads(raw)])
        write_dump(f"{MARKS_PATH}.dump.p{partition}", rows)

    marks = Marks(MARKS_PATH, last, _dump_soon)

    class MarkedCount(Count):
        """Count, marking each event as seen (the harness's progress marks)."""

        def add(self, state: int, value: Any) -> int:
            record = current_record()
            assert record is not None
            marks.seen(record.topic, record.partition, record.offset)
            return state + 1

    sessions = app.aggregate(
        source,
        window=SessionWindows(
            gap_ms=_ms("GAP"), grace_ms=_ms("GRACE"), retention_ms=_ms("RETENTION")
        ),
        agg=MarkedCount(),
        name="counts",
        emit=EMIT,  # type: ignore[arg-type]
        emit_to=output if EMIT == "close" else None,
    )

else:
    raise SystemExit(f"BENCH_WINDOW must be hopping or session, not {WINDOW!r}")
