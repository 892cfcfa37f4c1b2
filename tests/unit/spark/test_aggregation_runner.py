"""The aggregation runner (the pure per-partition part of an aggregation's backfill and
bootstrap) against the workers: the test driver runs the app, the runner takes the same
partitions' records in the same order, and both must give the same results, the same
late count and the same stores."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamjoin
from streamjoin.aggregations import Collect, Count, Sum, aggregator_of
from streamjoin.errors import ConfigurationError
from streamjoin.spark.aggregation_runner import AggregationRunner, Rekey
from streamjoin.spark.runners import OutputRecord
from streamjoin.state.windows import (
    HoppingWindows,
    SessionWindows,
    SlidingWindows,
    TumblingWindows,
)
from streamjoin.testing.driver import TestDriver

PARTITIONS = 2

#: (key, amount, timestamp ms): out of order by up to a minute, so some records are late
records_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(min_value=0, max_value=100),
        st.integers(min_value=0, max_value=60_000),
    ),
    min_size=1,
    max_size=40,
)

SPECS: dict[str, Any] = {
    "tumbling": TumblingWindows(size_ms=10_000, grace_ms=2_000),
    "hopping": HoppingWindows(size_ms=10_000, step_ms=5_000, grace_ms=1_000),
    "session": SessionWindows(gap_ms=3_000, grace_ms=2_000),
    "sliding": SlidingWindows(difference_ms=5_000, grace_ms=3_000),
}


def make_app(spec: Any, emit: str, agg: Any, *, key: Any = None) -> streamjoin.App:
    app = streamjoin.App("agg-spark-unit", topic_partitions=PARTITIONS)
    app.topic("orders", key_serializer="str", value_serializer="json")
    app.topic("results", key_serializer="str", value_serializer="json")
    app.aggregate(
        "orders",
        window=spec,
        agg=agg,
        name="totals",
        emit=emit,  # type: ignore[arg-type]
        emit_to="results",
        key=key,
    )
    return app


def runner_for(app: streamjoin.App, **options: Any) -> AggregationRunner:
    decl = app.aggregations["totals"]
    return AggregationRunner.for_aggregation(app.config, decl, PARTITIONS, **options)


def sent(records: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((r.partition, r.key, r.value, r.timestamp, tuple(r.headers)) for r in records)


def produced(outputs: list[OutputRecord]) -> list[tuple[Any, ...]]:
    return sorted((o.partition, o.key, o.value, o.timestamp_ms, o.headers) for o in outputs)


def by_key(records: list[tuple[Any, ...]]) -> dict[bytes, list[tuple[Any, ...]]]:
    out: dict[bytes, list[tuple[Any, ...]]] = {}
    for record in records:
        out.setdefault(record[1], []).append(record)
    return out


async def run_both(
    app: streamjoin.App, records: list[tuple[str, int, int]], topic: str = "orders", **options: Any
) -> tuple[TestDriver, AggregationRunner, list[OutputRecord], dict[int, dict[str, Any]]]:
    """The driver over ``records``, then the runner over each partition of ``topic`` as the
    driver saw it; returns the runner's outputs and stores per partition."""
    runner = runner_for(app, **options)
    outputs: list[OutputRecord] = []
    stores: dict[int, dict[str, Any]] = {}
    late = seen = 0
    async with TestDriver(app) as driver:
        for key, amount, ts in records:
            await driver.put(
                "orders", key=key, value={"amount": amount, "user": key}, timestamp_ms=ts
            )
        await driver.drain()
        for partition in range(PARTITIONS):
            mine = [
                (r.key, r.value, r.timestamp, r.offset)
                for r in driver.raw_records(topic)
                if r.partition == partition and r.key is not None
            ]
            outputs.extend(runner.run(partition, mine))
            late += runner.stats["late"]
            seen += runner.stats["records"]
            stores[partition] = {name: list(s.items()) for name, s in runner.stores.items()}
            for name in list(stores[partition]):  # the worker's, to compare
                view = app.tables[name].active_partition(partition)
                stores[partition][f"worker:{name}"] = list(view.scan(b"", None))
        runner.stats["late"], runner.stats["records"] = late, seen
        return driver, runner, outputs, stores


