"""Many partitions per worker: one worker, N partitions, two counting tables (2 x N stores).

Run from the repository root::

    .venv/bin/python -m benchmarks.many_partitions [--partitions 64,256,1024]
        [--tree PATH] [--per-partition 200] [--bootstrap 127.0.0.1:PORT] [--json]

For each N (fresh topics each time, deleted afterwards):

1. produces ``--per-partition`` events to every partition of an N-partition topic (10 keys
   per partition, each key placed by Kafka's murmur2 so it lands in its own partition);
2. **first start** on an empty state directory: one worker of
   ``benchmarks/many_partitions_app.py`` (``counts[key] += 1``, ``totals[key] += value``)
   processes everything and gets SIGTERM;
3. **restart, kept state**: the same state directory; once every task runs, one more event
   per partition is produced and processed; SIGTERM;
4. **restart, empty state**: a new state directory, so every store is restored from its
   changelog; then one more event per partition as in 3; SIGTERM.

Measured per start: **running s** from the process's spawn to every task running (its
``/status.json``: N source partitions and 2 x N table partitions active; polled every
0.25 s, so up to 0.25 s late), **done s** from spawn to the last partition's last event
processed (the app's marks), **stop s** from SIGTERM to the exit, **peak RSS** (the exited
process's ``ru_maxrss``, exact), **peak open files** (``/proc/<pid>/fd`` sampled every
0.25 s, so a maximum between two samples can be missed), the changelog records restored.
Each start's answers are checked: every key's count and total in both tables, read from
the worker's state by the app once it has processed each partition's last event.

``--tree PATH`` runs the worker from another source tree (its ``streamjoin`` package; the
app and the harness stay this checkout's), e.g. a checkout of the code before a change.
The worker's open-files soft limit is raised to the hard limit (``ulimit -Hn``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.broker import broker
from benchmarks.harness import wait_leaders
from benchmarks.progress_marks import format_last_offsets
from benchmarks.worker_processes import (
    ROOT,
    WatchedWorker,
    kill_all,
    log_tail,
    spawn_worker,
    stop_worker,
    tasks_running,
)

APP_SPEC = "benchmarks.many_partitions_app:app"
TABLES = ("counts", "totals")
KEYS_PER_PARTITION = 10

#: (partition, key, value)
Event = tuple[int, str, int]


def log(message: str) -> None:
    print(f"[many-partitions {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- pure


def keys_by_partition(
    partitions: int, per_partition: int, place: Callable[[bytes, int], int]
) -> dict[int, list[str]]:
    """``per_partition`` keys for every partition, each one where ``place`` puts it."""
    out: dict[int, list[str]] = {p: [] for p in range(partitions)}
    missing = partitions
    i = 0
    while missing:
        key = f"k{i}"
        i += 1
        keys = out[place(key.encode(), partitions)]
        if len(keys) < per_partition:
            keys.append(key)
            if len(keys) == per_partition:
                missing -= 1
    return out


def make_events(keys: Mapping[int, Sequence[str]], per_partition: int) -> list[Event]:
    """``per_partition`` events per partition, round-robin over its keys, values 1..7."""
    return [
        (p, ks[i % len(ks)], i % 7 + 1)
        for p, ks in sorted(keys.items())
        for i in range(per_partition)
    ]


def probe_events(keys: Mapping[int, Sequence[str]]) -> list[Event]:
    """One more event per partition (its first key, value 1): processed after a restart, it
    shows whether the restored state was right."""
    return [(p, ks[0], 1) for p, ks in sorted(keys.items())]


def expected_rows(events: Iterable[Event]) -> dict[int, dict[tuple[str, str], int]]:
    """partition -> (table, key) -> the value both tables must hold after ``events``."""
    out: dict[int, dict[tuple[str, str], int]] = {}
    for partition, key, value in events:
        rows = out.setdefault(partition, {})
        rows[("counts", key)] = rows.get(("counts", key), 0) + 1
        rows[("totals", key)] = rows.get(("totals", key), 0) + value
    return out


@dataclass
class Check:
    partitions: int = 0
    rows: int = 0
    missing: int = 0
    wrong: int = 0
    extra: int = 0
    undumped_partitions: int = 0

    @property
    def correct(self) -> bool:
        return not (self.missing or self.wrong or self.extra or self.undumped_partitions)


def check_dumps(
    expected: Mapping[int, Mapping[tuple[str, str], int]],
    dumps: Mapping[int, Sequence[Sequence[Any]] | None],
) -> Check:
    """Compare each partition's dumped ``[table, key, value]`` rows with ``expected``."""
    check = Check(partitions=len(expected))
    for partition, want in expected.items():
        rows = dumps.get(partition)
        if rows is None:
            check.undumped_partitions += 1
            continue
        got = {(str(t), str(k)): v for t, k, v in rows}
        check.rows += len(got)
        for row, value in want.items():
            if row not in got:
                check.missing += 1
            elif got[row] != value:
                check.wrong += 1
        check.extra += len(got.keys() - want.keys())
    return check


