"""The streamjoin side of ``table_joins.py`` (configured by environment).

    BENCH_WORKLOAD=global|fk BENCH_APP_ID=... BENCH_INPUT=... BENCH_TABLE=... \
    BENCH_OUTPUT=... BENCH_MARKS=marks.txt BENCH_LAST_OFFSETS=t:p:o,... \
    STREAMJOIN_BROKER=kafka://127.0.0.1:PORT \
        python -m streamjoin.cli worker -A benchmarks.table_joins_streamjoin_app:app

* ``global``: ``app.global_table(table topic)`` and a left join of the events (keyed by
  event id) with it by their ``user`` field; each event goes out enriched with its row.
* ``fk``: orders (the input) and customers (the table topic) as ``app.topic_table``
  tables, inner-joined by the order's ``customer`` field (a foreign-key join); every change
  of the result goes to the output.

Marks (:mod:`benchmarks.progress_marks`) are written per input record, as the Kafka
Streams app writes them.
"""

from __future__ import annotations

import os
from typing import Any

import streamjoin
from benchmarks.progress_marks import Marks, parse_last_offsets
from streamjoin.context import current_record
from streamjoin.events import Event

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "global")

app = streamjoin.App(
    os.environ.get("BENCH_APP_ID", "table-joins-bench"),
    broker=os.environ.get("STREAMJOIN_BROKER", "kafka://127.0.0.1:9092"),
    # one worker has no other member to hold a standby
    standby_replicas=0,
    consumer_options={"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000},
)
source = app.topic(
    os.environ.get("BENCH_INPUT", "input"), key_serializer="str", value_serializer="json"
)
rows = app.topic(
    os.environ.get("BENCH_TABLE", "table"), key_serializer="str", value_serializer="json"
)
output = app.topic(
    os.environ.get("BENCH_OUTPUT", "output"), key_serializer="str", value_serializer="json"
)
marks = Marks(
    os.environ.get("BENCH_MARKS", "marks.txt"),
    parse_last_offsets(os.environ.get("BENCH_LAST_OFFSETS", "")),
)


def _mark() -> None:
    record = current_record()
    if record is None:
        marks.first()
    else:
        marks.seen(record.topic, record.partition, record.offset)


if WORKLOAD == "global":
    users = app.global_table(rows, name="users")

    def user_of(event: Event) -> Any:
        marks.seen(event.topic, event.partition, event.offset)
        return event.value["user"]

    @app.join(source, users, key=user_of, how="left", output=output, name="enrich")
    def enrich(_event_id: str, event: dict[str, Any], row: dict[str, Any] | None) -> Any:
        return {
            "event_id": event["event_id"],
            "amount": event["amount"],
            "tier": row and row["tier"],
            "country": row and row["country"],
        }

elif WORKLOAD == "fk":
    orders = app.topic_table(source, name="orders")
    customers = app.topic_table(rows, name="customers")

    async def _updated(_key: Any) -> None:
        _mark()

    app.on_table_update(orders, _updated)
    app.on_table_update(customers, _updated)

    @app.join(
        orders,
        customers,
        foreign_key=lambda order: order["customer"],
        how="inner",
        output=output,
        name="orders-with-customers",
    )
    def order_with_customer(_order_id: str, order: dict[str, Any], customer: dict[str, Any]) -> Any:
        return {
            "order": order["order"],
            "amount": order["amount"],
            "customer": order["customer"],
            "name": customer["name"],
            "country": customer["country"],
        }

else:
    raise SystemExit(f"BENCH_WORKLOAD must be global or fk, not {WORKLOAD!r}")
