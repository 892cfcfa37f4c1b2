"""A backfill split beyond the join's partition count gives the same outputs as one task per
partition: as a multiset, and in the same order per key (left/outer unmatched included)."""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import streamjoin
from streamjoin.errors import ArgumentTypeError, ConfigurationError, CopartitioningError
from streamjoin.partitioner import partition_for_key
from streamjoin.spark.backfill_job import SortedRow, join_sorted_rows, split_count
from streamjoin.spark.runners import JoinRunner, OutputRecord

PARTITIONS = 3
WINDOW_MS = 1_000
GRACE_MS = 400
LEFT, RIGHT, OUT = "orders", "payments", "paid"


def pair(key: str, left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    return {"k": key, "l": left and left["id"], "r": right and right["id"]}


def make_app(how: str) -> streamjoin.App:
    app = streamjoin.App(f"parallel-{how}")
    left = app.topic(LEFT, key_serializer="str", partitions=PARTITIONS)
    right = app.topic(RIGHT, key_serializer="str", partitions=PARTITIONS)
    out = app.topic(OUT, key_serializer="str", partitions=PARTITIONS)
    app.join(
        left,
        right,
        window=timedelta(milliseconds=WINDOW_MS),
        grace=timedelta(milliseconds=GRACE_MS),
        how=how,
        output=out,
        name="j",
    )(pair)
    return app


def history(seed: int, events: int = 600, keys: int = 25) -> list[tuple[str, str, int, int]]:
    """``(topic, key, id, timestamp_ms)`` in arrival order: many events per key, out of order
    by less than the grace period, equal timestamps on both sides, and long gaps per key (so
    left/outer joins emit unmatched events)."""
    rng = random.Random(seed)
    records = []
    for i in range(events):
        ts = 10_000 + i * 37 + rng.choice([0, 0, 5_000]) * (i % 7 == 0)
        ts = ts - ts % 50  # collisions of timestamps
        topic = LEFT if rng.random() < 0.55 else RIGHT
        records.append((topic, f"key-{rng.randrange(keys)}", i, ts))
    arrival = sorted(records, key=lambda r: r[3] + rng.randrange(GRACE_MS - 50))
    return arrival


def sorted_rows(records: list[tuple[str, str, int, int]]) -> list[SortedRow]:
    """What Spark hands the tasks for a file source: join partition, then event-time order."""
    rows: list[SortedRow] = []
    for ordinal, (topic, key, ident, ts) in enumerate(records):
        raw = key.encode()
        side = JoinRunner.side_rank["left" if topic == LEFT else "right"]
        value = json.dumps({"id": ident}).encode()
        rows.append((partition_for_key(raw, PARTITIONS), ts, side, -1, ordinal, raw, value))
    rows.sort(key=lambda r: r[:5])
    return rows


def run_parts(
    app: streamjoin.App, rows: list[SortedRow], parts: int, advance: bool = True
) -> list[OutputRecord]:
    """Each join partition split into ``parts`` by a hash of the key, each part run alone."""
    runner = JoinRunner.for_join(app.config, app.joins["j"], PARTITIONS)
    ends: dict[int, int] = {}
    for row in rows:
        ends[row[0]] = max(ends.get(row[0], 0), row[1])
    out: list[OutputRecord] = []
    for part in range(parts):
        mine = [r for r in rows if zlib.crc32(r[5]) % parts == part]
        out.extend(
            join_sorted_rows(
                runner, mine, partitions=PARTITIONS, verify=False, ends=ends if advance else None
            )
        )
    return out


def per_key(outputs: list[OutputRecord]) -> dict[bytes | None, list[tuple[Any, ...]]]:
    by_key: dict[bytes | None, list[tuple[Any, ...]]] = defaultdict(list)
    for o in outputs:
        by_key[o.key].append((o.value, o.timestamp_ms, o.partition))
    return dict(by_key)


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_split_partitions_give_the_same_outputs_in_the_same_order_per_key(
    how: str, seed: int
) -> None:
    app = make_app(how)
    rows = sorted_rows(history(seed))
    whole = run_parts(app, rows, 1)
    assert whole, "the history must produce outputs"
    for parts in (2, 5):
        split = run_parts(app, rows, parts)
        assert Counter(split) == Counter(whole)
        assert per_key(split) == per_key(whole)
    if how != "inner":
        values = [json.loads(o.value or b"") for o in whole]
        unmatched = [v for v in values if v["l"] is None or v["r"] is None]
        assert unmatched, "left/outer histories must have unmatched events"
        # without the advance at the end, the parts close fewer windows: the test can fail
        assert Counter(run_parts(app, rows, 5, advance=False)) != Counter(whole)


def test_split_count() -> None:
    assert split_count(10, 2) == 1
    assert split_count(10, 10) == 1
    assert split_count(10, 11) == 2
    assert split_count(4, 16) == 4
    with pytest.raises(ConfigurationError, match="parallelism must be >= 1"):
        split_count(4, 0)
    with pytest.raises(ArgumentTypeError, match="partitions must be an int"):
        split_count("4", 8)  # type: ignore[arg-type]


def test_a_record_outside_its_murmur2_partition_is_refused() -> None:
    app = make_app("inner")
    runner = JoinRunner.for_join(app.config, app.joins["j"], PARTITIONS)
    key = b"key-1"
    kpart = partition_for_key(key, PARTITIONS)
    wrong = (kpart + 1) % PARTITIONS
    # Kafka input is grouped by the partition it was read from
    row: SortedRow = (wrong, 1, 0, wrong, 7, key, b"{}")
    with pytest.raises(CopartitioningError, match=f"murmur2 places in partition {kpart} of"):
        list(join_sorted_rows(runner, [row], partitions=PARTITIONS, verify=True))
    right: SortedRow = (kpart, 1, 0, kpart, 7, key, b"{}")
    assert list(join_sorted_rows(runner, [right], partitions=PARTITIONS, verify=True)) == []


def write_history(path: Path, records: list[tuple[str, str, int, int]]) -> None:
    with path.open("w") as f:
        for topic, key, ident, ts in records:
            row = {"topic": topic, "key": key, "value": {"id": ident}, "timestamp": ts}
            f.write(json.dumps(row) + "\n")


def read_outputs(out: Path) -> tuple[Counter[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]]]:
    """Outputs as a multiset, and per key in the order their task wrote them (one file per
    Spark task, and every record of a key is in one task)."""
    rows: Counter[tuple[Any, ...]] = Counter()
    by_key: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for part in sorted(out.glob("part-*.json")):
        for line in part.read_text().splitlines():
            r = json.loads(line)
            item = (r["partition"], r["key"], r["value"], r["timestamp"])
            rows[item] += 1
            by_key[r["key"]].append(item)
    return rows, dict(by_key)


