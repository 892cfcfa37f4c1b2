"""The Quix Streams side of ``window_count.py`` and ``enrichment.py`` (runs in Quix's own venv).

This file must not import streamjoin (only the stdlib module ``progress_marks`` next to it)::

    <quix venv>/bin/python benchmarks/workload_quix_app.py --workload count|enrich \
        --bootstrap 127.0.0.1:PORT --app-id ID --input T [--table T --output T] \
        --state-dir DIR          # BENCH_MARKS and BENCH_LAST_OFFSETS in the environment

* ``count``: ``sdf.tumbling_window(60 s, grace_ms=5 s).count().current()``: the window
  state lives in Quix's RocksDB store with its changelog, as Quix users write it. Each
  update's ``{"start", "end", "value"}`` is kept in a dict (latest per key and window);
  when the last partition's last offset is done, the dict is written as the dump
  ``[key, window start ms, count]`` the harness checks. (``.final()`` would only emit
  windows closed by later events, and the last windows never close.)
* ``enrich``: ``events.join_asof(users, how="left")``: Quix's stream-table join (the
  table topic's rows are kept per key and timestamp; each event takes the latest row at
  or before its timestamp). Output to ``--output``. ``BENCH_VALUES=avro``: values in Avro
  with Quix's ``AvroDeserializer``/``AvroSerializer`` and the registry at
  ``BENCH_REGISTRY_URL`` (``enrichment_avro.py``), else JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from progress_marks import Marks, parse_last_offsets, write_dump

WINDOW_MS = 60_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("count", "enrich"), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--table")
    parser.add_argument("--output")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--loglevel", default="WARNING")
    args = parser.parse_args()
    marks_path = os.environ["BENCH_MARKS"]
    last = parse_last_offsets(os.environ["BENCH_LAST_OFFSETS"])

    from quixstreams import Application, message_context

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.app_id,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        loglevel=args.loglevel.upper(),
    )
    registry_url = os.environ.get("BENCH_REGISTRY_URL")
    avro = os.environ.get("BENCH_VALUES") == "avro"  # enrichment_avro.py

    def reads() -> object:
        if not avro:
            return "json"
        from quixstreams.models.serializers.avro import AvroDeserializer
        from quixstreams.models.serializers.schema_registry import SchemaRegistryClientConfig

        return AvroDeserializer(
            schema_registry_client_config=SchemaRegistryClientConfig(url=registry_url)
        )

    def writes() -> object:
        if not avro:
            return "json"
        from enrichment_avro_schemas import ENRICHED
        from quixstreams.models.serializers.avro import AvroSerializer
        from quixstreams.models.serializers.schema_registry import SchemaRegistryClientConfig

        return AvroSerializer(
            json.loads(ENRICHED),
            schema_registry_client_config=SchemaRegistryClientConfig(url=registry_url),
        )

    source = app.topic(args.input, key_deserializer="str", value_deserializer=reads())

    if args.workload == "count":
        latest: dict[tuple[str, int], int] = {}

        def dump() -> None:
            write_dump(f"{marks_path}.dump.all", ([k, s, n] for (k, s), n in latest.items()))

        marks = Marks(marks_path, last, on_done=dump)

        def first(_value: object) -> None:
            marks.first()

        def seen(window: dict, key: str, _ts: int, _headers: object) -> None:
            latest[(key, window["start"])] = window["value"]
            ctx = message_context()
            marks.seen(ctx.topic, ctx.partition, ctx.offset)

        sdf = app.dataframe(source).update(first)
        sdf = sdf.tumbling_window(WINDOW_MS, grace_ms=5_000).count().current()
        sdf.update(seen, metadata=True)
    else:
        marks = Marks(marks_path, last)
        rows = app.topic(args.table, key_deserializer="str", value_deserializer=reads())
        output = app.topic(args.output, key_serializer="str", value_serializer=writes())

        def first(_value: object) -> None:
            marks.first()

        def merge(event: dict, row: dict | None) -> dict:
            ctx = message_context()
            marks.seen(ctx.topic, ctx.partition, ctx.offset)
            return {
                "event_id": event["event_id"],
                "amount": event["amount"],
                "tier": row and row["tier"],
                "country": row and row["country"],
            }

        users = app.dataframe(rows).update(first)
        events = app.dataframe(source).update(first)
        joined = events.join_asof(users, how="left", on_merge=merge)
        joined.to_topic(output)
    app.run()


if __name__ == "__main__":
    main()
