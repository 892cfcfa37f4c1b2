"""What the throughput benchmarks share: competitors' venvs, producing and reading topics,
running app processes to completion, and measuring their CPU time and peak memory.

``join_throughput.py``, ``window_count.py`` and ``enrichment.py`` use it. The apps report
their progress through marks files (:mod:`benchmarks.progress_marks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.progress_marks import format_last_offsets

ROOT = Path(__file__).resolve().parents[1]
VENV_ROOT = Path.home() / ".cache" / "streamjoin" / "bench" / "join-venvs"
#: venv name -> pip requirements
VENVS = {"faust": ["faust-streaming", "rocksdict"], "quix": ["quixstreams"]}
DIST_OF = {"faust": "faust-streaming", "quix": "quixstreams"}


def sayer(name: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    return say


say = sayer("bench")


# --------------------------------------------------------------------------- environment


def venv_python(name: str, root: Path, install: bool) -> tuple[Path | None, str]:
    """The venv's python (created and filled with pip when missing), or None and why not."""
    venv = root / name
    python = venv / "bin" / "python"
    ready = venv / ".join-bench-ready"
    if ready.exists() and python.exists():
        return python, ""
    if not install:
        return None, f"no venv at {venv} (run without --no-install to create it)"
    venv.parent.mkdir(parents=True, exist_ok=True)
    log = root / f"{name}-install.log"
    say(f"creating {venv} and installing {' '.join(VENVS[name])} (log: {log})")
    with log.open("w") as out:
        for cmd in (
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "-q", *VENVS[name]],
        ):
            try:
                code = subprocess.run(
                    cmd, stdout=out, stderr=subprocess.STDOUT, timeout=900
                ).returncode
            except subprocess.TimeoutExpired:
                code = -1
            if code != 0:
                return None, f"{' '.join(cmd[:4])}... failed (exit {code}); see {log}"
    ready.write_text("ok\n")
    return python, ""