@pytest.mark.spark
@pytest.mark.parametrize("how", ["left", "outer"])
def test_spark_backfill_with_parallelism_equals_one_task_per_partition(
    tmp_path: Path, how: str
) -> None:
    from streamjoin.spark import FileSink, FileSource, backfill
    from streamjoin.spark.testing import shared_test_session

    spark = shared_test_session()
    source = tmp_path / "history.json"
    write_history(source, history(seed=11))
    results = {}
    outputs = {}
    for parallelism in (1, 4 * PARTITIONS):
        out = tmp_path / f"out-{parallelism}"
        results[parallelism] = backfill(
            make_app(how),
            "j",
            source=FileSource([str(source)]),
            output=FileSink(str(out), "json"),
            spark=spark,
            parallelism=parallelism,
        )
        outputs[parallelism] = read_outputs(out)
    assert results[1].tasks == PARTITIONS and results[4 * PARTITIONS].tasks == 4 * PARTITIONS
    assert len(list((tmp_path / f"out-{4 * PARTITIONS}").glob("part-*.json"))) > PARTITIONS
    (one, one_by_key), (many, many_by_key) = outputs[1], outputs[4 * PARTITIONS]
    assert one and sum(one.values()) == results[1].outputs
    assert many == one
    assert many_by_key == one_by_key
    assert any(json.loads(value)["r"] is None for _, _, value, _ in one)
