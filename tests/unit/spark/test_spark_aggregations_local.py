"""Aggregation backfills through Spark (local, file input) equal the test driver's results."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import streamjoin
from streamjoin.aggregations import Collect, Count, Sum, aggregator_of
from streamjoin.errors import ConfigurationError, SparkJobError
from streamjoin.state.windows import SessionWindows, SlidingWindows, TumblingWindows
from streamjoin.testing.driver import TestDriver

PARTITIONS = 3


def make_app(window: Any, emit: str, agg: Any, key: Any = None) -> streamjoin.App:
    app = streamjoin.App("agg-spark-local", topic_partitions=PARTITIONS)
    app.topic("orders", key_serializer="str", value_serializer="json", partitions=PARTITIONS)
    app.topic("results", key_serializer="str", value_serializer="json", partitions=PARTITIONS)
    app.aggregate(
        "orders",
        window=window,
        agg=agg,
        name="totals",
        emit=emit,  # type: ignore[arg-type]
        emit_to="results",
        key=key,
        partitions=PARTITIONS if key is not None else None,
    )
    return app


def history(seed: int, count: int = 300) -> list[tuple[str, dict[str, Any], int]]:
    """Orders of 12 users, out of order by up to 20 s (some later than the grace)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        ts = 1_000_000 + i * 500 - rng.randrange(20_000)
        user = f"user-{rng.randrange(12)}"
        out.append((f"order-{i}", {"user": user, "amount": rng.randrange(100)}, ts))
    return out


async def worker_run(
    app: streamjoin.App, orders: list[tuple[str, dict[str, Any], int]], key_of: Any
) -> list[Any]:
    """The driver's results, after writing the input as the driver's log (partition, offset)."""
    async with TestDriver(app) as driver:
        for order, value, ts in orders:
            await driver.put("orders", key=key_of(order, value), value=value, timestamp_ms=ts)
        await driver.drain()
        return driver.raw_records("results"), driver.raw_records("orders")  # type: ignore[return-value]


def write_log(path: Path, raw: list[Any]) -> None:
    with path.open("w") as f:
        for r in raw:
            row = {
                "topic": r.topic,
                "key": r.key.decode(),
                "value": json.loads(r.value),
                "timestamp": r.timestamp,
                "partition": r.partition,
                "offset": r.offset,
            }
            f.write(json.dumps(row) + "\n")


def canonical(value: str | bytes) -> str:
    return json.dumps(json.loads(value), sort_keys=True)


def read_output(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    rows = spark.read.json(str(path)).collect()
    return sorted((r.partition, r.key, canonical(r.value), r.timestamp) for r in rows)


def expected(raw: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((r.partition, r.key.decode(), canonical(r.value), r.timestamp) for r in raw)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("window", "emit"),
    [
        (TumblingWindows(size_ms=10_000, grace_ms=5_000), "close"),
        (SessionWindows(gap_ms=2_000, grace_ms=5_000), "update"),
        (SlidingWindows(difference_ms=3_000, grace_ms=5_000), "close"),
    ],
)
async def test_file_backfill_equals_the_workers(tmp_path: Path, window: Any, emit: str) -> None:
    from streamjoin.spark import FileSink, backfill
    from streamjoin.spark.sources import FileSource
    from streamjoin.spark.testing import shared_test_session

    spark = shared_test_session()
    agg = aggregator_of({"n": Count(), "total": Sum("amount"), "amounts": Collect("amount")})
    orders = history(seed=3)
    results, log = await worker_run(make_app(window, emit, agg), orders, lambda _, v: v["user"])
    write_log(tmp_path / "in.json", log)
    result = backfill(
        make_app(window, emit, agg),
        "totals",
        source=FileSource([str(tmp_path / "in.json")]),
        output=FileSink(str(tmp_path / "out"), "json"),
        spark=spark,
    )
    assert read_output(spark, tmp_path / "out") == expected(results)
    assert result.outputs == len(results) and result.records_read == len(orders)
    assert result.late > 0  # the history has records later than the grace: dropped alike


@pytest.mark.spark
async def test_re_keyed_final_results_equal_the_workers(tmp_path: Path) -> None:
    from streamjoin.spark import FileSink, backfill
    from streamjoin.spark.sources import FileSource
    from streamjoin.spark.testing import shared_test_session

    spark = shared_test_session()
    window = TumblingWindows(size_ms=10_000, grace_ms=60_000)  # (nothing late)

    def app_() -> streamjoin.App:
        return make_app(window, "update", Sum("amount"), key=lambda e: e.value["user"])

    orders = history(seed=4, count=200)
    results, log = await worker_run(app_(), orders, lambda order, _: order)
    write_log(tmp_path / "in.json", log)
    backfill(
        app_(),
        "totals",
        source=FileSource([str(tmp_path / "in.json")]),
        output=FileSink(str(tmp_path / "out"), "json"),
        spark=spark,
        final_only=True,
    )
    last: dict[tuple[bytes, int], tuple[str, str]] = {}
    for r in results:  # (in the order sent, per key)
        last[(r.key, json.loads(r.value)["start"])] = (r.key.decode(), canonical(r.value))
    got = read_output(spark, tmp_path / "out")
    assert sorted((r[1], r[2]) for r in got) == sorted(last.values())


def test_options_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    from streamjoin.spark import FileSink, backfill, bootstrap
    from streamjoin.spark.sources import FileSource

    app = make_app(TumblingWindows(size_ms=10_000), "close", Count())
    source, sink = FileSource([str(tmp_path)]), FileSink(str(tmp_path / "out"))
    with pytest.raises(ConfigurationError, match="final_only"):
        backfill(app, "totals", source=source, output=sink, final_only=True)
    with pytest.raises(ConfigurationError, match="one task per partition"):
        backfill(app, "totals", source=source, output=sink, parallelism=8)
    sliding = make_app(SlidingWindows(difference_ms=1_000), "update", Count(), key=lambda e: 1)
    with pytest.raises(SparkJobError, match="records table"):
        bootstrap(sliding, "totals", source=source)
    with pytest.raises(SparkJobError, match="bootstrap 'totals'"):
        bootstrap(sliding, "totals-records", source=source)
