"""Random topic histories and brute-force oracles for stream-table and table-table backfills.

The oracles follow the definitions in docs/spark.md record by record (no incremental state):
a stream record joins the latest row of its key at or before its timestamp; a table-table
join emits, per key, each change of the join function's result over the timestamp-ordered
updates of both sides.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamjoin.partitioner import partition_for_key


@dataclass(frozen=True)
class Rec:
    topic: str
    key: str
    value: Any  # None: a null value (tombstone)
    timestamp_ms: int
    partition: int
    offset: int


def history(
    topics: dict[str, float],
    *,
    seed: int,
    count: int,
    keys: int,
    partitions: int,
    tombstones: float = 0.15,
    disorder_ms: int = 400,
) -> list[Rec]:
    """``count`` records spread over ``topics`` (name -> share), in production order: time
    runs forward with steps of 0-40 ms, each record's timestamp jittered back by up to
    ``disorder_ms`` (out of order within a partition); table values include nulls and JSON
    ``null`` (both delete a topic table's row)."""
    rng = random.Random(seed)
    names, weights = list(topics), list(topics.values())
    offsets: dict[tuple[str, int], int] = {}
    now = 1_700_000_000_000
    out = []
    for i in range(count):
        now += rng.randint(0, 40)
        topic = rng.choices(names, weights)[0]
        key = f"k{rng.randrange(keys)}"
        partition = partition_for_key(key.encode(), partitions)
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        roll = rng.random()
        value: Any
        if roll < tombstones * 0.7:
            value = None
        elif roll < tombstones:
            value = "null-json"  # marker: written as the JSON text null
        else:
            value = {"n": i, "v": rng.randrange(4)}
        ts = now - rng.randint(0, disorder_ms)
        out.append(Rec(topic, key, value, ts, partition, offset))
    return out


def raw(rec: Rec) -> bytes | None:
    if rec.value is None:
        return None
    if rec.value == "null-json":
        return b"null"
    return json.dumps(rec.value).encode()


def decoded(rec: Rec) -> Any:
    return None if rec.value in (None, "null-json") else rec.value


def runner_order(records: list[Rec], rank: dict[str, int], sides: dict[str, str]) -> list[Rec]:
    """The order the Spark job feeds a runner: (timestamp, side rank, partition, offset)."""
    return sorted(
        records, key=lambda r: (r.timestamp_ms, rank[sides[r.topic]], r.partition, r.offset)
    )


def stream_table_oracle(
    records: list[Rec],
    stream: str,
    table: str,
    how: str,
    fun: Callable[[Any, Any, Any], Any],
    emit_from_ms: int | None = None,
) -> list[tuple[str, Any, int]]:
    """Each stream record with the latest row of its key at or before its timestamp."""
    rows = [r for r in records if r.topic == table]
    out = []
    for rec in records:
        if rec.topic != stream:
            continue
        if emit_from_ms is not None and rec.timestamp_ms < emit_from_ms:
            continue
        earlier = [r for r in rows if r.key == rec.key and r.timestamp_ms <= rec.timestamp_ms]
        latest = max(earlier, key=lambda r: (r.timestamp_ms, r.offset), default=None)
        current = None if latest is None else decoded(latest)
        if current is None and how == "inner":
            continue
        result = fun(rec.key, decoded(rec), current)
        if result is not None:
            out.append((rec.key, result, rec.timestamp_ms))
    return out


def table_table_oracle(
    records: list[Rec],
    left: str,
    right: str,
    how: str,
    fun: Callable[[Any, Any, Any], Any],
    *,
    final_only: bool = False,
    emit_from_ms: int | None = None,
) -> list[tuple[str, Any, int]]:
    """Per key, each change of ``fun``'s result over the timestamp-ordered updates."""
    ordered = sorted(records, key=lambda r: (r.timestamp_ms, 0 if r.topic == left else 1, r.offset))
    out: list[tuple[str, Any, int]] = []
    for key in sorted({r.key for r in records}):
        mine = [r for r in ordered if r.key == key]
        previous: Any = None
        changes: list[tuple[str, Any, int]] = []
        for i, rec in enumerate(mine):
            seen = mine[: i + 1]
            lefts = [r for r in seen if r.topic == left]
            rights = [r for r in seen if r.topic == right]
            lv = decoded(lefts[-1]) if lefts else None
            rv = decoded(rights[-1]) if rights else None
            keep = {
                "inner": lv is not None and rv is not None,
                "left": lv is not None,
                "outer": lv is not None or rv is not None,
            }[how]
            joined = fun(key, lv, rv) if keep else None
            if joined == previous:
                continue
            previous = joined
            if emit_from_ms is None or rec.timestamp_ms >= emit_from_ms:
                changes.append((key, joined, rec.timestamp_ms))
        if final_only:
            changes = changes[-1:] if changes and changes[-1][1] is not None else []
        out.extend(changes)
    return out
