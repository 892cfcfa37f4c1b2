"""Each backfill kind, run by Spark through the documented ``streamjoin.spark`` entry points
on random file histories with out-of-order records, equals a brute-force oracle."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import streamjoin
from tests.unit.joins.test_join_properties import Ev, brute_force
from tests.unit.spark.table_histories import (
    Rec,
    decoded,
    history,
    raw,
    stream_table_oracle,
    table_table_oracle,
)

pytestmark = pytest.mark.spark
PARTITIONS = 3


def write(path: Path, rows: list[tuple[str, str, bytes | None, int]]) -> str:
    """JSON lines (topic, key, value text or null, timestamp), shuffled: file order is no order."""
    rows = list(rows)
    random.Random(1).shuffle(rows)
    with path.open("w") as f:
        for topic, key, value, ts in rows:
            text = None if value is None else value.decode()
            f.write(json.dumps({"topic": topic, "key": key, "value": text, "timestamp": ts}) + "\n")
    return str(path)


def read_outputs(directory: Path) -> list[tuple[str, Any, int]]:
    out = []
    for part in sorted(directory.glob("*.json")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            value = None if row.get("value") is None else json.loads(row["value"])
            out.append((row["key"], value, row["timestamp"]))
    return out


def canonical(items: Any) -> Counter[str]:
    return Counter(json.dumps(i, sort_keys=True) for i in items)


def backfill_to_files(
    app: streamjoin.App, join: str, source_path: str, out: Path, **kw: Any
) -> Any:
    from streamjoin.spark import FileSink, FileSource, backfill
    from streamjoin.spark.testing import shared_test_session

    return backfill(
        app,
        join,
        source=FileSource([source_path], **kw.pop("source", {})),
        output=FileSink(str(out), "json"),
        spark=shared_test_session(),
        **kw,
    )


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_stream_stream_backfill_equals_the_brute_force_join(tmp_path: Path, how: str) -> None:
    window, grace = 50, 40
    rng = random.Random(how)
    events: list[Ev] = []
    now = 1_000
    for i in range(500):
        now += rng.randint(0, 6)
        side = rng.choice(["left", "right"])
        # out of order by up to the grace period, as workers accept it
        events.append(
            Ev(
                side,
                f"k{rng.randrange(20)}".encode(),
                now - rng.randint(0, grace),
                f"{side[0]}{i}".encode(),
            )
        )
    app = streamjoin.App("oracle-ss")
    left = app.topic("l", key_serializer="str", value_serializer="str", partitions=PARTITIONS)
    right = app.topic("r", key_serializer="str", value_serializer="str", partitions=PARTITIONS)
    out = app.topic("o", key_serializer="str", partitions=PARTITIONS)
    app.join(left, right, window=window, grace=grace, how=how, output=out, name="j")(
        lambda key, lv, rv: [lv, rv]
    )
    rows = [("l" if e.side == "left" else "r", e.key.decode(), e.value, e.ts) for e in events]
    result = backfill_to_files(
        app, "j", write(tmp_path / "in.json", rows), tmp_path / "out", close_windows_at_end=True
    )
    spec = app.joins["j"].spec
    want = [
        (
            o.key.decode(),
            [
                None if o.left is None else o.left.decode(),
                None if o.right is None else o.right.decode(),
            ],
            o.timestamp_ms,
        )
        for o, n in brute_force(spec, events).items()
        for _ in range(n)
    ]
    assert canonical(read_outputs(tmp_path / "out")) == canonical(want)
    assert result.outputs == len(want) and result.records_read == len(events)


def table_rows(records: list[Rec]) -> list[tuple[str, str, bytes | None, int]]:
    return [(r.topic, r.key, raw(r), r.timestamp_ms) for r in records]


@pytest.mark.parametrize("how", ["inner", "left"])
def test_stream_table_backfill_equals_the_as_of_oracle(tmp_path: Path, how: str) -> None:
    records = history({"clicks": 2, "users": 1}, seed=21, count=600, keys=20, partitions=PARTITIONS)
    app = streamjoin.App("oracle-st")
    clicks = app.topic("clicks", key_serializer="str", partitions=PARTITIONS)
    users = app.topic_table(app.topic("users", key_serializer="str", partitions=PARTITIONS))
    out = app.topic("o", key_serializer="str", partitions=PARTITIONS)

    def enrich(key: str, click: Any, user: Any) -> list[Any]:
        return [click, user]

    app.join(clicks, users, how=how, output=out, name="j")(enrich)
    start = sorted(r.timestamp_ms for r in records)[300]
    path = write(tmp_path / "in.json", table_rows(records))
    backfill_to_files(app, "j", path, tmp_path / "all")
    want = stream_table_oracle(records, "clicks", "users", how, enrich)
    assert canonical(read_outputs(tmp_path / "all")) == canonical(want)
    # from a start time: rows before it still count, clicks before it are not joined
    backfill_to_files(app, "j", path, tmp_path / "late", source={"start_timestamp_ms": start})
    late = stream_table_oracle(records, "clicks", "users", how, enrich, start)
    assert canonical(read_outputs(tmp_path / "late")) == canonical(late)
    assert 0 < len(late) < len(want)


@pytest.mark.parametrize("how", ["inner", "outer"])
def test_table_table_backfill_equals_the_change_oracle(tmp_path: Path, how: str) -> None:
    records = history({"a": 1, "b": 1}, seed=22, count=500, keys=12, partitions=PARTITIONS)
    app = streamjoin.App("oracle-tt")
    left = app.topic_table(app.topic("a", key_serializer="str", partitions=PARTITIONS))
    right = app.topic_table(app.topic("b", key_serializer="str", partitions=PARTITIONS))
    out = app.topic("o", key_serializer="str", partitions=PARTITIONS)

    def combine(key: str, lv: Any, rv: Any) -> list[Any]:
        return [None if lv is None else lv["v"], None if rv is None else rv["v"]]

    app.join(left, right, how=how, output=out, name="j")(combine)
    path = write(tmp_path / "in.json", table_rows(records))

    def per_key(items: list[tuple[str, Any, int]]) -> dict[str, list[tuple[Any, int]]]:
        keyed: dict[str, list[tuple[Any, int]]] = {}
        for key, value, ts in items:  # a key's changes are in one file, in order
            keyed.setdefault(key, []).append((value, ts))
        return keyed

    backfill_to_files(app, "j", path, tmp_path / "changes")
    want = table_table_oracle(records, "a", "b", how, combine)
    assert per_key(read_outputs(tmp_path / "changes")) == per_key(want)
    backfill_to_files(app, "j", path, tmp_path / "final", final_only=True)
    final = table_table_oracle(records, "a", "b", how, combine, final_only=True)
    assert canonical(read_outputs(tmp_path / "final")) == canonical(final)
    assert {decoded(r) is None for r in records} == {True, False}
