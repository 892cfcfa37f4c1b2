"""The faust-streaming side of ``window_count.py`` and ``enrichment.py`` (Faust's own venv).

This file must not import streamjoin (only the stdlib modules next to it)::

    <faust venv>/bin/python benchmarks/workload_faust_app.py --workload count|enrich \
        --bootstrap 127.0.0.1:PORT --app-id ID --input T [--table T --output T] \
        --datadir DIR            # BENCH_MARKS and BENCH_LAST_OFFSETS in the environment

* ``count``: ``app.Table("counts", default=int).tumbling(60 s, expires=1 h)
  .relative_to_stream()`` (event time, like the others), ``counts[key] += 1`` per event,
  RocksDB store with its changelog. When the last partition's last offset is done, the
  table's windows are written as the dump ``[key, window start ms, count]``.
* ``enrich``: an agent on the table topic keeps ``users[key] = row`` in a Table, an agent
  on the events looks the row up and sends the enriched event (row None when not there
  yet): Faust's table lookup.

Faust's internal topics are created before the worker starts, as in ``join_faust_app.py``
(which explains why).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from join_faust_app import create_topics, internal_topics
from progress_marks import Marks, parse_last_offsets, write_dump


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("count", "enrich"), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--table")
    parser.add_argument("--output")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--datadir", required=True)
    parser.add_argument("--store", default="rocksdb://")
    parser.add_argument("--loglevel", default="warning")
    args = parser.parse_args()
    marks_path = os.environ["BENCH_MARKS"]
    last = parse_last_offsets(os.environ["BENCH_LAST_OFFSETS"])

    import faust

    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store=args.store,
        datadir=args.datadir,
        topic_partitions=args.partitions,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(
        args.input,
        key_type=bytes,
        key_serializer="raw",
        value_serializer="json",
        partitions=args.partitions,
    )

    if args.workload == "count":
        counts = (
            app.Table("counts", default=int, partitions=args.partitions)
            .tumbling(timedelta(minutes=1), expires=timedelta(hours=1))
            .relative_to_stream()
        )

        def dump() -> None:
            rows = []
            for (key, (start, _end)), n in counts.table.data.items():
                rows.append([key, round(start * 1000), n])
            write_dump(f"{marks_path}.dump.all", rows)

        marks = Marks(marks_path, last, on_done=dump)

        @app.agent(source)
        async def count(stream: faust.StreamT) -> None:
            async for event in stream.events():
                counts[event.key.decode()] += 1
                message = event.message
                marks.seen(message.topic, message.partition, message.offset)

    else:
        marks = Marks(marks_path, last)
        rows_topic = app.topic(
            args.table,
            key_type=bytes,
            key_serializer="raw",
            value_serializer="json",
            partitions=args.partitions,
        )
        output = app.topic(
            args.output,
            key_type=bytes,
            key_serializer="raw",
            value_serializer="json",
            partitions=args.partitions,
        )
        users = app.Table("users", partitions=args.partitions)

        @app.agent(rows_topic)
        async def load(stream: faust.StreamT) -> None:
            async for event in stream.events():
                marks.first()
                users[event.key.decode()] = event.value

        @app.agent(source)
        async def enrich(stream: faust.StreamT) -> None:
            async for event in stream.events():
                row = users.get(event.key.decode())
                value = event.value
                message = event.message
                marks.seen(message.topic, message.partition, message.offset)
                await output.send(
                    key=event.key,
                    value={
                        "event_id": value["event_id"],
                        "amount": value["amount"],
                        "tier": row and row["tier"],
                        "country": row and row["country"],
                    },
                )

    logging.basicConfig(level=args.loglevel.upper())
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(create_topics(args.bootstrap, internal_topics(app)))
    finally:
        loop.close()
    worker = faust.Worker(app, loglevel=args.loglevel, quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main()
