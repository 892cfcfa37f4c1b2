"""Backfill on Spark vs one streamjoin worker from Kafka, over the same ad-traffic history.

    .venv/bin/python -m benchmarks.backfill --records 1000000
    .venv/bin/python -m benchmarks.backfill --records 10000000 --no-worker
    .venv/bin/python -m benchmarks.backfill --records 1000000 --baseline-tree ../old-tree

What it does, in one run:

1. Generates ``--records`` records of the demo's ad traffic (``examples/ad_traffic.py``,
   ``--seed``; about 1.43 records per auction, so ``records / 1.43`` auctions) and writes
   them as JSON lines (``topic, key, value, timestamp``): the backfill's files source.
2. ``backfill``: ``streamjoin backfill -A examples.ad_monetization:app ad_clicks --input
   <history> --output <dir> --output-format json --master <--master>`` in a fresh
   process (its own JVM). ``backfill-base`` (with ``--baseline-tree``): the same command
   with that tree's streamjoin first on the import path (the before side of an A/B).
   Measured: the job's time as the command reports it (the Spark job, without the JVM's
   start), records/s over it, the wall time of the whole command, CPU time of the whole
   process tree (driver, JVM, Python workers) sampled from ``/proc``, and peak RSS
   (``VmHWM``) of the JVM (driver and executors: one process in local mode) and of the
   largest Python worker, plus the largest sum of RSS over the tree seen at one sample.
   The answer is checked: the distinct joins written must equal ``expected_joins``.
3. ``worker``: the same history (same generator, auctions and seed) through one
   streamjoin worker from Kafka: ``benchmarks.join_throughput --systems streamjoin``
   (its own broker unless ``--bootstrap``), whose seconds, CPU seconds and peak RSS are
   reported next to the backfill's, with the ratio of records/s.

Ratios only mean something within one run (CPU speed differs between machines here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, load_average, sayer, streamjoin_version, tree_commit
from examples.ad_traffic import generate

say = sayer("backfill-bench")
#: records per auction of examples/ad_traffic.py's defaults (1 + 0.35 + 0.03 + 0.05)
RECORDS_PER_AUCTION = 1.43
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_DONE = re.compile(r"backfill \S+: (\d+) records .*-> (\d+) outputs .* in ([0-9.]+)s")


@dataclass
class Result:
    system: str
    status: str  # "ok", "wrong", "failed", "skipped"
    version: str = ""
    records: int = 0
    job_seconds: float | None = None
    wall_seconds: float | None = None
    records_per_s: float | None = None
    cpu_seconds: float | None = None
    jvm_peak_rss_mb: float | None = None
    python_worker_peak_rss_mb: float | None = None
    python_workers: int = 0
    tree_peak_rss_mb: float | None = None
    outputs: int = 0
    correct: bool = False
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- /proc sampling


def _stat(pid: int) -> tuple[int, str, float] | None:
    """``(ppid, comm, cpu seconds)`` of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _status_kb(pid: int, name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeSampler:
    """Samples a process tree every ``interval`` s: each process's CPU time and peak RSS
    (``VmHWM``, kept by the kernel, so a sample only has to see the process once)."""

    def __init__(self, root: int, interval: float = 0.25) -> None:
        self.root = root
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self.hwm_kb: dict[int, int] = {}
        self.comm: dict[int, str] = {}
        self.tree_rss_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _descendants(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                stat = _stat(int(entry.name))
                if stat is not None:
                    parents.setdefault(stat[0], []).append(int(entry.name))
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(parents.get(pid, []))
        return found

    def sample(self) -> None:
        total = 0
        for pid in self._descendants():
            stat = _stat(pid)
            if stat is None:
                continue
            self.comm[pid] = stat[1]
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), stat[2])
            self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), _status_kb(pid, "VmHWM"))
            total += _status_kb(pid, "VmRSS")
        self.tree_rss_kb = max(self.tree_rss_kb, total)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


# --------------------------------------------------------------------------- the runs


def write_history(path: Path, records: int, seed: int) -> Any:
    auctions = math.ceil(records / RECORDS_PER_AUCTION)
    traffic = generate(auctions, seed=seed)
    with path.open("w") as f:
        for r in traffic.records:
            row = {"topic": r.topic, "key": r.key, "value": r.value, "timestamp": r.timestamp_ms}
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return traffic


