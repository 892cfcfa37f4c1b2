"""Stream-table enrichment: events joined with a table's row for their key, streamjoin vs
Kafka Streams vs Quix Streams vs Faust.

    .venv/bin/python -m benchmarks.enrichment                      # starts a local broker
    .venv/bin/python -m benchmarks.enrichment --events 20000 --keys 1000 --workers 2
    .venv/bin/python -m benchmarks.enrichment --events 3000000 --systems streamjoin,kstreams

The input: a table topic of ``--keys`` rows (default 10,000: ``user -> {tier, country}``,
timestamped an hour before the events) and ``--events`` JSON events (default 300,000) keyed
by user, both with ``--partitions`` (8) partitions, produced once (table first). Each system
sends every event to its output enriched with the row of its key (a left join: an event
whose row the system has not read yet goes out with ``tier`` None):

* streamjoin: ``app.topic_table(users)`` and ``@app.join(events, users_table, how="left")``
  (``benchmarks/workload_streamjoin_app.py``);
* Kafka Streams 4.3: the table topic as a ``KTable`` (``stream(...).toTable(...)``, so that
  its rows are marked as read), ``KStream.leftJoin(KTable, ...)``, JSON parsed with Jackson,
  one stream thread, at-least-once, default caching, a commit every second
  (``--kstreams-commit-ms``) as streamjoin's (``TableJoins.java --workload enrich`` in
  ``benchmarks/kstreams/``, built here with Maven);
* Quix Streams: ``events.join_asof(users, how="left")``
  (``benchmarks/workload_quix_app.py``);
* faust-streaming: an agent keeps the rows in a Table, the events' agent looks them up
  (``benchmarks/workload_faust_app.py``).

Every system's output is checked against the rows: ``missing`` (an event with no output),
``unenriched`` (sent without its row), ``wrong`` (another row), ``unexpected`` (an event
that was never produced), ``duplicates``. Input events
for the per-event figures are the table rows plus the events. CPU time, wall time and peak
RSS are measured as ``benchmarks/harness.py`` describes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    Topics,
    WorkloadSpec,
    output_reached,
    read_topic,
    workload_arguments,
    workload_main,
)

SPAN_MS = 10 * 60_000
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TIERS = ("free", "basic", "pro", "enterprise")
COUNTRIES = ("DE", "FR", "US", "JP", "BR", "IN", "NG", "AU")


def generate(
    events: int, keys: int, seed: int
) -> tuple[list[tuple[str, bytes, bytes, int]], dict[int, tuple[str, str]]]:
    """The records (rows first, then events) and each event id's true (tier, country)."""
    rng = random.Random(seed)
    records = []
    rows: dict[str, tuple[str, str]] = {}
    for k in range(keys):
        user = f"user-{k:05d}"
        rows[user] = (rng.choice(TIERS), rng.choice(COUNTRIES))
        value = {"user": user, "tier": rows[user][0], "country": rows[user][1]}
        records.append(
            ("table", user.encode(), json.dumps(value).encode(), BASE_MS - 3_600_000 + k)
        )
    truth: dict[int, tuple[str, str]] = {}
    for i in range(events):
        user = f"user-{rng.randrange(keys):05d}"
        ts = BASE_MS + i * SPAN_MS // events
        event: dict[str, Any] = {"event_id": i, "user": user, "amount": rng.randrange(1, 10_000)}
        records.append(("input", user.encode(), json.dumps(event).encode(), ts))
        truth[i] = rows[user]
    return records, truth


#: (key, value) of every output record
Outputs = list[tuple[bytes | None, bytes | None]]


def check_enriched(truth: Mapping[int, Sequence[str]], outputs: Outputs) -> dict[str, int]:
    """Each event's first output against its true (tier, country): ``missing``,
    ``unenriched`` (tier None), ``wrong`` (another row), ``unexpected`` (an event that was
    never sent, counted only there), ``duplicates`` (outputs after an event's first)."""
    seen: Counter[int] = Counter()
    unenriched = wrong = 0
    for _key, raw in outputs:
        value = json.loads(raw or b"null")
        event_id = value["event_id"]
        seen[event_id] += 1
        if seen[event_id] > 1:
            continue
        got = (value.get("tier"), value.get("country"))
        if got[0] is None:
            unenriched += 1
        elif event_id in truth and got != tuple(truth[event_id]):
            wrong += 1
    return {
        "expected": len(truth),
        "missing": sum(1 for i in truth if i not in seen),
        "unenriched": unenriched,
        "wrong": wrong,
        "unexpected": sum(1 for i in seen if i not in truth),
        "duplicates": sum(n - 1 for n in seen.values()),
    }


def enrichment_spec(
    args: Any,
    records: list[tuple[str, bytes, bytes, int]],
    truth: Mapping[int, Sequence[str]],
    *,
    bench: str = "enrichment",
    values: str = "",
    decode: Callable[[Outputs], Outputs] = lambda outputs: outputs,
) -> WorkloadSpec:
    """The workload of ``records`` checked against ``truth``; ``decode`` turns the output
    values into JSON first (``enrichment_avro.py``), ``values`` names them in the head."""

    async def check(_marks: list[Path], topics: Topics, bootstrap: str) -> dict[str, int]:
        assert topics.output is not None
        outputs = await read_topic(bootstrap, topics.output, args.partitions)
        return check_enriched(truth, decode(outputs))

    async def settle(_marks: list[Path], topics: Topics, bootstrap: str) -> None:
        assert topics.output is not None
        await output_reached(bootstrap, topics.output, args.partitions, len(truth))

    return WorkloadSpec(
        bench=bench,
        workload="enrich",
        records=records,
        head=f"{args.keys:,} table rows + {args.events:,} events{values}, left stream-table join",
        check=check,
        settle=settle,
        uses_table=True,
        uses_output=True,
        # (JSON values only: the Kafka Streams app has no Avro serde)
        kstreams_app="" if values else "TableJoins",
        kstreams_params={"workload": "enrich"},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_arguments(parser, events=300_000, keys=10_000)
    args = parser.parse_args(argv)
    records, truth = generate(args.events, args.keys, args.seed)
    return workload_main(args, enrichment_spec(args, records, truth))


if __name__ == "__main__":
    raise SystemExit(main())
