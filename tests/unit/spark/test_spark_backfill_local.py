"""Backfill on small file data equals a plain-Python run of the same join core."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import streamjoin
from examples.ad_traffic import GRACE_MS, WINDOW_MS, generate
from streamjoin.joins.core import JoinInput, StreamStreamJoin
from streamjoin.joins.state import MemoryKeyValueView
from streamjoin.partitioner import partition_for_key
from streamjoin.spark.runners import JoinRunner
from tests.unit.spark.history_files import write_records

PARTITIONS = 4


def pair(key: str, left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    return {"key": key, "imp": left["impression_id"], "click": right["click_id"]}


async def async_pair(key: str, left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    return pair(key, left, right)


def make_app(fun: Any = pair, how: str = "inner") -> streamjoin.App:
    app = streamjoin.App("spark-unit")
    imp = app.topic("impressions", key_serializer="str", partitions=PARTITIONS)
    clk = app.topic("clicks", key_serializer="str", partitions=PARTITIONS)
    out = app.topic("joined", key_serializer="str", partitions=PARTITIONS)
    app.join(
        imp,
        clk,
        window=timedelta(milliseconds=WINDOW_MS),
        grace=timedelta(milliseconds=GRACE_MS),
        how=how,
        output=out,
        name="j",
    )(fun)
    return app


def plain_python_run(records: list[Any], how: str = "inner") -> set[tuple[Any, ...]]:
    """What the workers compute: each partition's records in arrival order through the core."""
    app = make_app(how=how)
    spec = app.joins["j"].spec
    views = {p: MemoryKeyValueView() for p in range(PARTITIONS)}
    out: set[tuple[Any, ...]] = set()
    for offset, rec in enumerate(records):
        key = rec.key.encode()
        p = partition_for_key(key, PARTITIONS)
        side = "left" if rec.topic == "impressions" else "right"
        value = json.dumps(rec.value).encode()
        for o in StreamStreamJoin(spec, views[p]).process(
            JoinInput(side, key, value, rec.timestamp_ms, offset)
        ):
            left = json.loads(o.left)["impression_id"] if o.left else None
            right = json.loads(o.right)["click_id"] if o.right else None
            out.add((o.key.decode(), left, right, o.timestamp_ms))
    return out


def test_join_runner_equals_the_core_and_awaits_async_functions() -> None:
    traffic = generate(120, seed=5)
    app = make_app(async_pair)
    decl = app.joins["j"]
    runner = JoinRunner.for_join(app.config, decl, PARTITIONS)
    by_partition: dict[int, list[tuple[int, int, int, str, bytes, bytes]]] = {}
    for i, rec in enumerate(traffic.records):
        key = rec.key.encode()
        side = 0 if rec.topic == "impressions" else 1
        by_partition.setdefault(partition_for_key(key, PARTITIONS), []).append(
            (rec.timestamp_ms, side, i, rec.key, key, json.dumps(rec.value).encode())
        )
    got = set()
    for rows in by_partition.values():
        rows.sort()
        records = [("left" if s == 0 else "right", k, v, ts) for ts, s, _, _, k, v in rows]
        for o in runner.run(records):
            value = json.loads(o.value or b"")
            assert o.partition == partition_for_key(o.key or b"", PARTITIONS)
            got.add((value["key"], value["imp"], value["click"], o.timestamp_ms))
    assert got == plain_python_run(traffic.records)
    assert {(k, i, c) for k, i, c, _ in got} == traffic.expected_joins
    assert runner.stats["late"] == 0


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_file_backfill_equals_plain_python_run(tmp_path: Path, fmt: str) -> None:
    from streamjoin.spark import FileSink, backfill
    from streamjoin.spark.sources import FileSource
    from streamjoin.spark.testing import shared_test_session

    spark = shared_test_session()
    traffic = generate(300, seed=9)
    source = tmp_path / "in.json"
    write_records(source, traffic.records)
    if fmt == "parquet":
        spark.read.json(
            str(source), schema="topic string, key string, value string, timestamp long"
        ).write.parquet(str(tmp_path / "in.parquet"))
        source = tmp_path / "in.parquet"
    lines: list[str] = []
    result = backfill(
        make_app(),
        "j",
        source=FileSource([str(source)]),
        output=FileSink(str(tmp_path / "out"), fmt),  # type: ignore[arg-type]
        spark=spark,
        progress=lambda p: lines.append(p.line()),
        progress_interval=0.2,
    )
    rows = spark.read.format(fmt).load(str(tmp_path / "out")).collect()
    got = set()
    for r in rows:
        value = json.loads(r.value if fmt == "json" else bytes(r.value).decode())
        key = r.key if fmt == "json" else bytes(r.key).decode()
        assert r.partition == partition_for_key(key.encode(), PARTITIONS)
        got.add((value["key"], value["imp"], value["click"], r.timestamp))
    assert got == plain_python_run(traffic.records)
    assert len(rows) == len(got) == len(traffic.expected_joins)
    assert result.records_read == len(traffic.records)
    assert result.outputs == len(rows)
    assert lines and f"{PARTITIONS}/{PARTITIONS} partitions" in lines[-1]
