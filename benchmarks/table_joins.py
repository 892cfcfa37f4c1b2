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
import asyncio
import functools
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from benchmarks.harness import (
    WorkloadResult,
    cprofile_args,
    last_offsets,
    load_average,
    log_tail,
    median_results,
    produce,
    py_spy_prefix,
    read_records,
    run_to_completion,
    say,
    sayer,
    streamjoin_version,
    wait_leaders,
)
from benchmarks.window_kinds import kstreams_build, kstreams_version

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TIERS = ("free", "basic", "pro", "enterprise")
COUNTRIES = ("DE", "FR", "US", "JP", "BR", "IN", "NG", "AU")
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
        value = {"event_id": i, "user": user, "amount": rng.randrange(1, 10_000)}
        records.append(("input", f"e-{i}".encode(), json.dumps(value).encode(), BASE_MS + i))
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


#: (key, value) of every output record, in offset order per partition
Outputs = list[tuple[bytes | None, bytes | None]]


def check_global(truth: dict[Any, Any], outputs: Outputs) -> dict[str, int]:
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
    workdir: Path,
    name: str,
    classpath: list[str] | None,
    java_options: list[str],
    commit_ms: int,
) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if system == "streamjoin":
        env.update(
            BENCH_WORKLOAD=workload,
            BENCH_APP_ID=group,
            BENCH_INPUT=topics["input"],
            BENCH_TABLE=topics["table"],
            BENCH_OUTPUT=topics["output"],
            STREAMJOIN_BROKER=f"kafka://{bootstrap}",
        )
        # (profiles on request, as for the other workloads: benchmarks/harness.py)
        cmd = [*py_spy_prefix(name), sys.executable, *cprofile_args(name)]
        cmd += ["-m", "streamjoin.cli", "worker"]
        cmd += ["-A", "benchmarks.table_joins_streamjoin_app:app"]
        cmd += ["--state-dir", str(workdir / f"state-{name}"), "--loglevel", "warning"]
        return cmd, env
    assert classpath is not None
    env.pop("PYTHONPATH", None)
    params = {
        "workload": workload,
        "bootstrap": bootstrap,
        "app-id": group,
        "input": topics["input"],
        "table": topics["table"],
        "output": topics["output"],
        "state-dir": str(workdir / f"state-{name}"),
        "commit-ms": str(commit_ms),
    }
    flat = [x for k, v in params.items() for x in (f"--{k}", v)]
    main = ["-cp", classpath[0], "streamjoin.bench.TableJoins"]
    return ["java", *java_options, *main, *flat], env


async def run(args: Any, bootstrap: str, workdir: Path) -> dict[str, Any]:
    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

    progress = sayer("table_joins")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    make = global_workload if args.workload == "global" else fk_workload
    work = make(args.events, args.keys, args.seed)
    classpath, why_no_java = (None, "")
    if "kstreams" in systems:
        classpath, why_no_java = kstreams_build(args.rebuild, "TableJoins")
    prefix = f"tablejoins-{uuid.uuid4().hex[:8]}"
    names = {"input": f"{prefix}-input", "table": f"{prefix}-table"}
    rounds = range(args.repeat)
    outputs = {(s, r): f"{prefix}-out-{s}-{r}" for s in systems for r in rounds}
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
    check: Callable[[dict[Any, Any], Outputs], dict[str, int]] = (
        check_global if args.workload == "global" else check_fk
    )
    results: list[WorkloadResult] = []
    for r, s in ((r, s) for r in rounds for s in systems):
        result = WorkloadResult(system=s, status="skipped", round=r, events=len(work.records))
        results.append(result)
        if s == "kstreams" and classpath is None:
            result.detail = why_no_java
            continue
        result.version = kstreams_version() if s == "kstreams" else streamjoin_version()
        name = f"{s}-{r}"
        topics = {**names, "output": outputs[(s, r)]}
        cmd = command(
            s,
            args.workload,
            bootstrap,
            f"{prefix}-{name}",
            topics,
            workdir,
            name,
            classpath,
            args.kstreams_java_options.split(),
            args.kstreams_commit_ms,
        )
        marks, logs = [workdir / f"{name}-0.marks"], [workdir / f"{name}-0.log"]
        settle: Callable[[], Awaitable[float | None]]
        if args.workload == "fk":
            settle = functools.partial(
                output_converged, bootstrap, outputs[(s, r)], args.partitions, work.truth, QUIET_S
            )
        else:
            settle = functools.partial(
                output_count, bootstrap, outputs[(s, r)], args.partitions, len(work.truth)
            )
        progress(f"{s}: starting")
        try:
            measured = await run_to_completion(
                [cmd], marks, logs, last, args.timeout, progress, settle
            )
        except Exception as exc:  # report and go on with the next system
            result.status, result.detail = (
                "failed",
                f"{type(exc).__name__}: {exc}\n{log_tail(logs[0])}",
            )
            progress(f"{s}: failed: {result.detail}")
            continue
        result.status, result.detail = measured.status, measured.detail
        if measured.status != "ok" or measured.seconds is None:
            progress(f"{s}: {result.status}: {result.detail}")
            continue
        result.startup_seconds = measured.startup_seconds
        result.seconds = measured.seconds
        result.cpu_seconds = measured.cpu_seconds
        result.peak_rss_mb = measured.peak_rss_mb
        result.events_per_s = len(work.records) / measured.seconds
        result.cpu_us_per_event = 1e6 * (measured.cpu_seconds or 0) / len(work.records)
        out = await read_records(bootstrap, outputs[(s, r)], args.partitions, timeout=600)
        result.check = check(work.truth, [(rec.key, rec.value) for rec in out])
        result.correct = all(v == 0 for k, v in result.check.items() if k != "expected")
        result.status = "ok" if result.correct else "wrong"
        progress(f"{s}: {result.status} {result.check}")
    head = (
        f"{work.head}; {len(work.records):,} input records; {args.partitions} partitions; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs; load average "
        f"{load_average()}"
    )
    return {
        "command": " ".join(["python", "-m", "benchmarks.table_joins", *sys.argv[1:]]),
        "head": head,
        "repeat": args.repeat,
        "results": [asdict(x) for x in median_results(results)],
        "runs": [asdict(x) for x in results],
    }


