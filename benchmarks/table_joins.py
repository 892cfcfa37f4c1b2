"""Joins with the newer table kinds: streamjoin vs Kafka Streams 4.x, same run, same broker.

    .venv/bin/python -m benchmarks.table_joins --workload global        # starts a broker
    .venv/bin/python -m benchmarks.table_joins --workload fk --events 1000000 --repeat 3
    .venv/bin/python -m benchmarks.table_joins --workload global --keys 1000000 --events 100000

Workloads (``--workload``):

* ``global``: a global table of ``--keys`` user rows (``user -> {tier, country}``) and
  ``--events`` events keyed by their own id (not by user: nothing is co-partitioned), each
  left-joined with the row of its ``user`` field. streamjoin: ``app.global_table(users)``
  and ``@app.join(events, users, key=...)``; Kafka Streams: ``builder.globalTable`` and
  ``KStream.leftJoin(GlobalKTable, ...)``. Checked per event: ``missing``, ``unenriched``,
  ``wrong``, ``duplicates``. Every row is written before the events, and both systems read
  a global table to its end before they process the stream, so nothing may go unenriched.
  The time from the process's spawn to its first event (``startup s``) includes reading
  the whole global table: with ``--keys 1000000`` it is the restore time of a 1M-row table.
* ``fk``: a foreign-key table-table join (KIP-213): ``--keys`` customers and ``--events``
  order records on ``--events // 4`` order ids (so an order changes about four times, its
  customer with it), 5% of them deletes, with customer updates (10% of the records) and
  deletes (1%) in between. streamjoin: two ``app.topic_table`` tables and ``@app.join(orders,
  customers, foreign_key=...)``; Kafka Streams: ``KTable.join(KTable, foreignKeyExtractor,
  ...)``. Checked on the output topic's last record per order against the join of the final
  tables: ``missing`` (a row of the join absent or deleted), ``wrong`` (another value),
  ``unexpected`` (a row the join does not have). A foreign-key join works on after its last
  input (subscriptions and responses go through internal topics), so its wall and CPU time
  run from the first input record until every input partition was processed and the
  output's last record per order equals the join (the broker's append time of the output
  record that completed it; CPU read from ``/proc`` when it is seen). Kafka Streams
  commits every second here (``--kstreams-commit-ms``), as streamjoin does at-least-once:
  with its default of 30 s its caches hold the join's results back for half a minute.

Systems (``--systems``, in run order): ``streamjoin``
(``benchmarks/table_joins_streamjoin_app.py``) and ``kstreams`` (``benchmarks/kstreams/``,
``TableJoins.java``, built here with Maven; JSON with Jackson; one stream thread, default
caching, a commit every second). Rounds (``--repeat``) are interleaved. CPU time, wall time and
peak RSS as ``benchmarks/harness.py`` describes; ``x KS`` columns are ratios against Kafka
Streams' median round.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from benchmarks.enrichment import COUNTRIES, TIERS, Outputs, check_enriched
from benchmarks.harness import (
    KSTREAMS_COLUMNS,
    Launch,
    bench_arguments,
    bench_main,
    chosen_systems,
    kstreams_arguments,
    kstreams_build,
    kstreams_command,
    kstreams_version,
    last_offsets,
    machine,
    output_reached,
    produce,
    read_records,
    results_table,
    rounds_report,
    run_rounds,
    sayer,
    streamjoin_command,
    streamjoin_version,
    wait_leaders,
)

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SYSTEMS = ("streamjoin", "kstreams")
#: seconds without output growth after which a foreign-key join that has not reached the
#: right answer is given up on (its check then says what is wrong)
QUIET_S = 60.0

#: (logical topic "input" or "table", key, value or None, timestamp ms), in produce order
Records = list[tuple[str, bytes, bytes | None, int]]


@dataclass(frozen=True)
class Workload:
    records: Records
    #: global: event id -> (tier, country); fk: order id -> the joined row
    truth: dict[Any, Any]
    head: str


def global_workload(events: int, keys: int, seed: int) -> Workload:
    rng = random.Random(seed)
    records: Records = []
    rows: dict[str, tuple[str, str]] = {}
    for k in range(keys):
        user = f"user-{k:07d}"
        rows[user] = (rng.choice(TIERS), rng.choice(COUNTRIES))
        value = {"user": user, "tier": rows[user][0], "country": rows[user][1]}
        records.append(("table", user.encode(), json.dumps(value).encode(), BASE_MS - 1_000))
    truth: dict[Any, Any] = {}
    for i in range(events):
        user = f"user-{rng.randrange(keys):07d}"
        event: dict[str, Any] = {"event_id": i, "user": user, "amount": rng.randrange(1, 10_000)}
        records.append(("input", f"e-{i}".encode(), json.dumps(event).encode(), BASE_MS + i))
        truth[i] = rows[user]
    return Workload(
        records,
        truth,
        f"global table of {keys:,} rows + {events:,} events (keyed by event id), left join",
    )


def fk_workload(events: int, keys: int, seed: int) -> Workload:
    rng = random.Random(seed)
    records: Records = []
    customers: dict[str, dict[str, Any]] = {}
    orders: dict[str, dict[str, Any]] = {}
    ts = BASE_MS

    def customer_row(c: str) -> dict[str, Any]:
        return {
            "customer": c,
            "name": f"name-{rng.randrange(10**6)}",
            "country": rng.choice(COUNTRIES),
        }

    for k in range(keys):
        c = f"c-{k:06d}"
        customers[c] = customer_row(c)
        records.append(("table", c.encode(), json.dumps(customers[c]).encode(), ts))
        ts += 1
    order_ids = max(1, events // 4)
    for _ in range(events):
        ts += 1
        dice = rng.random()
        if dice < 0.10:  # a customer changes
            c = f"c-{rng.randrange(keys):06d}"
            customers[c] = customer_row(c)
            records.append(("table", c.encode(), json.dumps(customers[c]).encode(), ts))
        elif dice < 0.11:  # a customer goes
            c = f"c-{rng.randrange(keys):06d}"
            customers.pop(c, None)
            records.append(("table", c.encode(), None, ts))
        elif dice < 0.16:  # an order goes
            o = f"o-{rng.randrange(order_ids):07d}"
            orders.pop(o, None)
            records.append(("input", o.encode(), None, ts))
        else:  # an order is written: a new customer, a new amount
            o = f"o-{rng.randrange(order_ids):07d}"
            orders[o] = {
                "order": o,
                "customer": f"c-{rng.randrange(keys):06d}",
                "amount": rng.randrange(1, 10_000),
            }
            records.append(("input", o.encode(), json.dumps(orders[o]).encode(), ts))
    truth = {
        o: joined(order, customers[order["customer"]])
        for o, order in orders.items()
        if order["customer"] in customers
    }
    return Workload(
        records,
        truth,
        f"foreign-key join: {keys:,} customers, {events:,} order and customer records on "
        f"{order_ids:,} orders ({len(truth):,} joined rows at the end), inner join",
    )


def joined(order: dict[str, Any], customer: dict[str, Any]) -> dict[str, Any]:
    """One row of the foreign-key join, as both systems write it."""
    return {
        "order": order["order"],
        "amount": order["amount"],
        "customer": order["customer"],
        "name": customer["name"],
        "country": customer["country"],
    }


# --------------------------------------------------------------------------- checks


def check_fk(truth: dict[Any, Any], outputs: Outputs) -> dict[str, int]:
    """The last output record per order (in offset order: one partition per key) against
    the join of the final tables."""
    final: dict[str, Any] = {}
    for key, raw in outputs:
        final[(key or b"").decode()] = None if raw is None else json.loads(raw)
    present = {k: v for k, v in final.items() if v is not None}
    return {
        "expected": len(truth),
        "missing": sum(1 for k in truth if k not in present),
        "wrong": sum(1 for k, v in truth.items() if k in present and present[k] != v),
        "unexpected": sum(1 for k in present if k not in truth),
    }


# --------------------------------------------------------------------------- running


async def output_converged(
    bootstrap: str, topic: str, partitions: int, truth: dict[Any, Any], quiet: float
) -> float:
    """When the output's last record per key first equalled ``truth`` (the broker's append
    time of the latest record read then: the output topic has LogAppendTime), or, if it
    never does, when it last grew before ``quiet`` seconds without growth. The output is
    followed to the right answer, so none is cut short by a pause between two of its steps
    (Kafka Streams' caches hold results until a commit)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        wrong = set(truth)  # keys whose last record is not the truth (all missing at first)
        grew_at = time.time()
        appended = 0.0  # the latest append time read
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                grew_at = now
                for record in records:
                    appended = max(appended, record.timestamp / 1000)
                    key = (record.key or b"").decode()
                    value = None if record.value is None else json.loads(record.value)
                    if value == truth.get(key):
                        wrong.discard(key)
                    else:
                        wrong.add(key)
            if not wrong:
                return appended
            if now - grew_at >= quiet:
                return appended or grew_at
    finally:
        await consumer.stop()


def command(
    system: str,
    workload: str,
    bootstrap: str,
    group: str,
    topics: dict[str, str],
    state_dir: Path,
    name: str,
    classpath: str | None,
    java_options: list[str],
    commit_ms: int,
) -> tuple[list[str], dict[str, str]]:
    if system == "streamjoin":
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.update(
            BENCH_WORKLOAD=workload,
            BENCH_APP_ID=group,
            BENCH_INPUT=topics["input"],
            BENCH_TABLE=topics["table"],
            BENCH_OUTPUT=topics["output"],
            STREAMJOIN_BROKER=f"kafka://{bootstrap}",
        )
        app = "benchmarks.table_joins_streamjoin_app:app"
        return streamjoin_command(app, state_dir, name), env
    assert classpath is not None
    params = {
        "workload": workload,
        "bootstrap": bootstrap,
        "app-id": group,
        "input": topics["input"],
        "table": topics["table"],
        "output": topics["output"],
        "state-dir": state_dir,
        "commit-ms": commit_ms,
    }
    return kstreams_command("TableJoins", classpath, java_options, params)


async def run(args: Any, bootstrap: str, workdir: Path) -> dict[str, Any]:
    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

    progress = sayer("table_joins")
    systems = chosen_systems(args, SYSTEMS)
    make = global_workload if args.workload == "global" else fk_workload
    work = make(args.events, args.keys, args.seed)
    ready = {"streamjoin": (streamjoin_version(), "")}
    classpath: str | None = None
    if "kstreams" in systems:
        classpath, why_no_java = kstreams_build(args.rebuild, "TableJoins")
        ready["kstreams"] = (kstreams_version() if classpath else "", why_no_java)
    prefix = f"tablejoins-{uuid.uuid4().hex[:8]}"
    names = {"input": f"{prefix}-input", "table": f"{prefix}-table"}
    outputs = {(s, r): f"{prefix}-out-{s}-{r}" for s in systems for r in range(args.repeat)}
    compacted = {"cleanup.policy": "compact"} if args.workload == "fk" else {}
    specs = [TopicSpec(names["table"], args.partitions, config={"cleanup.policy": "compact"})]
    specs += [TopicSpec(names["input"], args.partitions, config=compacted)]
    appended = {"message.timestamp.type": "LogAppendTime"} if args.workload == "fk" else {}
    specs += [TopicSpec(t, args.partitions, config=appended) for t in outputs.values()]
    await ensure_topics(bootstrap, specs)
    await wait_leaders(bootstrap, [sp.name for sp in specs], args.partitions)
    produce_s = await produce(bootstrap, ((names[t], k, v, ts) for t, k, v, ts in work.records))
    progress(f"produced {len(work.records):,} records in {produce_s:.1f}s")
    # done: every partition of the events (global) or of both tables (fk) processed; fk
    # then until the output is quiet (see above)
    read = [names["input"]] if args.workload == "global" else [names["input"], names["table"]]
    last = await last_offsets(bootstrap, read, args.partitions)
    check = check_enriched if args.workload == "global" else check_fk

    def launch(system: str, r: int, name: str) -> Launch:
        output = outputs[(system, r)]
        cmd = command(
            system,
            args.workload,
            bootstrap,
            f"{prefix}-{name}",
            {**names, "output": output},
            workdir / f"state-{name}",
            name,
            classpath,
            args.kstreams_java_options.split(),
            args.kstreams_commit_ms,
        )

        async def settle(_marks: list[Path]) -> float | None:
            if args.workload == "fk":
                return await output_converged(
                    bootstrap, output, args.partitions, work.truth, QUIET_S
                )
            await output_reached(bootstrap, output, args.partitions, len(work.truth))
            return None

        async def checked(_marks: list[Path]) -> dict[str, int]:
            out = await read_records(bootstrap, output, args.partitions, timeout=600)
            return check(work.truth, [(rec.key, rec.value) for rec in out])

        return Launch([cmd], checked, settle)

    results = await run_rounds(
        args, systems, ready, launch, len(work.records), last, workdir, progress
    )
    head = (
        f"{work.head}; {len(work.records):,} input records; {args.partitions} partitions; "
        f"{machine()}"
    )
    command_line = " ".join(["python", "-m", "benchmarks.table_joins", *sys.argv[1:]])
    return rounds_report(command_line, head, args.repeat, results)


COLUMNS = (*KSTREAMS_COLUMNS[:2], "startup s", *KSTREAMS_COLUMNS[2:])


def table(report: dict[str, Any]) -> str:
    return results_table(report, COLUMNS, lambda _: "kstreams")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=("global", "fk"), default="global")
    bench_arguments(
        parser,
        events=500_000,
        keys=10_000,
        systems=SYSTEMS,
        default="streamjoin,kstreams",
        timeout=1800,
        keys_help="table rows (users, customers)",
    )
    kstreams_arguments(parser)
    parser.add_argument(
        "--kstreams-commit-ms", type=int, default=1000, help="Kafka Streams' commit.interval.ms"
    )
    args = parser.parse_args(argv)
    return bench_main(args, "table_joins", functools.partial(run, args), table)


if __name__ == "__main__":
    raise SystemExit(main())