@pytest.mark.parametrize("emit", ["update", "close"])
@pytest.mark.parametrize("spec_name", sorted(SPECS))
@settings(max_examples=12, deadline=None)
@given(records=records_strategy)
async def test_results_equal_the_workers(
    spec_name: str, emit: str, records: list[tuple[str, int, int]]
) -> None:
    agg = aggregator_of({"n": Count(), "total": Sum("amount"), "all": Collect("amount")})
    app = make_app(SPECS[spec_name], emit, agg)
    driver, runner, outputs, _ = await run_both(app, records)
    want = sent(driver.raw_records("results"))
    got = produced(outputs)
    assert got == want
    if emit == "update":  # every key's results in the same order
        worker = [(r.key, r.value) for r in driver.raw_records("results")]
        mine = [(o.key, o.value) for o in outputs]
        for key in {k for k, _ in worker}:
            assert [v for k, v in mine if k == key] == [v for k, v in worker if k == key]
    table = app.tables["totals"]
    assert runner.stats["late"] == table.emission_stats().late  # type: ignore[attr-defined]
    assert runner.stats["records"] == len(records)


@pytest.mark.parametrize("emit", ["update", "close"])
@pytest.mark.parametrize("spec_name", sorted(SPECS))
@settings(max_examples=10, deadline=None)
@given(records=records_strategy)
async def test_state_equals_the_workers_stores(
    spec_name: str, emit: str, records: list[tuple[str, int, int]]
) -> None:
    app = make_app(SPECS[spec_name], emit, Sum("amount"))
    _, _, outputs, stores = await run_both(app, records, mode="state")
    assert outputs == []
    names = ["totals", "totals-records"] if spec_name == "sliding" else ["totals"]
    for partition in range(PARTITIONS):
        assert sorted(n for n in stores[partition] if ":" not in n) == names
        for name in names:
            assert stores[partition][name] == stores[partition][f"worker:{name}"]
    if records:
        assert any(stores[p]["totals"] for p in stores)


@settings(max_examples=10, deadline=None)
@given(records=records_strategy)
async def test_final_only_is_the_last_result_of_each_window(
    records: list[tuple[str, int, int]],
) -> None:
    app = make_app(SPECS["session"], "update", Count())
    driver, _, outputs, _ = await run_both(app, records, final_only=True)
    last: dict[tuple[bytes, int], tuple[Any, ...]] = {}
    for r in driver.raw_records("results"):
        start = dict(r.headers)["window-start"]
        last[(r.key, int(start))] = (r.partition, r.key, r.value, r.timestamp, tuple(r.headers))
    want = sorted(v for v in last.values() if b'"value":null' not in v[2])
    assert produced(outputs) == want


@settings(max_examples=8, deadline=None)
@given(records=records_strategy)
async def test_re_keyed_records_equal_the_repartition_topic(
    records: list[tuple[str, int, int]],
) -> None:
    """Rekey makes the repartition agent's records; the runner over the repartition topic
    (as the worker read it) gives the worker's results."""
    app = make_app(
        SPECS["tumbling"], "update", Sum("amount"), key=lambda e: e.value["user"].upper()
    )
    decl = app.aggregations["totals"]
    assert decl.original is not None and decl.key is not None
    rekey = Rekey(
        decl.key,
        decl.original.name,
        decl.original.key_codec,
        decl.original.value_codec,
        decl.source.key_codec,
        decl.source.value_codec,
    )
    driver, _, outputs, _ = await run_both(app, records, topic=decl.source.name)
    assert produced(outputs) == sent(driver.raw_records("results"))
    made = sorted(
        rekey(r.key, r.value, r.partition, r.offset, r.timestamp)
        for r in driver.raw_records("orders")
    )
    assert made == sorted((r.key, r.value) for r in driver.raw_records(decl.source.name))


async def test_close_windows_at_end_closes_every_window() -> None:
    app = make_app(SPECS["tumbling"], "close", Count())
    runner = runner_for(app, close_windows_at_end=True)
    records = [(b"a", b"{}", 1_000, 0), (b"a", b"{}", 25_000, 1), (b"a", None, 26_000, 2)]
    outputs = list(runner.run(0, records))
    assert [(json.loads(o.value or b""), o.timestamp_ms) for o in outputs] == [
        ({"start": 0, "end": 10_000, "value": 1}, 9_999),
        ({"start": 20_000, "end": 30_000, "value": 1}, 29_999),
    ]
    assert runner.stats == {"records": 3, "outputs": 2, "late": 0}


def test_options_of_another_emission_are_refused() -> None:
    closing = make_app(SPECS["tumbling"], "close", Count())
    with pytest.raises(ConfigurationError, match="final_only"):
        runner_for(closing, final_only=True)
    updating = make_app(SPECS["tumbling"], "update", Count())
    with pytest.raises(ConfigurationError, match="close_windows_at_end"):
        runner_for(updating, close_windows_at_end=True)
    with pytest.raises(ConfigurationError, match="close_windows_at_end"):
        runner_for(closing, close_windows_at_end=True, mode="state")