# --------------------------------------------------------------------------- broker I/O


async def produce(bootstrap: str, topic: str, events: Sequence[Event]) -> float:
    """Sends ``events`` to their partitions; seconds taken."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=256 * 1024
    )
    await producer.start()
    started = time.monotonic()
    try:
        pending = []
        for partition, key, value in events:
            pending.append(
                await producer.send(
                    topic, str(value).encode(), key=key.encode(), partition=partition
                )
            )
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.monotonic() - started


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

    await ensure_topics(bootstrap, [TopicSpec(topic, partitions)])


async def delete_topics(bootstrap: str, prefixes: Sequence[str]) -> None:
    """Delete every topic whose name starts with one of ``prefixes`` (best effort)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(tuple(prefixes))]
        if names:
            await admin.delete_topics(names)
    except Exception as exc:  # a benchmark's clean-up: report, go on
        log(f"could not delete topics {prefixes}: {exc!r}")
    finally:
        await admin.close()


async def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await consumer.stop()
    return {tp.partition: end for tp, end in ends.items()}


# --------------------------------------------------------------------------- one start


@dataclass
class StartResult:
    partitions: int
    phase: str
    status: str = "ok"
    detail: str = ""
    running_s: float | None = None
    done_s: float | None = None
    stop_s: float | None = None
    exit_code: int | None = None
    peak_rss_mb: float | None = None
    sampled_peak_rss_mb: float | None = None
    peak_open_files: int = 0
    restored_records: int | None = None
    check: dict[str, int] = field(default_factory=dict)
    correct: bool = False


@dataclass
class Setup:
    bootstrap: str
    tree: Path
    app_id: str
    topic: str
    partitions: int
    workdir: Path
    timeout: float


def read_dumps(marks: Path, partitions: int) -> dict[int, list[list[Any]] | None]:
    out: dict[int, list[list[Any]] | None] = {}
    for p in range(partitions):
        path = Path(f"{marks}.dump.p{p}")
        out[p] = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else None
        )
    return out


def done_partitions(marks: Path) -> int:
    if not marks.exists():
        return 0
    return sum(1 for line in marks.read_text().splitlines() if line.startswith("PDONE"))