def run_backfill(
    system: str, tree: Path, history: Path, out: Path, args: argparse.Namespace, expected: set[Any]
) -> Result:
    result = Result(system, "failed")
    result.version = tree_commit(str(tree)) if system == "backfill-base" else streamjoin_version()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    cmd = [
        sys.executable,
        "-m",
        "streamjoin.cli",
        "backfill",
        "-A",
        "examples.ad_monetization:app",
        "ad_clicks",
        "--input",
        str(history),
        "--output",
        str(out),
        "--output-format",
        "json",
        "--overwrite",
        "--master",
        args.master,
        "--quiet",
        *[f"--conf={c}" for c in args.conf],
    ]
    if system == "backfill" and args.parallelism:
        cmd += ["--parallelism", str(args.parallelism)]
    say(f"{system}: {' '.join(cmd[2:8])} ... (tree {tree})")
    started = time.monotonic()
    log = out.parent / f"{system}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=sink)
        with TreeSampler(proc.pid) as sampler:
            stdout, _ = proc.communicate()
            sampler.sample()
    result.wall_seconds = round(time.monotonic() - started, 2)
    text = stdout.decode(errors="replace")
    match = _DONE.search(text)
    if proc.returncode != 0 or match is None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        result.detail = f"exit {proc.returncode}: {text.strip()}\n{tail}"
        say(f"{system}: failed: {result.detail}")
        return result
    result.records, result.outputs = int(match[1]), int(match[2])
    result.job_seconds = float(match[3])
    result.records_per_s = round(result.records / result.job_seconds)
    result.cpu_seconds = round(sum(sampler.cpu.values()), 1)
    jvm = [kb for pid, kb in sampler.hwm_kb.items() if sampler.comm[pid] == "java"]
    workers = [
        kb
        for pid, kb in sampler.hwm_kb.items()
        if sampler.comm[pid].startswith("python") and pid != proc.pid
    ]
    result.jvm_peak_rss_mb = round(max(jvm) / 1024) if jvm else None
    result.python_worker_peak_rss_mb = round(max(workers) / 1024) if workers else None
    result.python_workers = len(workers)
    result.tree_peak_rss_mb = round(sampler.tree_rss_kb / 1024)
    result.extra["driver_peak_rss_mb"] = round(sampler.hwm_kb.get(proc.pid, 0) / 1024)
    got = set()
    for part in out.glob("part-*.json"):
        for line in part.read_text().splitlines():
            v = json.loads(json.loads(line)["value"])
            got.add((v["auction_id"], v["impression_id"], v["click_id"]))
    result.correct = got == expected and result.outputs == len(expected)
    result.status = "ok" if result.correct else "wrong"
    say(
        f"{system}: {result.records:,} records in {result.job_seconds:.1f}s of job "
        f"({result.records_per_s:,}/s), {result.wall_seconds:.1f}s wall, "
        f"{result.cpu_seconds:.0f} CPU s, JVM {result.jvm_peak_rss_mb} MB, "
        f"Python worker {result.python_worker_peak_rss_mb} MB, correct={result.correct}"
    )
    return result


def run_worker(args: argparse.Namespace, auctions: int) -> Result:
    """The same history through one streamjoin worker, by benchmarks.join_throughput."""
    result = Result("worker", "failed", version=streamjoin_version())
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.join_throughput",
        "--auctions",
        str(auctions),
        "--seed",
        str(args.seed),
        "--systems",
        "streamjoin",
        "--timeout",
        str(args.timeout),
        "--json",
    ]
    if args.bootstrap:
        cmd += ["--bootstrap", args.bootstrap]
    say(f"worker: {' '.join(cmd[2:])}")
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    try:
        report = json.loads(done.stdout)
        run = report["results"][0]
    except (ValueError, KeyError, IndexError):
        result.detail = f"exit {done.returncode}: {done.stderr[-2000:]}"
        say(f"worker: failed: {result.detail}")
        return result
    result.records = int(report["records"])
    result.job_seconds = run["seconds"]
    result.records_per_s = round(run["input_events_per_s"]) if run["seconds"] else None
    result.cpu_seconds = run["cpu_seconds"] and round(run["cpu_seconds"], 1)
    result.tree_peak_rss_mb = run["peak_rss_mb"] and round(run["peak_rss_mb"])
    result.outputs = run["outputs"]
    result.correct = bool(run["correct"])
    result.status = run["status"]
    result.extra = {"produce_seconds": report["produce_seconds"]}
    say(f"worker: {result.records:,} records in {result.job_seconds}s, correct={result.correct}")
    return result


