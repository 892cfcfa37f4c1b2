"""Windowed count: 1-minute tumbling windows per key, streamjoin vs Kafka Streams vs Quix
Streams vs Faust.

    .venv/bin/python -m benchmarks.window_count                      # starts a local broker
    .venv/bin/python -m benchmarks.window_count --events 20000 --keys 1000 --workers 2
    .venv/bin/python -m benchmarks.window_count --events 5000000 --systems streamjoin,kstreams

The input: ``--events`` JSON events (default 500,000) over ``--keys`` keys (default 10,000),
keyed by user, spread over 10 minutes of event time in order with up to 2 s of jitter,
produced once into a fresh ``--partitions`` (8) partition topic. Each system counts events
per key and 1-minute window in a windowed table with RocksDB state and a changelog:

* streamjoin: ``app.table(..., window=TumblingWindows(60 s, retention 1 h))``,
  ``counts[event.key] += 1`` (``benchmarks/workload_streamjoin_app.py``); the values are
  declared JSON and parsed, or, as system ``streamjoin-str``, declared ``str`` and decoded
  as UTF-8 only, the work of the Kafka Streams peer's ``Serdes.String()``;
* Kafka Streams 4.3: ``groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(60 s, 5 s))
  .count()`` with a 1-hour retention, one stream thread, at-least-once, default caching, a
  commit every second (``--kstreams-commit-ms``) as streamjoin's; the windows are read
  through interactive queries once every partition is done (``WindowKinds.java`` in
  ``benchmarks/kstreams/``, built here with Maven; its window changelog keeps everything,
  ``retention.ms=-1``: the input's event times are older than the default retention);
* Quix Streams: ``tumbling_window(60 s, grace 5 s).count().current()``
  (``benchmarks/workload_quix_app.py``);
* faust-streaming: ``Table(default=int).tumbling(60 s).relative_to_stream()``
  (``benchmarks/workload_faust_app.py``).

The answer is each system's windows once the last offset of every partition is processed
(written by the app after its last mark, see the app modules; the harness waits for them),
checked against the counts computed here:
``missing`` (key and window absent), ``wrong`` (another count), ``unexpected``. CPU time,
wall time and peak RSS are measured as ``benchmarks/harness.py`` describes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections import Counter
from pathlib import Path

from benchmarks.harness import Topics, WorkloadSpec, workload_arguments, workload_main

WINDOW_MS = 60_000
GRACE_MS = 5_000
RETENTION_MS = 3_600_000
SPAN_MS = 10 * 60_000
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
JITTER_MS = 2_000


def generate(
    events: int, keys: int, seed: int
) -> tuple[list[tuple[str, bytes, bytes, int]], Counter[tuple[str, int]]]:
    """The input records and the true count per (key, window start)."""
    rng = random.Random(seed)
    records = []
    truth: Counter[tuple[str, int]] = Counter()
    for i in range(events):
        key = f"user-{rng.randrange(keys):05d}"
        ts = BASE_MS + i * SPAN_MS // events + rng.randrange(JITTER_MS)
        value = {"user": key, "page": f"/p/{rng.randrange(100)}", "seq": i}
        records.append(("input", key.encode(), json.dumps(value).encode(), ts))
        truth[(key, ts - ts % WINDOW_MS)] += 1
    return records, truth


def read_dumps(marks: list[Path]) -> dict[tuple[str, int], int]:
    """The windows the apps wrote: per-partition dumps (the newest per partition wins: a
    partition processed again after a rebalance is dumped again) or one whole dump."""
    newest: dict[str, Path] = {}
    for path in marks:
        for dump in path.parent.glob(f"{path.name}.dump.*"):
            part = dump.name.rsplit(".", 1)[-1]
            if part not in newest or dump.stat().st_mtime > newest[part].stat().st_mtime:
                newest[part] = dump
    got: dict[tuple[str, int], int] = {}
    for dump in newest.values():
        for line in dump.read_text().splitlines():
            key, start, n = json.loads(line)
            got[(key, int(start))] = int(n)
    return got


def dumps_complete(marks: list[Path], partitions: int) -> bool:
    """Whether the apps' dumps cover every partition (they are written after the marks)."""
    parts = {
        dump.name.rsplit(".", 1)[-1]
        for path in marks
        for dump in path.parent.glob(f"{path.name}.dump.*")
        if ".tmp-" not in dump.name
    }
    return "all" in parts or parts >= {f"p{p}" for p in range(partitions)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_arguments(parser, events=500_000, keys=10_000)
    args = parser.parse_args(argv)
    records, truth = generate(args.events, args.keys, args.seed)

    async def check(marks: list[Path], _topics: Topics, _bootstrap: str) -> dict[str, int]:
        got = read_dumps(marks)
        return {
            "expected": len(truth),
            "missing": sum(1 for k in truth if k not in got),
            "wrong": sum(1 for k, n in truth.items() if k in got and got[k] != n),
            "unexpected": sum(1 for k in got if k not in truth),
        }

    async def settle(marks: list[Path], _topics: Topics, _bootstrap: str) -> None:
        for _ in range(1200):  # at most a minute
            if dumps_complete(marks, args.partitions):
                return
            await asyncio.sleep(0.05)

    spec = WorkloadSpec(
        bench="window_count",
        workload="count",
        records=records,
        head=(
            f"{len(records):,} events, {args.keys:,} keys, {len(truth):,} (key, window) "
            "counts, 1-minute tumbling windows"
        ),
        check=check,
        settle=settle,
        kstreams_app="WindowKinds",
        kstreams_params={
            "window": "tumbling",
            "emit": "update",
            "size-ms": WINDOW_MS,
            "grace-ms": GRACE_MS,
            "retention-ms": RETENTION_MS,
            # the windows the dump reads (by start)
            "from-ms": BASE_MS - WINDOW_MS,
            "to-ms": BASE_MS + SPAN_MS + JITTER_MS,
        },
    )
    return workload_main(args, spec)


if __name__ == "__main__":
    raise SystemExit(main())