async def run_start(
    setup: Setup,
    phase: str,
    state_dir: Path,
    last: Mapping[int, int],
    expected: Mapping[int, Mapping[tuple[str, str], int]],
    probe: Sequence[Event] = (),
) -> StartResult:
    """One worker start: until every task runs, then (``probe``) produce one more event per
    partition, until every partition's event at ``last`` is processed; then SIGTERM."""
    result = StartResult(setup.partitions, phase)
    marks = setup.workdir / f"marks-{phase}.txt"
    env = {
        "BENCH_APP_ID": setup.app_id,
        "BENCH_INPUT": setup.topic,
        "BENCH_MARKS": str(marks),
        "BENCH_LAST_OFFSETS": format_last_offsets({(setup.topic, p): o for p, o in last.items()}),
        "STREAMJOIN_BROKER": f"kafka://{setup.bootstrap}",
    }
    worker = spawn_worker(
        phase, setup.tree, APP_SPEC, env, state_dir, setup.workdir / f"worker-{phase}.log"
    )
    deadline = worker.spawned + setup.timeout
    n = setup.partitions
    try:
        next_poll = 0.0
        while result.running_s is None:
            worker.sample()
            if not worker.alive():
                return _failed(result, worker, "exited before every task ran")
            now = time.monotonic()
            if now > deadline:
                return _failed(result, worker, "timed out before every task ran")
            if now >= next_poll:
                next_poll = now + 0.25
                status = await asyncio.to_thread(worker.status)
                if status is not None and tasks_running(status, n, len(TABLES)):
                    result.running_s = time.monotonic() - worker.spawned
                    result.restored_records = status.get("restored_records")
            await asyncio.sleep(0.05)
        log(f"{n} partitions, {phase}: every task runs after {result.running_s:.1f}s")
        if probe:
            await produce(setup.bootstrap, setup.topic, probe)
        while done_partitions(marks) < n:
            worker.sample()
            if not worker.alive():
                return _failed(result, worker, "exited before processing everything")
            if time.monotonic() > deadline:
                return _failed(
                    result, worker, f"timed out: {done_partitions(marks)}/{n} partitions done"
                )
            await asyncio.sleep(0.25)
        result.done_s = time.monotonic() - worker.spawned
        check = check_dumps(expected, read_dumps(marks, n))
        result.check = asdict(check)
        result.correct = check.correct
        await stop_worker(worker)
    finally:
        if worker.alive():
            await stop_worker(worker)
        kill_all([worker])
    result.stop_s = worker.stop_seconds
    result.exit_code = worker.exit_code
    result.peak_rss_mb = worker.final_peak_rss_mb
    result.sampled_peak_rss_mb = worker.peak_rss_mb
    result.peak_open_files = worker.peak_open_files
    if result.exit_code != 0:
        # (the run goes on: a stop that could not finish is a finding, not the end)
        result.status = "stop failed"
        result.detail = f"exit code {result.exit_code} after SIGTERM\n{log_tail(worker.log, 4)}"
    elif not result.correct:
        result.status = "wrong"
    log(
        f"{n} partitions, {phase}: done after {result.done_s:.1f}s, stop {result.stop_s:.1f}s, "
        f"peak RSS {result.peak_rss_mb or 0:.0f} MB, peak open files {result.peak_open_files}, "
        f"answers {'right' if result.correct else 'WRONG ' + str(result.check)}"
    )
    return result


def _failed(result: StartResult, worker: WatchedWorker, why: str) -> StartResult:
    result.status = "failed"
    result.detail = f"{why}\n{log_tail(worker.log)}"
    result.peak_open_files = worker.peak_open_files
    result.sampled_peak_rss_mb = worker.peak_rss_mb
    log(f"{result.partitions} partitions, {result.phase}: FAILED: {result.detail}")
    return result


