"""Join throughput: one streamjoin worker vs Kafka Streams, faust-streaming and Quix Streams,
same broker and data.

    .venv/bin/python -m benchmarks.join_throughput                      # starts a local broker
    .venv/bin/python -m benchmarks.join_throughput --bootstrap 127.0.0.1:PORT --json
    .venv/bin/python -m benchmarks.join_throughput --auctions 1000000 --systems streamjoin,kstreams

What it does, in one run:

1. Generates ``--auctions`` auctions of ad traffic (``examples/ad_traffic.py``:
   impressions and clicks keyed by auction id, out of order by up to 20 s, late
   clicks, clicks without impressions) and produces them once, with their
   event timestamps, into two fresh 10-partition topics.
2. Runs each system in turn as ONE worker process, with its own consumer group
   (so every system reads the same records from offset 0) and its own output
   topic. Output topics use ``message.timestamp.type=LogAppendTime``, so each
   output record carries the broker's time of arrival.

   * ``streamjoin``: ``streamjoin worker -A benchmarks.join_streamjoin_app:app``, the
     demo's windowed inner join (10 min window, 30 s grace) on RocksDB state with a
     changelog.
   * ``kstreams``: Kafka Streams 4.3 (``AdJoin.java`` in ``benchmarks/kstreams/``, built
     here with Maven): the same join as ``KStream.join`` with
     ``JoinWindows.ofTimeDifferenceAndGrace(10 min, 30 s)``, JSON values as Jackson trees,
     one stream thread, at-least-once, default RocksDB and caching, a commit every 0.5 s
     (``--kstreams-commit-ms``) as streamjoin's; its join stores' changelogs keep
     everything (``retention.ms=-1``: the traffic's event times are older than the
     default retention). It marks its progress against the inputs' last offsets
     (``benchmarks/progress_marks.py``).
   * ``faust``: faust-streaming's nearest equivalent (``benchmarks/join_faust_app.py``):
     an impressions Table looked up by the click agent (plus a pending-clicks Table
     for clicks that arrive before their impression, so its answer is complete),
     ``store=rocksdb://``. No windows, no expiry: it does less work than a join.
   * ``faust-lookup``: the same without the pending-clicks Table (the least work
     Faust can do; clicks that arrive early are lost, so its output is incomplete).
   * ``quix``: Quix Streams' ``join_interval`` (``benchmarks/join_quix_app.py``).

   The competitors run with the Python of their own virtual environments under
   ``~/.cache/streamjoin/bench/join-venvs/`` (created here with ``python3 -m venv``
   and ``pip install`` when missing; ``--no-install`` skips that).
3. Measures, per system: ``seconds`` from the first input event reaching the app
   (a mark the app writes) to the later of the last input event processed (a mark)
   and the last output record's broker append time. Worker start-up (process
   start to first event: imports, group join, topic checks, state open) is
   reported apart as ``startup s``. joins/s = expected joins / seconds; input
   events/s = input records / seconds.
4. Checks the answer: the distinct (auction id, impression id, click id) triples
   in the output topic must equal the generator's ``expected_joins`` exactly. A
   fast wrong answer is reported as such and gets no ratio.

Everything is bounded by ``--timeout`` per system, and every process started is
stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.broker import broker
from benchmarks.harness import (
    BASELINE_TREE,
    DIST_OF,
    ROOT,
    VENV_ROOT,
    baseline_worker,
    cprofile_args,
    dist_version,
    kstreams_arguments,
    kstreams_build,
    kstreams_command,
    kstreams_version,
    last_offsets,
    log_tail,
    peak_rss_mb,
    py_spy_prefix,
    read_records,
    sayer,
    stop_process,
    streamjoin_version,
    tree_commit,
    venv_python,
    wait_leaders,
)
from benchmarks.progress_marks import format_last_offsets
from examples.ad_traffic import Traffic, generate
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

PARTITIONS = 10
SYSTEMS = (
    "streamjoin",
    "streamjoin-eos",
    "streamjoin-base",
    "kstreams",
    "faust",
    "faust-lookup",
    "quix",
)
VENV_OF = {"faust": "faust", "faust-lookup": "faust", "quix": "quix"}
say = sayer("join-bench")


@dataclass
class Result:
    system: str
    status: str  # "ok", "wrong", "skipped", "failed", "timeout"
    round: int = 0
    detail: str = ""
    version: str = ""
    store: str = ""
    records: int = 0
    expected_joins: int = 0
    startup_seconds: float | None = None
    seconds: float | None = None
    input_events_per_s: float | None = None
    joins_per_s: float | None = None
    #: CPU time of the app's process (all threads) from the first to the last input event:
    #: steadier than wall time on a busy machine
    cpu_seconds: float | None = None
    #: the app process's peak resident set size (VmHWM), MB
    peak_rss_mb: float | None = None
    outputs: int = 0
    distinct_joins: int = 0
    missing: int = 0
    unexpected: int = 0
    duplicates: int = 0
    committed: bool = False
    correct: bool = False
    marks: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- environment


# --------------------------------------------------------------------------- broker I/O


async def produce(bootstrap: str, traffic: Traffic, topics: dict[str, str]) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    started = time.monotonic()
    try:
        for rec in traffic.records:
            await producer.send(
                topics[rec.topic],
                json.dumps(rec.value, sort_keys=True, separators=(",", ":")).encode(),
                key=rec.key.encode(),
                timestamp_ms=rec.timestamp_ms,
            )
        await producer.flush()
    finally:
        await producer.stop()
    return time.monotonic() - started


async def output_count(consumer: AIOKafkaConsumer, topic: str) -> int:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    ends = await consumer.end_offsets(tps)
    return sum(ends.values())


async def committed_all(bootstrap: str, group: str, inputs: list[str], timeout: float) -> bool:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in inputs for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while True:
            committed = {tp: (await consumer.committed(tp)) or 0 for tp in tps}
            if all(committed[tp] >= ends[tp] for tp in tps):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.5)
    finally:
        await consumer.stop()


async def read_output(bootstrap: str, topic: str) -> list[tuple[int, dict[str, Any]]]:
    """Every output record as (broker append time ms, value), read_committed."""
    records = await read_records(bootstrap, topic, PARTITIONS)
    return [(r.timestamp, json.loads(r.value)) for r in records]


# --------------------------------------------------------------------------- one system


@dataclass
class Run:
    system: str
    bootstrap: str
    inputs: dict[str, str]  # "impressions"/"clicks" -> topic
    output: str
    group: str
    workdir: Path
    records: int
    python: Path | None = None
    faust_store: str = "rocksdb://"
    round: int = 0
    #: kstreams: the apps' classpath, JVM options, commit interval and the inputs' last
    #: offsets (``format_last_offsets``)
    classpath: str | None = None
    java_options: tuple[str, ...] = ()
    commit_ms: int = 500
    last_offsets: str = ""

    @property
    def name(self) -> str:
        return f"{self.system}-{self.round}"

    @property
    def marks_path(self) -> Path:
        return self.workdir / f"{self.name}.marks"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def command(self) -> tuple[list[str], dict[str, str]]:
        if self.system == "kstreams":
            return self.kstreams_command()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.system in ("streamjoin", "streamjoin-eos", "streamjoin-base"):
            guarantee = "exactly_once" if self.system == "streamjoin-eos" else "at_least_once"
            env.update(
                JOINBENCH_GUARANTEE=guarantee,
                STREAMJOIN_BROKER=f"kafka://{self.bootstrap}",
                JOINBENCH_APP_ID=self.group,
                JOINBENCH_IMPRESSIONS=self.inputs["impressions"],
                JOINBENCH_CLICKS=self.inputs["clicks"],
                JOINBENCH_OUTPUT=self.output,
                JOINBENCH_INPUTS=str(self.records),
                JOINBENCH_MARKS=str(self.marks_path),
            )
            python_cmd = (
                baseline_worker(env) if self.system == "streamjoin-base" else [sys.executable]
            )
            cmd = [
                *py_spy_prefix(self.name),
                *python_cmd,
                *cprofile_args(self.name),
                "-m",
                "streamjoin.cli",
                "worker",
                "-A",
                "benchmarks.join_streamjoin_app:app",
                "--state-dir",
                str(self.workdir / f"state-{self.name}"),
                "--loglevel",
                "warning",
            ]
            return cmd, env
        assert self.python is not None
        # the competitors' venvs must not see this repo's packages
        env.pop("PYTHONPATH", None)
        common = [
            "--bootstrap",
            self.bootstrap,
            "--app-id",
            self.group,
            "--impressions",
            self.inputs["impressions"],
            "--clicks",
            self.inputs["clicks"],
            "--output",
            self.output,
            "--inputs",
            str(self.records),
            "--marks",
            str(self.marks_path),
        ]
        if self.system in ("faust", "faust-lookup"):
            mode = "join" if self.system == "faust" else "lookup"
            script = str(ROOT / "benchmarks" / "join_faust_app.py")
            datadir = str(self.workdir / f"data-{self.name}")
            extra = ["--datadir", datadir, "--store", self.faust_store, "--mode", mode]
            return [str(self.python), script, *common, *extra], env
        script = str(ROOT / "benchmarks" / "join_quix_app.py")
        extra = ["--state-dir", str(self.workdir / f"state-{self.name}")]
        return [str(self.python), script, *common, *extra], env

    def kstreams_command(self) -> tuple[list[str], dict[str, str]]:
        assert self.classpath is not None
        params = {
            "bootstrap": self.bootstrap,
            "app-id": self.group,
            "impressions": self.inputs["impressions"],
            "clicks": self.inputs["clicks"],
            "output": self.output,
            "state-dir": self.workdir / f"state-{self.name}",
            "commit-ms": self.commit_ms,
        }
        cmd, env = kstreams_command("AdJoin", self.classpath, self.java_options, params)
        env.update(BENCH_MARKS=str(self.marks_path), BENCH_LAST_OFFSETS=self.last_offsets)
        return cmd, env

    def read_marks(self) -> dict[str, float]:
        """``first``/``done`` -> unix time, and ``first-cpu``/``done-cpu`` -> the app
        process's CPU time (all its threads) at that mark."""
        marks: dict[str, float] = {}
        if self.marks_path.exists():
            for line in self.marks_path.read_text().splitlines():
                fields = line.split()
                if len(fields) >= 2:
                    marks.setdefault(fields[0].lower(), float(fields[1]))
                if len(fields) >= 3:
                    marks.setdefault(f"{fields[0].lower()}-cpu", float(fields[2]))
        return marks