async def output_count(bootstrap: str, topic: str, partitions: int, expected: int) -> None:
    """Until the output holds ``expected`` records or has not grown for 3 s."""
    previous, grew_at = -1, time.monotonic()
    while True:
        count = sum(o + 1 for o in (await last_offsets(bootstrap, [topic], partitions)).values())
        if count >= expected:
            return
        if count != previous:
            previous, grew_at = count, time.monotonic()
        elif time.monotonic() - grew_at > 3.0:
            return
        await asyncio.sleep(0.1)


def table(report: dict[str, Any]) -> str:
    results = [WorkloadResult(**r) for r in report["results"]]
    ks = next((r for r in results if r.system == "kstreams" and r.correct), None)
    rows = [
        (
            "system",
            "version",
            "startup s",
            "seconds",
            "events/s",
            "cpu s",
            "cpu µs/event",
            "cpu x KS",
            "peak RSS MB",
            "RSS x KS",
            "correct?",
        )
    ]
    for r in results:
        if r.seconds is None or r.cpu_seconds is None:
            rows.append((r.system, r.version, *[""] * 8, r.status))
            continue
        cpu_x = rss_x = ""
        if ks is not None and ks is not r and ks.cpu_seconds:
            cpu_x = f"{r.cpu_seconds / ks.cpu_seconds:.2f}"
            if r.peak_rss_mb and ks.peak_rss_mb:
                rss_x = f"{r.peak_rss_mb / ks.peak_rss_mb:.2f}"
        bad = [f"{v} {k}" for k, v in r.check.items() if v and k != "expected"]
        rows.append(
            (
                r.system,
                r.version,
                f"{r.startup_seconds or 0:.2f}",
                f"{r.seconds:.2f}",
                f"{r.events_per_s or 0:,.0f}",
                f"{r.cpu_seconds:.2f}",
                f"{r.cpu_us_per_event or 0:.1f}",
                cpu_x,
                "" if r.peak_rss_mb is None else f"{r.peak_rss_mb:.0f}",
                rss_x,
                "yes" if r.correct else "NO: " + ", ".join(bad),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = []
    runs = [WorkloadResult(**r) for r in report["runs"]]
    if report["repeat"] > 1:
        for system in dict.fromkeys(r.system for r in runs):
            listed = ", ".join(
                f"{r.cpu_us_per_event:.1f}" if r.cpu_us_per_event is not None else r.status
                for r in runs
                if r.system == system
            )
            notes.append(f"{system} rounds (cpu µs/event): {listed}")
    for r in runs:
        if r.status in ("skipped", "failed", "timeout") and r.detail:
            notes.append(f"{r.system} round {r.round}: {r.status}: {r.detail.splitlines()[0]}")
    return "\n".join([report["head"], "", *lines, "", *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=("global", "fk"), default="global")
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=10_000, help="table rows (users, customers)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    parser.add_argument("--systems", default="streamjoin,kstreams", help="comma-separated")
    parser.add_argument("--bootstrap", help="reuse a running loopback broker (HOST:PORT)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per system")
    parser.add_argument("--rebuild", action="store_true", help="build the Kafka Streams app again")
    parser.add_argument("--kstreams-java-options", default="", help="JVM options (default: none)")
    parser.add_argument(
        "--kstreams-commit-ms", type=int, default=1000, help="Kafka Streams' commit.interval.ms"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, state)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)

    from benchmarks.broker import broker

    workdir = Path(tempfile.mkdtemp(prefix="streamjoin-table-joins-"))
    try:
        with broker(args.bootstrap, sayer("table_joins")) as bootstrap:
            report = asyncio.run(run(args, bootstrap, workdir))
    finally:
        if args.keep:
            say(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else table(report))
    ours = [r for r in report["runs"] if r["system"] == "streamjoin"]
    return 0 if all(r["correct"] for r in ours) else 1


if __name__ == "__main__":
    raise SystemExit(main())