def dist_version(python: Path, dist: str) -> str:
    try:
        out = subprocess.run(
            [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return "?"
    return out.stdout.strip() or "?"


def streamjoin_version() -> str:
    import streamjoin

    return getattr(streamjoin, "__version__", "?")


def tree_commit(tree: str) -> str:
    """The short commit a source tree is at (the baseline's version column)."""
    try:
        out = subprocess.run(
            ["git", "-C", tree, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return out.stdout.strip()


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "?"


# --------------------------------------------------------------------------- processes


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    if proc.poll() is not None:
        return
    # (py-spy and cProfile write their profiles on SIGINT; on SIGTERM they die without)
    env = os.environ
    profiled = env.get("STREAMJOIN_BENCH_PYSPY") or env.get("STREAMJOIN_BENCH_CPROFILE")
    stop = signal.SIGINT if profiled else signal.SIGTERM
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, stop)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def log_tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set size (``VmHWM``) in MB, while it runs; None after."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """The process's CPU time so far (user + system, all threads), while it runs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def py_spy_prefix(name: str) -> list[str]:
    """``py-spy record`` in front of a streamjoin worker's command when the environment
    names a directory in ``STREAMJOIN_BENCH_PYSPY`` (profiles: ``benchmarks/profile_summary.py``).
    CPU time and RSS are then those of the worker under py-spy's sampling.
    ``STREAMJOIN_BENCH_PYSPY_BLOCKING=1`` pauses the worker for each sample: slower, but
    no frame is lost to a sample read while the interpreter changes its stack."""
    out = os.environ.get("STREAMJOIN_BENCH_PYSPY")
    if not out:
        return []
    py_spy = Path(sys.executable).with_name("py-spy")
    Path(out).mkdir(parents=True, exist_ok=True)
    return [
        str(py_spy),
        "record",
        "--format",
        "raw",
        "--rate",
        "250",
        *([] if os.environ.get("STREAMJOIN_BENCH_PYSPY_BLOCKING") else ["--nonblocking"]),
        "-o",
        str(Path(out) / f"{name}.txt"),
        "--",
    ]


def cprofile_args(name: str) -> list[str]:
    """``-m cProfile -o DIR/<name>.prof`` after a streamjoin worker's interpreter when
    ``STREAMJOIN_BENCH_CPROFILE`` names a directory: exact call counts per function (how
    many calls one event costs), at several times the CPU time, so not a measurement."""
    out = os.environ.get("STREAMJOIN_BENCH_CPROFILE")
    if not out:
        return []
    Path(out).mkdir(parents=True, exist_ok=True)
    return ["-m", "cProfile", "-o", str(Path(out) / f"{name}.prof")]


# --------------------------------------------------------------------------- broker I/O


async def wait_leaders(
    bootstrap: str, topics: Sequence[str], partitions: int, timeout: float = 30
) -> None:
    """Until every partition of ``topics`` answers ListOffsets (has a leader)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        deadline = time.monotonic() + timeout
        while True:
            try:
                await consumer.end_offsets(tps)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await consumer.stop()


#: (topic, key, value, timestamp ms)
Record = tuple[str, bytes, bytes, int]


async def produce(bootstrap: str, records: Iterable[Record]) -> float:
    """Sends ``records`` in order (Kafka's murmur2 partitioner on the key); seconds taken."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    started = time.monotonic()
    try:
        for topic, key, value, ts in records:
            await producer.send(topic, value, key=key, timestamp_ms=ts)
        await producer.flush()
    finally:
        await producer.stop()
    return time.monotonic() - started


async def last_offsets(
    bootstrap: str, topics: Sequence[str], partitions: int
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> offset of its last record, for the non-empty partitions."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {(tp.topic, tp.partition): end - 1 for tp, end in ends.items() if end > 0}


async def read_records(
    bootstrap: str, topic: str, partitions: int, timeout: float = 120
) -> list[Any]:
    """Every record of ``topic`` (aiokafka's ConsumerRecords), read_committed: what an
    exactly-once reader sees (the same as read_uncommitted for the others)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        deadline = time.monotonic() + timeout
        while remaining and time.monotonic() < deadline:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for records in batch.values():
                out.extend(records)
            # (the position, not the last record: a transaction's commit marker, last in a
            # partition written exactly-once, is never handed out)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        if remaining:
            raise TimeoutError(f"could not read {topic} to its end")
    finally:
        await consumer.stop()
    return out


async def read_topic(
    bootstrap: str, topic: str, partitions: int, timeout: float = 120
) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of ``topic`` as (key, value), read_committed."""
    records = await read_records(bootstrap, topic, partitions, timeout)
    return [(r.key, r.value) for r in records]


# --------------------------------------------------------------------------- running apps


@dataclass
class Measured:
    """What running one system's processes to completion measured."""

    status: str = "ok"  # "ok", "failed", "timeout"
    detail: str = ""
    processes: int = 1
    #: first input event in any process to the last partition's last offset processed
    seconds: float | None = None
    #: sum over processes of CPU time (user + sys, all threads) from its FIRST to its last mark
    cpu_seconds: float | None = None
    #: the largest peak RSS among the processes
    peak_rss_mb: float | None = None
    startup_seconds: float | None = None
    marks: list[dict[str, Any]] = field(default_factory=list)


def read_marks(path: Path) -> list[tuple[str, float, float, str]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3:
                out.append((fields[0], float(fields[1]), float(fields[2]), " ".join(fields[3:])))
    return out


async def run_to_completion(
    commands: Sequence[tuple[list[str], dict[str, str]]],
    marks_paths: Sequence[Path],
    log_paths: Sequence[Path],
    last: dict[tuple[str, int], int],
    timeout: float,
    progress: Callable[[str], None] = say,
    settle: Callable[[], Awaitable[float | None]] | None = None,
) -> Measured:
    """Start every command (one process each, at once), wait until the marks of all of them
    together show every partition of ``last`` done, take their peak RSS, stop them.

    Each command's environment gets ``BENCH_MARKS`` (its marks file) and
    ``BENCH_LAST_OFFSETS`` (``last``, formatted for :mod:`benchmarks.progress_marks`).
    ``settle`` is awaited once every partition is done, before the processes are stopped
    (to let outputs arrive). A ``settle`` that returns a time (``time.time()``: when the
    output last grew) ends the measurement there instead: the work goes on after the last
    input (a foreign-key join's round trips), so the wall time runs to that moment and the
    CPU time to the end of the settling (read from ``/proc``: the quiet wait is counted)."""
    measured = Measured(processes=len(commands))
    procs: list[subprocess.Popen[bytes]] = []
    spawned = time.time()
    rss: dict[int, float] = {}
    try:
        for (cmd, env), marks, log in zip(commands, marks_paths, log_paths, strict=True):
            env = {
                **env,
                "BENCH_MARKS": str(marks),
                "BENCH_LAST_OFFSETS": format_last_offsets(last),
            }
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(  # noqa: ASYNC220 - spawning returns at once
                        cmd,
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + timeout
        wanted = {f"{t}:{p}" for t, p in last}
        while True:
            for proc in procs:
                peak = peak_rss_mb(proc.pid)
                if peak is not None:
                    rss[proc.pid] = max(rss.get(proc.pid, 0.0), peak)
            done = {
                extra
                for path in marks_paths
                for what, _, _, extra in read_marks(path)
                if what == "PDONE"
            }
            if wanted <= done:
                break
            for proc, log in zip(procs, log_paths, strict=True):
                if proc.poll() is not None:
                    measured.status = "failed"
                    measured.detail = f"exited with {proc.returncode}:\n{log_tail(log)}"
                    return measured
            if time.monotonic() > deadline:
                measured.status = "timeout"
                measured.detail = (
                    f"not done after {timeout:.0f}s ({len(done)}/{len(wanted)} partitions):\n"
                    + log_tail(log_paths[0])
                )
                return measured
            await asyncio.sleep(0.1)
        settled_at = None
        if settle is not None:
            settled_at = await settle()
        cpu_at_end: list[float | None] = []
        for proc in procs:  # once more, at the end
            peak = peak_rss_mb(proc.pid)
            if peak is not None:
                rss[proc.pid] = max(rss.get(proc.pid, 0.0), peak)
            cpu_at_end.append(process_cpu_seconds(proc.pid))
    finally:
        for proc in procs:
            stop_process(proc)
    firsts, ends, cpu = [], [], 0.0
    for path, end_cpu in zip(marks_paths, cpu_at_end, strict=True):
        marks = read_marks(path)
        measured.marks.append({"path": path.name, "marks": len(marks)})
        first = next((m for m in marks if m[0] == "FIRST"), None)
        if first is None:
            continue  # this process got no input at all
        last_mark = max(marks, key=lambda m: m[1])
        firsts.append(first[1])
        if settled_at is not None and end_cpu is not None:
            ends.append(settled_at)
            cpu += end_cpu - first[2]
            continue
        ends.append(
            max(m[1] for m in marks if m[0] == "PDONE")
            if any(m[0] == "PDONE" for m in marks)
            else last_mark[1]
        )
        cpu += last_mark[2] - first[2]
    measured.seconds = max(ends) - min(firsts)
    measured.cpu_seconds = cpu
    measured.startup_seconds = min(firsts) - spawned
    measured.peak_rss_mb = max(rss.values()) if rss else None
    progress(
        f"{measured.seconds:.2f}s, {cpu:.2f} cpu s, peak RSS "
        f"{measured.peak_rss_mb or 0:.0f} MB, {len(procs)} process(es)"
    )
    return measured


# --------------------------------------------------------------------------- workloads


#: systems of the workload benchmarks; "streamjoin-2w" is two streamjoin worker processes
WORKLOAD_SYSTEMS = (
    "streamjoin",
    "streamjoin-take",
    "streamjoin-2w",
    "streamjoin-base",
    "quix",
    "faust",
)

#: ``streamjoin-take``: the window count's agent takes batches of this many events
#: (``stream.take``) instead of one event at a time
TAKE_BATCH = 64
#: environment variable naming the source tree ``streamjoin-base`` runs (set by --baseline-tree)
BASELINE_TREE = "STREAMJOIN_BENCH_BASELINE_TREE"


def baseline_worker(env: dict[str, str]) -> list[str]:
    """The interpreter prefix of a ``streamjoin-base`` worker: Python run with ``-P`` (no
    current directory on ``sys.path``) and ``PYTHONPATH`` at the baseline tree, so its
    ``streamjoin`` and ``benchmarks`` packages are imported instead of this checkout's (the
    tree needs this checkout's ``benchmarks/`` copied in: the apps and marks must match)."""
    tree = os.environ.get(BASELINE_TREE)
    if not tree or not (Path(tree) / "streamjoin" / "__init__.py").exists():
        raise SystemExit(
            "streamjoin-base needs --baseline-tree (a source tree of an older commit, "
            "e.g. a git worktree, with this checkout's benchmarks/ copied in)"
        )
    env["PYTHONPATH"] = tree
    return [sys.executable, "-P"]


VENV_OF = {"faust": "faust", "quix": "quix"}


@dataclass
class WorkloadResult:
    system: str
    status: str  # "ok", "wrong", "skipped", "failed", "timeout"
    round: int = 0
    version: str = ""
    processes: int = 1
    events: int = 0
    detail: str = ""
    startup_seconds: float | None = None
    seconds: float | None = None
    events_per_s: float | None = None
    cpu_seconds: float | None = None
    cpu_us_per_event: float | None = None
    peak_rss_mb: float | None = None
    correct: bool = False
    check: dict[str, int] = field(default_factory=dict)


@dataclass
class Topics:
    input: str
    table: str | None = None
    output: str | None = None


def workload_commands(
    system: str,
    workload: str,
    bootstrap: str,
    group: str,
    topics: Topics,
    python: Path | None,
    workdir: Path,
    name: str,
    partitions: int,
) -> list[tuple[list[str], dict[str, str]]]:
    """One (command, environment) per process of ``system`` running ``workload``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if system.startswith("streamjoin"):
        env.update(
            BENCH_WORKLOAD=workload,
            BENCH_APP_ID=group,
            BENCH_INPUT=topics.input,
            BENCH_TABLE=topics.table or "",
            BENCH_OUTPUT=topics.output or "",
            STREAMJOIN_BROKER=f"kafka://{bootstrap}",
        )
        if system == "streamjoin-take":
            env["BENCH_TAKE"] = str(TAKE_BATCH)
        workers = 2 if system == "streamjoin-2w" else 1
        python_cmd = baseline_worker(env) if system == "streamjoin-base" else [sys.executable]
        return [
            (
                [
                    *py_spy_prefix(f"{name}-{i}"),
                    *python_cmd,
                    *cprofile_args(f"{name}-{i}"),
                    "-m",
                    "streamjoin.cli",
                    "worker",
                    "-A",
                    "benchmarks.workload_streamjoin_app:app",
                    "--state-dir",
                    str(workdir / f"state-{name}-{i}"),
                    "--loglevel",
                    "warning",
                ],
                env,
            )
            for i in range(workers)
        ]
    assert python is not None
    env.pop("PYTHONPATH", None)  # the competitors' venvs must not see this repo's packages
    common = ["--workload", workload, "--bootstrap", bootstrap, "--app-id", group]
    common += ["--input", topics.input]
    if topics.table:
        common += ["--table", topics.table]
    if topics.output:
        common += ["--output", topics.output]
    if system == "faust":
        script = ROOT / "benchmarks" / "workload_faust_app.py"
        extra = ["--datadir", str(workdir / f"data-{name}"), "--partitions", str(partitions)]
    else:
        script = ROOT / "benchmarks" / "workload_quix_app.py"
        extra = ["--state-dir", str(workdir / f"state-{name}")]
    return [([str(python), str(script), *common, *extra], env)]


def median_results(results: list[WorkloadResult]) -> list[WorkloadResult]:
    """Per system (in run order) its run with the median CPU time among the finished ones."""
    out: list[WorkloadResult] = []
    for system in dict.fromkeys(r.system for r in results):
        runs = [r for r in results if r.system == system]
        timed = sorted(
            (r for r in runs if r.cpu_seconds is not None), key=lambda r: r.cpu_seconds or 0
        )
        out.append(timed[(len(timed) - 1) // 2] if timed else runs[0])
    return out


def workload_table(report: dict[str, Any]) -> str:
    """The report as a text table, with the ratios against one streamjoin worker."""
    results = [WorkloadResult(**r) for r in report["results"]]
    ours = next((r for r in results if r.system == "streamjoin" and r.correct), None)
    rows = [
        (
            "system",
            "version",
            "procs",
            "seconds",
            "events/s",
            "cpu s",
            "cpu µs/event",
            "x by cpu",
            "peak RSS MB",
            "correct?",
        )
    ]
    for r in results:
        if r.seconds is None or r.cpu_seconds is None:
            rows.append((r.system, r.version, str(r.processes), *[""] * 6, r.status))
            continue
        by_cpu = ""
        if ours is not None and r is not ours and ours.cpu_seconds:
            by_cpu = f"{r.cpu_seconds / ours.cpu_seconds:.2f}x"
            if not r.correct:
                by_cpu = f"({by_cpu})"
        verdict = (
            "yes"
            if r.correct
            else "NO: " + ", ".join(f"{v} {k}" for k, v in r.check.items() if v and k != "expected")
        )
        rows.append(
            (
                r.system,
                r.version,
                str(r.processes),
                f"{r.seconds:.2f}",
                f"{r.events_per_s:,.0f}",
                f"{r.cpu_seconds:.2f}",
                f"{r.cpu_us_per_event:.1f}",
                by_cpu,
                "" if r.peak_rss_mb is None else f"{r.peak_rss_mb:.0f}",
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        "cpu s: user + sys time of the system's process(es), all threads, from the first input",
        "event to the last partition's last offset; x by cpu: that system's cpu s / streamjoin's",
        "(in parentheses when its answer is wrong). peak RSS: the largest VmHWM of its processes.",
    ]
    two = next((r for r in results if r.system == "streamjoin-2w" and r.correct), None)
    if ours is not None and two is not None and ours.seconds and two.seconds:
        notes.append(
            f"2 workers vs 1: {ours.seconds / two.seconds:.2f}x events/s, cpu per event "
            f"{two.cpu_us_per_event or 0:.1f} vs {ours.cpu_us_per_event or 0:.1f} µs"
        )
    runs = [WorkloadResult(**r) for r in report["runs"]]
    if report.get("repeat", 1) > 1:
        for system in dict.fromkeys(r.system for r in runs):
            listed = ", ".join(
                f"{r.seconds:.2f}s/{r.cpu_seconds:.2f} cpu s"
                if r.seconds is not None and r.cpu_seconds is not None
                else r.status
                for r in runs
                if r.system == system
            )
            notes.append(f"{system} rounds: {listed}")
    for r in runs:
        if r.status in ("skipped", "failed", "timeout") and r.detail:
            notes.append(f"{r.system} round {r.round}: {r.status}: {r.detail.splitlines()[0]}")
    return "\n".join([report["head"], "", *lines, "", *notes])


def workload_arguments(parser: Any, *, events: int, keys: int) -> None:
    """The options window_count.py and enrichment.py share."""
    parser.add_argument("--events", type=int, default=events, help="input events")
    parser.add_argument("--keys", type=int, default=keys, help="distinct keys")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    parser.add_argument(
        "--systems",
        default="streamjoin,quix,faust",
        help=f"comma-separated, in run order, from {','.join(WORKLOAD_SYSTEMS)}",
    )
    parser.add_argument(
        "--workers",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: also run two streamjoin worker processes (streamjoin-2w) and report scaling",
    )
    parser.add_argument("--bootstrap", help="reuse a running loopback broker (HOST:PORT)")
    parser.add_argument(
        "--baseline-tree",
        help="source tree of an older commit that the streamjoin-base system runs "
        "(the before side of an A/B in one run; copy benchmarks/ into it)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per system")
    parser.add_argument("--venv-root", default=str(VENV_ROOT))
    parser.add_argument("--no-install", action="store_true", help="never create venvs")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, state)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def chosen_systems(args: Any) -> list[str]:
    if getattr(args, "baseline_tree", None):
        os.environ[BASELINE_TREE] = str(Path(args.baseline_tree).resolve())
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in WORKLOAD_SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(WORKLOAD_SYSTEMS)}")
    if args.workers == 2 and "streamjoin-2w" not in systems:
        at = systems.index("streamjoin") + 1 if "streamjoin" in systems else 0
        systems.insert(at, "streamjoin-2w")
    return systems


@dataclass
class WorkloadSpec:
    """One workload: its data, which topics it uses and how an answer is checked."""

    bench: str  # e.g. "window_count"
    workload: str  # "count" or "enrich" (what the apps run)
    #: (logical topic "input"/"table", key, value, timestamp ms), in produce order
    records: list[tuple[str, bytes, bytes, int]]
    head: str
    #: (marks files of the run, the run's topics, bootstrap) -> counts; all zero but
    #: "expected" means correct
    check: Callable[[list[Path], Topics, str], Awaitable[dict[str, int]]]
    #: awaited after every partition is done, before the processes stop
    settle: Callable[[list[Path], Topics, str], Awaitable[None]] | None = None
    uses_table: bool = False
    uses_output: bool = False


async def run_workload(
    args: Any, spec: WorkloadSpec, bootstrap: str, workdir: Path
) -> dict[str, Any]:
    """Produce the records once, run every system (rounds interleaved), check each answer."""
    import uuid

    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

    progress = sayer(spec.bench)
    systems = chosen_systems(args)
    pythons: dict[str, tuple[Path | None, str]] = {}
    for s in systems:
        venv = VENV_OF.get(s)
        if venv and venv not in pythons:
            pythons[venv] = venv_python(venv, Path(args.venv_root), not args.no_install)
    run_id = uuid.uuid4().hex[:8]
    prefix = f"{spec.bench.replace('_', '')}-{run_id}"
    names = {"input": f"{prefix}-input"}
    if spec.uses_table:
        names["table"] = f"{prefix}-table"
    rounds = range(args.repeat)
    outputs = {(s, r): f"{prefix}-out-{s}-{r}" for s in systems for r in rounds}
    specs = [TopicSpec(t, args.partitions) for t in names.values()]
    if spec.uses_output:
        specs += [TopicSpec(t, args.partitions) for t in outputs.values()]
    await ensure_topics(bootstrap, specs)
    await wait_leaders(bootstrap, [sp.name for sp in specs], args.partitions)
    produce_s = await produce(bootstrap, ((names[t], k, v, ts) for t, k, v, ts in spec.records))
    progress(f"produced {len(spec.records):,} records in {produce_s:.1f}s")
    last = await last_offsets(bootstrap, list(names.values()), args.partitions)
    # done = every partition of the input processed (a table topic is read, not awaited)
    last_inputs = {tp: o for tp, o in last.items() if tp[0] == names["input"]}

    results: list[WorkloadResult] = []
    for r, s in ((r, s) for r in rounds for s in systems):
        result = WorkloadResult(system=s, status="skipped", round=r, events=len(spec.records))
        results.append(result)
        venv = VENV_OF.get(s)
        python = None
        if venv:
            python, why = pythons[venv]
            if python is None:
                result.detail = why
                progress(f"{s}: skipped: {why}")
                continue
            result.version = dist_version(python, DIST_OF[venv])
        elif s == "streamjoin-base":
            result.version = tree_commit(os.environ.get(BASELINE_TREE, ""))
        else:
            result.version = streamjoin_version()
        name = f"{s}-{r}"
        topics = Topics(
            input=names["input"],
            table=names.get("table"),
            output=outputs[(s, r)] if spec.uses_output else None,
        )
        commands = workload_commands(
            s,
            spec.workload,
            bootstrap,
            f"{prefix}-{name}",
            topics,
            python,
            workdir,
            name,
            args.partitions,
        )
        marks = [workdir / f"{name}-{i}.marks" for i in range(len(commands))]
        logs = [workdir / f"{name}-{i}.log" for i in range(len(commands))]
        result.processes = len(commands)
        progress(f"{s}: starting {len(commands)} process(es)")
        settle = None
        if spec.settle is not None:
            settle = functools.partial(spec.settle, marks, topics, bootstrap)
        try:
            measured = await run_to_completion(
                commands, marks, logs, last_inputs, args.timeout, progress, settle
            )
        except Exception as exc:  # report and go on with the next system
            result.status = "failed"
            result.detail = f"{type(exc).__name__}: {exc}\n{log_tail(logs[0])}"
            progress(f"{s}: failed: {result.detail}")
            continue
        result.status = measured.status
        result.detail = measured.detail
        if measured.status != "ok" or measured.seconds is None:
            progress(f"{s}: {result.status}: {result.detail}")
            continue
        result.startup_seconds = measured.startup_seconds
        result.seconds = measured.seconds
        result.cpu_seconds = measured.cpu_seconds
        result.peak_rss_mb = measured.peak_rss_mb
        result.events_per_s = len(spec.records) / measured.seconds
        result.cpu_us_per_event = 1e6 * (measured.cpu_seconds or 0) / len(spec.records)
        result.check = await spec.check(marks, topics, bootstrap)
        result.correct = all(v == 0 for k, v in result.check.items() if k != "expected")
        result.status = "ok" if result.correct else "wrong"
        progress(f"{s}: {result.status} {result.check}")
    import platform

    head = (
        f"{spec.head}; {args.partitions} partitions; Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; load average {load_average()}"
    )
    return {
        "command": " ".join(
            [Path(sys.executable).name, "-m", f"benchmarks.{spec.bench}", *sys.argv[1:]]
        ),
        "head": head,
        "records": len(spec.records),
        "produce_seconds": round(produce_s, 2),
        "repeat": args.repeat,
        "results": [asdict(x) for x in median_results(results)],
        "runs": [asdict(x) for x in results],
    }


def workload_main(args: Any, spec: WorkloadSpec) -> int:
    """Run ``spec`` on a broker (``args.bootstrap`` or a fresh one), print the report."""
    import json
    import shutil
    import tempfile

    from benchmarks.broker import broker

    workdir = Path(tempfile.mkdtemp(prefix=f"streamjoin-{spec.bench}-"))
    try:
        with broker(args.bootstrap, sayer(spec.bench)) as bootstrap:
            report = asyncio.run(run_workload(args, spec, bootstrap, workdir))
    finally:
        if args.keep:
            say(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else workload_table(report))
    ours = [r for r in report["runs"] if r["system"].startswith("streamjoin")]
    return 0 if all(r["correct"] for r in ours) else 1