async def run_system(run: Run, traffic: Traffic, timeout: float, result: Result) -> Result:
    cmd, env = run.command()
    result.records = run.records
    result.expected_joins = len(traffic.expected_joins)
    say(f"{run.system}: starting one worker ({' '.join(cmd[:4])} ...)")
    spawned = time.time()
    with run.log_path.open("wb") as log:
        proc = subprocess.Popen(  # noqa: ASYNC220 - spawning returns at once
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    probe = AIOKafkaConsumer(bootstrap_servers=run.bootstrap)
    await probe.start()
    try:
        deadline = time.monotonic() + timeout
        # 1. until the app has seen every input record
        while "done" not in run.read_marks():
            result.peak_rss_mb = peak_rss_mb(proc.pid) or result.peak_rss_mb
            if proc.poll() is not None:
                result.status = "failed"
                result.detail = f"worker exited with {proc.returncode}:\n{log_tail(run.log_path)}"
                return result
            if time.monotonic() > deadline:
                result.status = "timeout"
                result.detail = f"not done after {timeout:.0f}s:\n{log_tail(run.log_path)}"
                return result
            await asyncio.sleep(0.1)
        # 2. until the output holds every expected join, or stops growing for 3 s
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            count = await output_count(probe, run.output)
            if count >= len(traffic.expected_joins):
                break
            if count != last:
                last, quiet_since = count, time.monotonic()
            elif time.monotonic() - quiet_since > 3.0:
                break
            await asyncio.sleep(0.1)
        # 3. inputs committed (bounded: commit intervals differ, 0.5 s to 5 s)
        result.committed = await committed_all(
            run.bootstrap, run.group, list(run.inputs.values()), timeout=30
        )
        result.peak_rss_mb = peak_rss_mb(proc.pid) or result.peak_rss_mb
    finally:
        await probe.stop()
        stop_process(proc)
    output = await read_output(run.bootstrap, run.output)
    marks = run.read_marks()
    result.marks = {k: round(v - spawned, 3) for k, v in marks.items() if not k.endswith("-cpu")}
    if "first-cpu" in marks and "done-cpu" in marks:
        result.cpu_seconds = marks["done-cpu"] - marks["first-cpu"]
    got = [(o["auction_id"], o["impression_id"], o["click_id"]) for _, o in output]
    distinct = set(got)
    result.outputs = len(got)
    result.distinct_joins = len(distinct)
    result.missing = len(traffic.expected_joins - distinct)
    result.unexpected = len(distinct - traffic.expected_joins)
    result.duplicates = len(got) - len(distinct)
    result.correct = result.missing == 0 and result.unexpected == 0
    last_output = max((ts for ts, _ in output), default=0) / 1000
    end = max(marks["done"], last_output)
    result.startup_seconds = marks["first"] - spawned
    result.seconds = end - marks["first"]
    result.input_events_per_s = run.records / result.seconds
    result.joins_per_s = len(traffic.expected_joins) / result.seconds
    result.status = "ok" if result.correct else "wrong"
    say(
        f"{run.system}: {result.seconds:.2f}s, {result.joins_per_s:,.0f} joins/s, "
        f"{result.distinct_joins}/{result.expected_joins} joins "
        f"({result.missing} missing, {result.unexpected} unexpected, "
        f"{result.duplicates} duplicates), committed={result.committed}"
    )
    return result


# --------------------------------------------------------------------------- the run


async def bench(args: argparse.Namespace, bootstrap: str, workdir: Path) -> dict[str, Any]:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    pythons: dict[str, tuple[Path | None, str]] = {}
    for s in systems:
        venv = VENV_OF.get(s)
        if venv and venv not in pythons:
            pythons[venv] = venv_python(venv, Path(args.venv_root), not args.no_install)

    traffic = generate(args.auctions, seed=args.seed)
    run_id = uuid.uuid4().hex[:8]
    inputs = {"impressions": f"jb-{run_id}-impressions", "clicks": f"jb-{run_id}-clicks"}
    rounds = range(args.repeat)
    outputs = {(s, r): f"jb-{run_id}-out-{s}-{r}" for s in systems for r in rounds}
    await ensure_topics(
        bootstrap,
        [TopicSpec(t, PARTITIONS) for t in inputs.values()]
        + [
            TopicSpec(t, PARTITIONS, config={"message.timestamp.type": "LogAppendTime"})
            for t in outputs.values()
        ],
    )
    await wait_leaders(bootstrap, [*inputs.values(), *outputs.values()], PARTITIONS)
    say(
        f"traffic: {len(traffic.records)} records ({traffic.impressions} impressions, "
        f"{traffic.clicks} clicks), {len(traffic.expected_joins)} joins expected"
    )
    produce_s = await produce(bootstrap, traffic, inputs)
    say(f"produced in {produce_s:.1f}s into {inputs['impressions']}, {inputs['clicks']}")
    last = await last_offsets(bootstrap, list(inputs.values()), PARTITIONS)
    classpath, why_no_java = None, ""
    if "kstreams" in systems:
        classpath, why_no_java = kstreams_build(args.rebuild, "AdJoin")

    results: list[Result] = []
    for s, r in ((s, r) for r in rounds for s in systems):  # rounds interleave the systems
        result = Result(system=s, status="skipped", records=len(traffic.records), round=r)
        venv = VENV_OF.get(s)
        python = None
        if venv:
            python, why = pythons[venv]
            if python is None:
                result.detail = why
                results.append(result)
                say(f"{s}: skipped: {why}")
                continue
            result.version = dist_version(python, DIST_OF[venv])
        elif s == "kstreams":
            if classpath is None:
                result.detail = why_no_java
                results.append(result)
                say(f"{s}: skipped: {why_no_java}")
                continue
            result.version = kstreams_version()
        elif s == "streamjoin-base":
            result.version = tree_commit(os.environ.get(BASELINE_TREE, ""))
        else:
            result.version = streamjoin_version()
        result.store = {
            "streamjoin": "rocksdb (rocksdict) + changelog",
            "streamjoin-base": "rocksdb (rocksdict) + changelog (older commit)",
            "streamjoin-eos": "rocksdb (rocksdict) + changelog, transactions",
            "kstreams": "rocksdb (rocksdbjni) + changelog, caching",
            "faust": f"{args.faust_store} + changelog",
            "faust-lookup": f"{args.faust_store} + changelog",
            "quix": "rocksdb (rocksdict) + changelog",
        }[s]
        run = Run(
            system=s,
            bootstrap=bootstrap,
            inputs=inputs,
            output=outputs[(s, r)],
            group=f"jb-{run_id}-{s}-{r}",
            workdir=workdir,
            records=len(traffic.records),
            python=python,
            faust_store=args.faust_store,
            round=r,
            classpath=classpath,
            java_options=tuple(args.kstreams_java_options.split()),
            commit_ms=args.kstreams_commit_ms,
            last_offsets=format_last_offsets(last),
        )
        try:
            results.append(await run_system(run, traffic, args.timeout, result))
        except Exception as exc:  # report and go on with the next system
            result.status = "failed"
            result.detail = f"{type(exc).__name__}: {exc}\n{log_tail(run.log_path)}"
            results.append(result)
        if result.status in ("failed", "timeout"):
            say(f"{s}: {result.status}: {result.detail}")
    return {
        "command": " ".join(
            [Path(sys.executable).name, "-m", "benchmarks.join_throughput", *sys.argv[1:]]
        ),
        "auctions": args.auctions,
        "seed": args.seed,
        "records": len(traffic.records),
        "impressions": traffic.impressions,
        "clicks": traffic.clicks,
        "expected_joins": len(traffic.expected_joins),
        "produce_seconds": round(produce_s, 2),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "repeat": args.repeat,
        "results": [asdict(r) for r in median_runs(results)],
        "runs": [asdict(r) for r in results],
    }


def median_runs(results: list[Result]) -> list[Result]:
    """Per system (in run order), its run with the median time among the runs that finished;
    a system with no finished run is represented by its first run."""
    out: list[Result] = []
    for system in dict.fromkeys(r.system for r in results):
        runs = [r for r in results if r.system == system]
        timed = sorted((r for r in runs if r.seconds is not None), key=lambda r: r.seconds or 0)
        out.append(timed[(len(timed) - 1) // 2] if timed else runs[0])
    return out


def ratio(ours: Result | None, other: Result, by_cpu: bool = False) -> str:
    """How many times better streamjoin did: its joins/s over theirs, or (``by_cpu``) their
    CPU seconds over its own; in parentheses when their output was wrong."""
    if ours is None or other.system == "streamjoin":
        return ""
    if by_cpu:
        better, worse = other.cpu_seconds, ours.cpu_seconds
    else:
        better, worse = ours.joins_per_s, other.joins_per_s
    if not (ours.correct and better and worse):
        return "-"
    text = f"{better / worse:.2f}x"
    return text if other.correct else f"({text})"


def table(report: dict[str, Any]) -> str:
    results = [Result(**r) for r in report["results"]]
    ours = next((r for r in results if r.system == "streamjoin" and r.status == "ok"), None)
    rows: list[tuple[str, ...]] = [
        (
            "system",
            "version",
            "records",
            "startup s",
            "seconds",
            "input ev/s",
            "joins/s",
            "streamjoin / x",
            "cpu s",
            "by cpu",
            "peak RSS MB",
            "output correct?",
        )
    ]
    for r in results:
        if r.seconds is None:
            rows.append((r.system, r.version, str(r.records), *[""] * 8, r.status))
            continue
        verdict = "yes" if r.correct else f"NO: {r.missing} missing, {r.unexpected} unexpected"
        if r.duplicates:
            verdict += f" ({r.duplicates} dup)"
        rows.append(
            (
                r.system,
                r.version,
                f"{r.records:,}",
                f"{r.startup_seconds:.1f}",
                f"{r.seconds:.2f}",
                f"{r.input_events_per_s:,.0f}",
                f"{r.joins_per_s:,.0f}",
                ratio(ours, r),
                "" if r.cpu_seconds is None else f"{r.cpu_seconds:.2f}",
                ratio(ours, r, by_cpu=True),
                "" if r.peak_rss_mb is None else f"{r.peak_rss_mb:.0f}",
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = (
        f"{report['records']:,} records ({report['impressions']:,} impressions, "
        f"{report['clicks']:,} clicks), {report['expected_joins']:,} expected joins; "
        f"one worker each; Python {report['python']}, {report['cpus']} CPUs"
    )
    notes = [
        "streamjoin / x: streamjoin's joins/s divided by that system's; in parentheses when",
        "that system's output is wrong (a fast wrong answer does not count).",
        "cpu s: the app process's CPU time (all threads) from its first to its last input",
        "event; by cpu: that system's cpu s divided by streamjoin's (steadier than wall time",
        "when the machine is shared). peak RSS MB: the app process's peak resident set size.",
    ]
    eos = next((r for r in results if r.system == "streamjoin-eos" and r.status == "ok"), None)
    if ours is not None and eos is not None and ours.joins_per_s and eos.joins_per_s:
        cpu = ""
        if ours.cpu_seconds and eos.cpu_seconds:
            cpu = f", {100 * (eos.cpu_seconds / ours.cpu_seconds - 1):+.1f}% CPU seconds"
        change = 100 * (eos.joins_per_s / ours.joins_per_s - 1)
        notes.append(
            f"exactly-once against at-least-once: {change:+.1f}% joins/s{cpu} "
            "(streamjoin-eos: processing_guarantee=exactly_once, commit_interval 0.1 s, its "
            "default; streamjoin: at-least-once, 0.5 s)"
        )
    runs = [Result(**r) for r in report.get("runs", report["results"])]
    if report.get("repeat", 1) > 1:
        head += f"; median of {report['repeat']} interleaved rounds"
        for system in dict.fromkeys(r.system for r in runs):
            each = [r for r in runs if r.system == system]
            listed = ", ".join(
                f"{r.seconds:.2f}s/{r.cpu_seconds or 0:.2f} cpu s" if r.seconds else r.status
                for r in each
            )
            notes.append(f"{system} rounds: {listed}")
    for r in runs:
        if r.status in ("skipped", "failed", "timeout") and r.detail:
            notes.append(f"{r.system} round {r.round}: {r.status}: {r.detail.splitlines()[0]}")
        elif r.status == "wrong" and r.system == "streamjoin":
            notes.append(f"streamjoin round {r.round}: WRONG output ({r.missing} missing)")
    return "\n".join([head, "", *lines, "", *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--auctions", type=int, default=50_000, help="auctions to generate")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over all systems (interleaved); the table shows each system's median run",
    )
    parser.add_argument(
        "--systems",
        default="streamjoin,faust,faust-lookup,quix",
        help=f"comma-separated, in run order, from {','.join(SYSTEMS)}",
    )
    parser.add_argument(
        "--guarantee",
        choices=("at_least_once", "exactly_once"),
        default="at_least_once",
        help="exactly_once: also run streamjoin under exactly-once (streamjoin-eos, right "
        "after streamjoin in each round) and report its overhead against at-least-once",
    )
    parser.add_argument("--bootstrap", help="reuse a running loopback broker (HOST:PORT)")
    parser.add_argument(
        "--baseline-tree",
        help="source tree of an older commit that the streamjoin-base system runs "
        "(the before side of an A/B in one run; copy benchmarks/ into it)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per system")
    parser.add_argument("--faust-store", default="rocksdb://", help="rocksdb:// or memory://")
    parser.add_argument("--venv-root", default=str(VENV_ROOT))
    parser.add_argument("--no-install", action="store_true", help="never create venvs")
    kstreams_arguments(parser, commit_ms=500)
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, state)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    if args.baseline_tree:
        os.environ[BASELINE_TREE] = str(Path(args.baseline_tree).resolve())
    if args.guarantee == "exactly_once":
        systems = [x for x in args.systems.split(",") if x]
        if "streamjoin-eos" not in systems:
            if "streamjoin" not in systems:
                systems.insert(0, "streamjoin")
            systems.insert(systems.index("streamjoin") + 1, "streamjoin-eos")
        args.systems = ",".join(systems)

    workdir = Path(tempfile.mkdtemp(prefix="streamjoin-join-bench-"))
    try:
        with broker(args.bootstrap, say) as bootstrap:
            report = asyncio.run(bench(args, bootstrap, workdir))
    finally:
        if args.keep:
            say(f"work dir kept: {workdir}")
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else table(report))
    ours = [r for r in report["runs"] if r["system"] in ("streamjoin", "streamjoin-eos")]
    return 0 if all(r["correct"] for r in ours) else 1


if __name__ == "__main__":
    raise SystemExit(main())
