"""A foreign-key join's final rows backfilled from topics on the real broker equal the
brute-force join of both tables' final rows (the unit tests check the same rows against
the workers' own logic in the test driver)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

import streamjoin
from streamjoin.partitioner import partition_for_key
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.test_spark_table_joins import BASE_MS, PARTITIONS, Row, produce, read

pytestmark = pytest.mark.spark


def enrich(key: str, order: Any, customer: Any) -> Any:
    if order["n"] % 7 == 0:
        return None  # the join function drops this row
    return {"n": order["n"], "customer": None if customer is None else customer["name"]}


def final_join(rows: list[Row], orders: str, customers: str) -> dict[str, tuple[Any, int]]:
    """Brute force: replay both tables, join each order with its customer (left join)."""
    tables: dict[str, dict[str, tuple[Any, int]]] = {orders: {}, customers: {}}
    for topic, key, value, ts in rows:
        if value is None:
            tables[topic].pop(key, None)
        else:
            tables[topic][key] = (value, ts)
    out = {}
    for key, (order, ts) in tables[orders].items():
        found = tables[customers].get(order["customer"]) if order["customer"] else None
        joined = enrich(key, order, None if found is None else found[0])
        if joined is not None:
            out[key] = (joined, ts if found is None else max(ts, found[1]))
    return out


async def test_foreign_key_join_final_rows_backfill_from_the_broker(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    from streamjoin.errors import ConfigurationError
    from streamjoin.spark import KafkaSink, KafkaSource, backfill
    from streamjoin.spark.testing import shared_test_session

    app = streamjoin.App(unique_topic("fk"), broker=f"kafka://{kafka_bootstrap}")
    orders = app.topic(unique_topic("orders"), key_serializer="str", partitions=PARTITIONS)
    # not co-partitioned with the orders
    customers = app.topic(unique_topic("customers"), key_serializer="str", partitions=2)
    out = app.topic(unique_topic("enriched"), key_serializer="str", partitions=PARTITIONS)
    app.join(
        app.topic_table(orders),
        app.topic_table(customers),
        foreign_key=lambda order: order["customer"],
        how="left",
        output=out,
        name="enriched",
    )(enrich)
    await ensure_topics(
        kafka_bootstrap,
        [TopicSpec(orders.name, PARTITIONS), TopicSpec(customers.name, 2)],
    )

    # updates that move orders between customers, deletes on both sides, null foreign keys;
    # timestamps out of order, so "latest" must mean the last written
    rng = random.Random(34)
    rows: list[Row] = []
    for i in range(800):
        ts = BASE_MS + rng.randrange(10_000)
        if rng.random() < 0.6:
            order = None
            if rng.random() > 0.1:
                customer = rng.choice([None, *(f"c{c}" for c in range(30))])
                order = {"customer": customer, "n": i}
            rows.append((orders.name, f"o{rng.randrange(150)}", order, ts))
        else:
            customer_row = None if rng.random() < 0.15 else {"name": f"name{i}"}
            rows.append((customers.name, f"c{rng.randrange(30)}", customer_row, ts))
    await produce(kafka_bootstrap, rows)
    expected = final_join(rows, orders.name, customers.name)
    assert any(v[0]["customer"] is None for v in expected.values())  # unmatched left rows
    assert any(v[0]["customer"] is not None for v in expected.values())

    spark = await asyncio.to_thread(shared_test_session)
    with pytest.raises(ConfigurationError, match="only its final rows"):
        backfill(
            app, "enriched", source=KafkaSource(kafka_bootstrap), output=KafkaSink("x"), spark=spark
        )
    target = unique_topic("enriched-final")
    result = await asyncio.to_thread(
        backfill,
        app,
        "enriched",
        source=KafkaSource(kafka_bootstrap),
        output=KafkaSink(target),
        final_only=True,
        spark=spark,
    )
    assert result.records_read == len(rows) and result.outputs == len(expected)
    written = await read(kafka_bootstrap, target)
    assert len(written) == len(expected)  # one row per key, nothing else
    assert {key: (value, ts) for _, key, value, ts in written} == expected
    for partition, key, _, _ in written:  # placed like the workers' output
        assert partition == partition_for_key(key.encode(), PARTITIONS)