def table(report: dict[str, Any]) -> str:
    rows = [
        "| run | records | job s | records/s | wall s | CPU s | JVM peak RSS MB | "
        "Python worker peak RSS MB | tree peak RSS MB | correct |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def cell(value: Any) -> str:
        """A number rounded for reading (``,`` separated), or empty when not measured."""
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:,.1f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    for r in report["results"]:
        numbers = [
            r["records"],
            r["job_seconds"],
            r["records_per_s"],
            r["wall_seconds"],
            r["cpu_seconds"],
            r["jvm_peak_rss_mb"],
            r["python_worker_peak_rss_mb"],
            r["tree_peak_rss_mb"],
        ]
        rows.append(
            f"| {r['system']} ({r['version']}) | {' | '.join(map(cell, numbers))} | "
            f"{r['correct']} ({r['status']}) |"
        )
    lines = [f"`{report['command']}` (load {report['load']}, {report['cpus']} CPUs)", "", *rows]
    for name, value in report["ratios"].items():
        lines.append(f"- {name}: {value}")
    return "\n".join(lines)


def ratios(results: list[Result]) -> dict[str, str]:
    by = {r.system: r for r in results if r.status == "ok" and r.records_per_s}
    out: dict[str, str] = {}
    if "backfill" in by and "worker" in by:
        out["backfill / worker, records/s"] = (
            f"{by['backfill'].records_per_s / by['worker'].records_per_s:.2f}x"  # type: ignore[operator]
        )
    if "backfill" in by and "backfill-base" in by:
        out["backfill / backfill-base, records/s"] = (
            f"{by['backfill'].records_per_s / by['backfill-base'].records_per_s:.2f}x"  # type: ignore[operator]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records to generate")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--parallelism", type=int, help="backfill --parallelism (default: Spark's)")
    parser.add_argument("--conf", action="append", default=[], metavar="K=V", help="Spark setting")
    parser.add_argument("--baseline-tree", help="an older source tree to run as backfill-base")
    parser.add_argument(
        "--base-first",
        action="store_true",
        help="run backfill-base before backfill (the first run pays for cold caches)",
    )
    parser.add_argument("--no-worker", action="store_true", help="skip the Kafka worker run")
    parser.add_argument("--bootstrap", help="loopback broker for the worker run (HOST:PORT)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the worker")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="streamjoin-backfill-bench-"))
    history = workdir / "history.json"
    started = time.monotonic()
    traffic = write_history(history, args.records, args.seed)
    auctions = math.ceil(args.records / RECORDS_PER_AUCTION)
    say(
        f"history: {len(traffic.records):,} records ({auctions:,} auctions, "
        f"{len(traffic.expected_joins):,} joins expected) in {time.monotonic() - started:.0f}s"
    )
    results: list[Result] = []
    try:
        runs = [("backfill", ROOT)]
        if args.baseline_tree:
            base = ("backfill-base", Path(args.baseline_tree).resolve())
            runs.insert(0 if args.base_first else 1, base)
        for system, tree in runs:
            results.append(
                run_backfill(
                    system, tree, history, workdir / f"out-{system}", args, traffic.expected_joins
                )
            )
        del traffic
        if not args.no_worker:
            results.append(run_worker(args, auctions))
    finally:
        if args.keep:
            say(f"work dir kept: {workdir}")
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "command": " ".join(
            [Path(sys.executable).name, "-m", "benchmarks.backfill", *sys.argv[1:]]
        ),
        "commit": tree_commit(str(ROOT)),
        "load": load_average(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "seconds": round(time.monotonic() - started),
        "results": [asdict(r) for r in results],
        "ratios": ratios(results),
    }
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
