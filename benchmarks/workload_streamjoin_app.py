"""The streamjoin side of ``window_count.py`` and ``enrichment.py`` (configured by environment).

    BENCH_WORKLOAD=count|enrich BENCH_APP_ID=... BENCH_INPUT=... [BENCH_TABLE=...] \
    [BENCH_OUTPUT=...] BENCH_MARKS=marks.txt BENCH_LAST_OFFSETS=t:p:o,... \
    STREAMJOIN_BROKER=kafka://127.0.0.1:PORT \
        python -m streamjoin.cli worker -A benchmarks.workload_streamjoin_app:app

* ``count``: a windowed table of 1-minute tumbling windows (retention 1 hour, so nothing
  expires during a run), ``counts[event.key] += 1`` per event (``BENCH_TAKE=N``: the
  agent takes batches of up to N events with ``stream.take``, the harness's
  ``streamjoin-take`` system; ``BENCH_VALUES=str``: the values are decoded as UTF-8
  strings, not JSON, as the Kafka Streams peer does, the ``streamjoin-str`` system).
  When this process has processed a partition's last offset it writes that partition's windows to
  ``<marks>.dump.p<partition>`` as JSON lines ``[key, window start ms, count]``.
* ``enrich``: ``app.topic_table(table topic)`` and a left stream-table join of the input
  with it; each event goes to the output enriched with its row (None when the table has no
  row for the key yet). ``BENCH_VALUES=avro``: values in Avro through the schema registry
  at ``BENCH_REGISTRY_URL`` (``enrichment_avro.py``), else JSON.

Marks (:mod:`benchmarks.progress_marks`) are written per input event; their cost (one
call, a dict lookup) is charged to streamjoin, as it is to the others.
"""

from __future__ import annotations

import os
from typing import Any

import streamjoin
from benchmarks import enrichment_avro_schemas as avro_schemas
from benchmarks.progress_marks import Marks, parse_last_offsets, write_dump
from streamjoin.context import current_record
from streamjoin.state.windows import TumblingWindows

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "count")
MARKS_PATH = os.environ.get("BENCH_MARKS", "marks.txt")
WINDOW_MS = 60_000

app = streamjoin.App(
    os.environ.get("BENCH_APP_ID", "workload-bench"),
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    # one worker has no other member to hold a standby
    standby_replicas=0,
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
)
#: BENCH_VALUES=avro (enrichment_avro.py): Avro values from the registry at BENCH_REGISTRY_URL
AVRO = os.environ.get("BENCH_VALUES") == "avro"


def _values(schema: str) -> Any:
    """The value codec: JSON, Avro of ``schema`` (benchmarks/enrichment_avro_schemas.py),
    or UTF-8 strings (``BENCH_VALUES=str``, the window count's ``streamjoin-str``)."""
    if os.environ.get("BENCH_VALUES") == "str":
        return "str"
    if not AVRO:
        return "json"
    from streamjoin.schema_registry import AvroCodec

    return AvroCodec(schema, os.environ["BENCH_REGISTRY_URL"])


source = app.topic(
    os.environ.get("BENCH_INPUT", "events"),
    key_serializer="str",
    value_serializer=_values(avro_schemas.EVENT),
)

if WORKLOAD == "count":
    counts = app.table(
        "counts",
        default=int,
        key_serializer="str",
        value_serializer="json",
        copartitioned_with=source,
        # (grace: the input has up to 2 s of jitter; Quix's app waits 5 s too)
        window=TumblingWindows(size_ms=WINDOW_MS, grace_ms=5_000, retention_ms=3_600_000),
    )

    def _dump(topic: str, partition: int) -> None:
        write_dump(
            f"{MARKS_PATH}.dump.p{partition}",
            ([key, start, n] for (key, start), n in counts.local_items(partition)),
        )

    marks = Marks(MARKS_PATH, parse_last_offsets(os.environ.get("BENCH_LAST_OFFSETS", "")), _dump)

    take = int(os.environ.get("BENCH_TAKE") or 0)

    if take:

        @app.agent(source)
        async def count(stream: Any) -> None:
            async for batch in stream.take(take):
                for event in batch:
                    counts[event.key] += 1
                    marks.seen(event.topic, event.partition, event.offset)

    else:

        @app.agent(source)
        async def count(stream: Any) -> None:
            async for event in stream:
                counts[event.key] += 1
                marks.seen(event.topic, event.partition, event.offset)

elif WORKLOAD == "enrich":
    rows = app.topic(
        os.environ.get("BENCH_TABLE", "users"),
        key_serializer="str",
        value_serializer=_values(avro_schemas.USER),
    )
    output = app.topic(
        os.environ.get("BENCH_OUTPUT", "enriched"),
        key_serializer="str",
        value_serializer=_values(avro_schemas.ENRICHED),
    )
    users = app.topic_table(rows)
    marks = Marks(MARKS_PATH, parse_last_offsets(os.environ.get("BENCH_LAST_OFFSETS", "")))

    async def _table_row(_key: Any) -> None:
        marks.first()

    app.on_table_update(users, _table_row)

    @app.join(source, users, how="left", output=output, name="enrich")
    def enrich(_user: str, event: dict[str, Any], row: dict[str, Any] | None) -> Any:
        record = current_record()
        assert record is not None
        marks.seen(record.topic, record.partition, record.offset)
        return {
            "event_id": event["event_id"],
            "amount": event["amount"],
            "tier": row and row["tier"],
            "country": row and row["country"],
        }

else:
    raise SystemExit(f"BENCH_WORKLOAD must be count or enrich, not {WORKLOAD!r}")