async def run_size(
    bootstrap: str, tree: Path, partitions: int, per_partition: int, workdir: Path, timeout: float
) -> list[StartResult]:
    from streamjoin.partitioner import partition_for_key

    uid = uuid.uuid4().hex[:6]
    setup = Setup(
        bootstrap=bootstrap,
        tree=tree,
        app_id=f"mp{partitions}-{uid}",
        topic=f"mp{partitions}-{uid}-events",
        partitions=partitions,
        workdir=workdir / f"p{partitions}",
        timeout=timeout,
    )
    setup.workdir.mkdir(parents=True, exist_ok=True)
    keys = keys_by_partition(partitions, KEYS_PER_PARTITION, partition_for_key)
    events = make_events(keys, per_partition)
    probe = probe_events(keys)
    results = []
    try:
        await create_topic(bootstrap, setup.topic, partitions)
        await wait_leaders(bootstrap, [setup.topic], partitions)
        seconds = await produce(bootstrap, setup.topic, events)
        log(f"{partitions} partitions: produced {len(events):,} events in {seconds:.1f}s")
        last = {p: per_partition - 1 for p in range(partitions)}
        kept, empty = setup.workdir / "state-kept", setup.workdir / "state-empty"
        sent = list(events)
        first = await run_start(setup, "first start", kept, last, expected_rows(sent))
        results.append(first)
        if first.status == "failed":
            return results
        for phase, state_dir in (("restart, kept state", kept), ("restart, empty state", empty)):
            ends = await end_offsets(bootstrap, setup.topic, partitions)
            sent += probe
            results.append(
                await run_start(setup, phase, state_dir, ends, expected_rows(sent), probe)
            )
            if results[-1].status == "failed":
                break
    finally:
        await delete_topics(bootstrap, [setup.app_id])
        shutil.rmtree(setup.workdir / "state-kept", ignore_errors=True)
        shutil.rmtree(setup.workdir / "state-empty", ignore_errors=True)
    return results


# --------------------------------------------------------------------------- report


def table(results: Sequence[StartResult]) -> str:
    head = (
        "| partitions | stores | start | running s | done s | stop s | peak RSS MB "
        "| peak open files | restored | answers |"
    )
    lines = [head, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]

    def num(x: float | None, fmt: str = "{:.1f}") -> str:
        return "-" if x is None else fmt.format(x)

    for r in results:
        answers = "right" if r.correct else "wrong"
        if r.status not in ("ok", "wrong"):
            answers += f" ({r.status}, exit {r.exit_code})"
        lines.append(
            f"| {r.partitions:,} | {r.partitions * len(TABLES):,} | {r.phase} | {num(r.running_s)} "
            f"| {num(r.done_s)} | {num(r.stop_s)} | {num(r.peak_rss_mb, '{:,.0f}')} "
            f"| {r.peak_open_files:,} | {num(r.restored_records, '{:,}')} | {answers} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="64,256,1024", help="comma-separated sizes")
    parser.add_argument("--per-partition", type=int, default=200, help="events per partition")
    parser.add_argument("--tree", default=str(ROOT), help="source tree the worker runs")
    parser.add_argument("--bootstrap", default=None, help="a loopback broker (default: own)")
    parser.add_argument("--broker-heap", default="512m", help="heap of the broker started")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per start, at most")
    parser.add_argument("--workdir", default=None, help="keep logs and marks here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.partitions.split(",") if x.strip()]
    if any(n < 1 for n in sizes) or args.per_partition < KEYS_PER_PARTITION:
        parser.error(f"sizes must be >= 1 and --per-partition >= {KEYS_PER_PARTITION}")
    tree = Path(args.tree).resolve()
    if not (tree / "streamjoin" / "__init__.py").exists():
        parser.error(f"--tree {tree}: no streamjoin package there")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="many-partitions-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"worker tree {tree}; logs in {workdir}")
    results: list[StartResult] = []

    async def run_all() -> None:
        with broker(args.bootstrap, log, heap=args.broker_heap) as bootstrap:
            for n in sizes:
                results.extend(
                    await run_size(bootstrap, tree, n, args.per_partition, workdir, args.timeout)
                )

    asyncio.run(run_all())
    report = {
        "tree": str(tree),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "per_partition": args.per_partition,
        "results": [asdict(r) for r in results],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(table(results))
        for r in results:
            if r.detail:
                print(f"\n{r.partitions} partitions, {r.phase}: {r.detail}")
    return 0 if results and all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
