"""Stream-table and table-table runners against brute-force oracles on random histories."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

import streamjoin
from streamjoin.codecs import JSON, STR
from streamjoin.spark.runners import StreamTableRunner, TableTableRunner
from tests.unit.spark.table_histories import (
    Rec,
    history,
    raw,
    runner_order,
    stream_table_oracle,
    table_table_oracle,
)

PARTITIONS = 3


def enrich(key: str, click: Any, user: Any) -> dict[str, Any]:
    return {"key": key, "click": click["n"] if click else None, "user": user}


async def enrich_async(key: str, click: Any, user: Any) -> dict[str, Any]:
    await asyncio.sleep(0)
    return enrich(key, click, user)


def combine(key: str, left: Any, right: Any) -> Any:
    # depends on "v" only, so some updates leave the result unchanged (nothing emitted)
    return [None if left is None else left["v"], None if right is None else right["v"]]


def canonical(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


def decode_outputs(outputs: Any) -> list[tuple[str, Any, int]]:
    return [
        (STR.loads(o.key), None if o.value is None else JSON.loads(o.value), o.timestamp_ms)
        for o in outputs
    ]


def run_partitions(runner: Any, records: list[Rec], sides: dict[str, str]) -> list[Any]:
    out = []
    for p in range(PARTITIONS):
        mine = runner_order([r for r in records if r.partition == p], runner.side_rank, sides)
        out.extend(
            runner.run((sides[r.topic], r.key.encode(), raw(r), r.timestamp_ms) for r in mine)
        )
    return out


def stream_table_runner(how: str, fun: Any, emit_from_ms: int | None = None) -> StreamTableRunner:
    return StreamTableRunner(
        how,
        fun,
        STR,
        JSON,
        STR,
        JSON,
        STR,
        JSON,
        PARTITIONS,
        emit_from_ms,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("how", ["inner", "left"])
def test_stream_table_runner_matches_the_as_of_oracle(seed: int, how: str) -> None:
    records = history(
        {"clicks": 2, "users": 1}, seed=seed, count=400, keys=12, partitions=PARTITIONS
    )
    runner = stream_table_runner(how, enrich)
    got = decode_outputs(run_partitions(runner, records, {"clicks": "left", "users": "right"}))
    want = stream_table_oracle(records, "clicks", "users", how, enrich)
    assert Counter(map(canonical, got)) == Counter(map(canonical, want))
    assert len(want) > 50


def test_stream_table_runner_sees_a_row_of_the_same_timestamp_and_awaits() -> None:
    records = [
        Rec("users", "a", {"n": 0, "v": 1}, 100, 0, 0),
        Rec("clicks", "a", {"n": 1, "v": 0}, 100, 0, 0),  # same time as the row: sees it
        Rec("clicks", "b", {"n": 2, "v": 0}, 100, 0, 1),  # no row: inner drops it
        Rec("users", "a", None, 150, 0, 1),  # deleted
        Rec("clicks", "a", {"n": 3, "v": 0}, 160, 0, 2),
        Rec("clicks", "a", {"n": 4, "v": 0}, 120, 0, 3),  # out of order: as of 120 the row is there
    ]
    runner = StreamTableRunner(
        "inner",
        enrich_async,
        STR,
        JSON,
        STR,
        JSON,
        STR,
        JSON,
        1,  # type: ignore[arg-type]
    )
    ordered = sorted(
        records, key=lambda r: (r.timestamp_ms, 0 if r.topic == "users" else 1, r.offset)
    )
    got = decode_outputs(
        runner.run(
            ("right" if r.topic == "users" else "left", r.key.encode(), raw(r), r.timestamp_ms)
            for r in ordered
        )
    )
    assert got == [
        ("a", {"key": "a", "click": 1, "user": {"n": 0, "v": 1}}, 100),
        ("a", {"key": "a", "click": 4, "user": {"n": 0, "v": 1}}, 120),
    ]
    assert runner.stats["records"] == 6 and runner.stats["outputs"] == 2


def test_stream_table_runner_emits_from_the_start_time_with_earlier_rows_applied() -> None:
    records = history({"clicks": 2, "users": 1}, seed=11, count=300, keys=8, partitions=PARTITIONS)
    start = sorted(r.timestamp_ms for r in records)[150]
    runner = stream_table_runner("left", enrich, emit_from_ms=start)
    got = decode_outputs(run_partitions(runner, records, {"clicks": "left", "users": "right"}))
    want = stream_table_oracle(records, "clicks", "users", "left", enrich, start)
    assert Counter(map(canonical, got)) == Counter(map(canonical, want))
    assert all(ts >= start for _, _, ts in got)


def table_table_runner(
    how: str, final_only: bool = False, emit_from_ms: int | None = None
) -> TableTableRunner:
    return TableTableRunner(
        how,  # type: ignore[arg-type]
        combine,
        STR,
        JSON,
        STR,
        JSON,
        JSON,
        STR,
        JSON,
        PARTITIONS,
        final_only,
        emit_from_ms,
    )


def per_key(changes: list[tuple[str, Any, int]]) -> dict[str, list[tuple[Any, int]]]:
    out: dict[str, list[tuple[Any, int]]] = {}
    for key, value, ts in changes:
        out.setdefault(key, []).append((value, ts))
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_table_table_runner_matches_the_change_oracle(seed: int, how: str) -> None:
    records = history(
        {"profiles": 1, "scores": 1}, seed=seed, count=400, keys=10, partitions=PARTITIONS
    )
    sides = {"profiles": "left", "scores": "right"}
    got = decode_outputs(run_partitions(table_table_runner(how), records, sides))
    want = table_table_oracle(records, "profiles", "scores", how, combine)
    assert per_key(got) == per_key(want)  # the same changes in the same order per key
    assert any(value is None for _, value, _ in want)  # vanished rows are emitted as None


@pytest.mark.parametrize("how", ["inner", "outer"])
def test_table_table_runner_final_only_and_start_time(how: str) -> None:
    records = history(
        {"profiles": 1, "scores": 1}, seed=7, count=400, keys=15, partitions=PARTITIONS
    )
    sides = {"profiles": "left", "scores": "right"}
    final = decode_outputs(run_partitions(table_table_runner(how, final_only=True), records, sides))
    assert per_key(final) == per_key(
        table_table_oracle(records, "profiles", "scores", how, combine, final_only=True)
    )
    assert all(value is not None for _, value, _ in final)
    start = sorted(r.timestamp_ms for r in records)[200]
    later = decode_outputs(
        run_partitions(table_table_runner(how, emit_from_ms=start), records, sides)
    )
    assert per_key(later) == per_key(
        table_table_oracle(records, "profiles", "scores", how, combine, emit_from_ms=start)
    )


def test_runners_for_declared_joins_take_the_apps_codecs() -> None:
    from streamjoin.spark.runners import StreamTableRunner as STR_
    from streamjoin.spark.runners import TableTableRunner as TTR

    app = streamjoin.App("runner-decls")
    clicks = app.topic("clicks", key_serializer="str", partitions=PARTITIONS)
    users = app.topic_table(app.topic("users", key_serializer="str", partitions=PARTITIONS))
    scores = app.topic_table(app.topic("scores", key_serializer="str", partitions=PARTITIONS))
    out = app.topic("enriched", key_serializer="str")
    app.join(clicks, users, how="left", output=out, name="enrich")(enrich)
    app.join(users, scores, how="outer", name="both")(combine)
    st = STR_.for_join(app.config, app.joins["enrich"], PARTITIONS)
    tt = TTR.for_join(app.config, app.joins["both"], PARTITIONS, final_only=True)
    assert (st.how, st.stream_key_codec.name, st.out_key_codec.name) == ("left", "str", "str")
    assert (tt.how, tt.final_only, tt.left_key_codec.name) == ("outer", True, "str")
