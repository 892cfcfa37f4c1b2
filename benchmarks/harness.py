"""What the throughput benchmarks share: competitors' venvs and the Kafka Streams apps,
producing and reading topics, running app processes to completion, measuring their CPU
time and peak memory, and one loop, table and command line for systems run in rounds.

``window_count.py``, ``enrichment.py``, ``window_kinds.py`` and ``table_joins.py`` run
their systems with :func:`run_rounds`; ``join_throughput.py`` uses the parts below it.
The apps report their progress through marks files (:mod:`benchmarks.progress_marks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.progress_marks import format_last_offsets

ROOT = Path(__file__).resolve().parents[1]
VENV_ROOT = Path.home() / ".cache" / "streamjoin" / "bench" / "join-venvs"
#: venv name -> pip requirements
VENVS = {"faust": ["faust-streaming", "rocksdict"], "quix": ["quixstreams[avro]"]}
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


#: (topic, key, value (None: a tombstone), timestamp ms)
Record = tuple[str, bytes, bytes | None, int]


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


async def output_reached(
    bootstrap: str, topic: str, partitions: int, expected: int, quiet: float = 3.0
) -> None:
    """Until ``topic`` holds ``expected`` records or has not grown for ``quiet`` seconds."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        last, quiet_since = -1, time.monotonic()
        while True:
            count = sum((await consumer.end_offsets(tps)).values())
            if count >= expected:
                return
            if count != last:
                last, quiet_since = count, time.monotonic()
            elif time.monotonic() - quiet_since > quiet:
                return
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()


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
        got = read_marks(path)
        measured.marks.append({"path": path.name, "marks": len(got)})
        first = next((m for m in got if m[0] == "FIRST"), None)
        if first is None:
            continue  # this process got no input at all
        last_mark = max(got, key=lambda m: m[1])
        firsts.append(first[1])
        if settled_at is not None and end_cpu is not None:
            ends.append(settled_at)
            cpu += end_cpu - first[2]
            continue
        ends.append(
            max(m[1] for m in got if m[0] == "PDONE")
            if any(m[0] == "PDONE" for m in got)
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


# --------------------------------------------------------------------------- systems


def streamjoin_command(
    app: str, state_dir: Path, name: str, python: Sequence[str] = ()
) -> list[str]:
    """A streamjoin worker running ``app`` (``module:attribute``), profiled on request
    (:func:`py_spy_prefix`, :func:`cprofile_args`); ``python``: its interpreter prefix
    (this one by default)."""
    return [
        *py_spy_prefix(name),
        *(python or [sys.executable]),
        *cprofile_args(name),
        "-m",
        "streamjoin.cli",
        "worker",
        "-A",
        app,
        "--state-dir",
        str(state_dir),
        "--loglevel",
        "warning",
    ]


KSTREAMS_DIR = ROOT / "benchmarks" / "kstreams"


def kstreams_build(rebuild: bool, app: str) -> tuple[str | None, str]:
    """The classpath of the Kafka Streams apps (``benchmarks/kstreams``, built with Maven
    when ``app``'s class is missing or older than a source), or None and why."""
    classes = KSTREAMS_DIR / "target" / "classes"
    lib = KSTREAMS_DIR / "target" / "lib"
    built = classes / "streamjoin" / "bench" / f"{app}.class"
    sources = [KSTREAMS_DIR / "pom.xml", *(KSTREAMS_DIR / "src").rglob("*.java")]
    stale = not built.exists() or any(s.stat().st_mtime > built.stat().st_mtime for s in sources)
    if rebuild or stale:
        mvn = shutil.which("mvn")
        if mvn is None:
            return None, "no mvn on PATH"
        say("building benchmarks/kstreams with Maven")
        done = subprocess.run(
            [mvn, "-q", "-B", "clean", "package"],
            cwd=KSTREAMS_DIR,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            return None, f"mvn package failed: {(done.stdout + done.stderr)[-2000:]}"
    return f"{classes}:{lib}/*", ""


def kstreams_version() -> str:
    jars = sorted((KSTREAMS_DIR / "target" / "lib").glob("kafka-streams-*.jar"))
    return jars[0].stem.removeprefix("kafka-streams-") if jars else "?"


def kstreams_command(
    app: str, classpath: str, java_options: Sequence[str], params: dict[str, Any]
) -> tuple[list[str], dict[str, str]]:
    """The Kafka Streams app ``streamjoin.bench.<app>`` with ``--name value`` per param."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    flat = [x for k, v in params.items() for x in (f"--{k}", str(v))]
    return ["java", *java_options, "-cp", classpath, f"streamjoin.bench.{app}", *flat], env


# --------------------------------------------------------------------------- rounds


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


#: the check counts that tell the size of the answer, not a fault (every other must be 0)
SIZES = ("expected", "optional", "emitted")


@dataclass
class Launch:
    """One round of one system: its processes, and how their answer is awaited and checked
    (both given the processes' marks files)."""

    commands: list[tuple[list[str], dict[str, str]]]
    check: Callable[[list[Path]], Awaitable[dict[str, int]]]
    #: awaited once every partition is done (``run_to_completion``'s ``settle``)
    settle: Callable[[list[Path]], Awaitable[float | None]] | None = None


async def run_rounds(
    args: Any,
    systems: Sequence[str],
    ready: dict[str, tuple[str, str]],
    launch: Callable[[str, int, str], Launch],
    events: int,
    last: dict[tuple[str, int], int],
    workdir: Path,
    progress: Callable[[str], None],
) -> list[WorkloadResult]:
    """Every system once a round (``args.repeat`` rounds, interleaved), each run to
    completion (``args.timeout`` seconds at most) and checked.

    ``ready``: system -> (its version, why it cannot run: empty when it can);
    ``launch(system, round, name)``: the processes of that run, named ``name``;
    ``events``: the input records the per-event figures divide by;
    ``last``: the last offset of every partition the processes must get through."""
    results: list[WorkloadResult] = []
    for r, s in ((r, s) for r in range(args.repeat) for s in systems):
        result = WorkloadResult(system=s, status="skipped", round=r, events=events)
        results.append(result)
        result.version, why_not = ready[s]
        if why_not:
            result.detail = why_not
            progress(f"{s}: skipped: {why_not}")
            continue
        name = f"{s}-{r}"
        run = launch(s, r, name)
        marks = [workdir / f"{name}-{i}.marks" for i in range(len(run.commands))]
        logs = [workdir / f"{name}-{i}.log" for i in range(len(run.commands))]
        result.processes = len(run.commands)
        progress(f"{s}: starting {len(run.commands)} process(es)")
        settle = None if run.settle is None else functools.partial(run.settle, marks)
        try:
            measured = await run_to_completion(
                run.commands, marks, logs, last, args.timeout, progress, settle
            )
        except Exception as exc:  # report and go on with the next system
            result.status = "failed"
            result.detail = f"{type(exc).__name__}: {exc}\n{log_tail(logs[0])}"
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
        result.events_per_s = events / measured.seconds
        result.cpu_us_per_event = 1e6 * (measured.cpu_seconds or 0) / events
        result.check = await run.check(marks)
        result.correct = all(v == 0 for k, v in result.check.items() if k not in SIZES)
        result.status = "ok" if result.correct else "wrong"
        progress(f"{s}: {result.status} {result.check}")
    return results


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


def machine() -> str:
    """The report head's description of this machine and how busy it is."""
    return (
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs; load average {load_average()}"
    )


def rounds_report(
    command: str, head: str, repeat: int, results: list[WorkloadResult], **extra: Any
) -> dict[str, Any]:
    """The JSON report of :func:`run_rounds`' ``results``: every run under ``runs``, each
    system's median one under ``results``."""
    return {
        "command": command,
        "head": head,
        **extra,
        "repeat": repeat,
        "results": [asdict(x) for x in median_results(results)],
        "runs": [asdict(x) for x in results],
    }


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value and reference else None


def _verdict(r: WorkloadResult) -> str:
    bad = [f"{v} {k}" for k, v in r.check.items() if v and k not in SIZES]
    return "yes" if r.correct else "NO: " + ", ".join(bad)


def _cpu_times(r: WorkloadResult, ref: WorkloadResult | None) -> str:
    """``x by cpu``: in parentheses when the answer is wrong."""
    x = _ratio(r.cpu_seconds, ref.cpu_seconds if ref and ref is not r else None)
    if x is None:
        return ""
    return f"{x:.2f}x" if r.correct else f"({x:.2f}x)"


def _cpu_x(r: WorkloadResult, ref: WorkloadResult | None) -> str:
    x = _ratio(r.cpu_seconds, ref.cpu_seconds if ref and ref is not r else None)
    return "" if x is None else f"{x:.2f}"


def _rss_x(r: WorkloadResult, ref: WorkloadResult | None) -> str:
    if ref is None or ref is r or not ref.cpu_seconds:
        return ""
    x = _ratio(r.peak_rss_mb, ref.peak_rss_mb)
    return "" if x is None else f"{x:.2f}"


#: a table column: (a run, the run it is compared with or None) -> the cell
Cell = Callable[[WorkloadResult, WorkloadResult | None], str]

COLUMNS: dict[str, Cell] = {
    "system": lambda r, _: r.system,
    "version": lambda r, _: r.version,
    "procs": lambda r, _: str(r.processes),
    "startup s": lambda r, _: f"{r.startup_seconds or 0:.2f}",
    "seconds": lambda r, _: f"{r.seconds or 0:.2f}",
    "events/s": lambda r, _: f"{r.events_per_s or 0:,.0f}",
    "cpu s": lambda r, _: f"{r.cpu_seconds or 0:.2f}",
    "cpu µs/event": lambda r, _: f"{r.cpu_us_per_event or 0:.1f}",
    "x by cpu": _cpu_times,
    "cpu x KS": _cpu_x,
    "peak RSS MB": lambda r, _: "" if r.peak_rss_mb is None else f"{r.peak_rss_mb:.0f}",
    "RSS x KS": _rss_x,
    "correct?": lambda r, _: _verdict(r),
}
#: the columns a run without figures shows (the others blank, its status last)
LABELS = ("system", "version", "procs")
#: the columns of a comparison with Kafka Streams
KSTREAMS_COLUMNS = (
    "system",
    "version",
    "seconds",
    "events/s",
    "cpu s",
    "cpu µs/event",
    "cpu x KS",
    "peak RSS MB",
    "RSS x KS",
    "correct?",
)


def ratio_rows(
    results: Sequence[WorkloadResult], columns: Sequence[str], compared_with: Callable[[str], str]
) -> list[tuple[str, ...]]:
    """The table's rows, the header first; ratios are against ``compared_with(system)``'s
    result when that one is correct."""
    by_system = {r.system: r for r in results}
    rows: list[tuple[str, ...]] = [tuple(columns)]
    for r in results:
        if r.seconds is None or r.cpu_seconds is None:
            labels = [COLUMNS[c](r, None) if c in LABELS else "" for c in columns[:-1]]
            rows.append((*labels, r.status))
            continue
        ref = by_system.get(compared_with(r.system))
        ref = ref if ref is not None and ref.correct else None
        rows.append(tuple(COLUMNS[c](r, ref) for c in columns))
    return rows


def results_table(
    report: dict[str, Any],
    columns: Sequence[str],
    compared_with: Callable[[str], str],
    notes: Sequence[str] = (),
    rounds_by: str = "cpu µs/event",
) -> str:
    """The report as a text table of its median runs, then ``notes``, each system's rounds
    (``rounds_by``: "cpu µs/event" or "seconds") and why a run has no figures."""
    results = [WorkloadResult(**r) for r in report["results"]]
    rows = ratio_rows(results, columns, compared_with)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = list(notes)
    runs = [WorkloadResult(**r) for r in report["runs"]]
    if report["repeat"] > 1:
        for system in dict.fromkeys(r.system for r in runs):
            listed = ", ".join(_round_figures(r, rounds_by) for r in runs if r.system == system)
            unit = "" if rounds_by == "seconds" else f" ({rounds_by})"
            out.append(f"{system} rounds{unit}: {listed}")
    for r in runs:
        if r.status in ("skipped", "failed", "timeout") and r.detail:
            out.append(f"{r.system} round {r.round}: {r.status}: {r.detail.splitlines()[0]}")
    return "\n".join([report["head"], "", *lines, "", *out])


def _round_figures(r: WorkloadResult, rounds_by: str) -> str:
    if rounds_by == "seconds":
        if r.seconds is None or r.cpu_seconds is None:
            return r.status
        return f"{r.seconds:.2f}s/{r.cpu_seconds:.2f} cpu s"
    return r.status if r.cpu_us_per_event is None else f"{r.cpu_us_per_event:.1f}"


def bench_arguments(
    parser: Any,
    *,
    events: int,
    keys: int,
    systems: Sequence[str],
    default: str,
    timeout: float,
    keys_help: str = "distinct keys",
) -> None:
    """The options every benchmark that runs systems in rounds has."""
    parser.add_argument("--events", type=int, default=events, help="input events")
    parser.add_argument("--keys", type=int, default=keys, help=keys_help)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    parser.add_argument(
        "--systems",
        default=default,
        help=f"comma-separated, in run order, from {','.join(systems)}",
    )
    parser.add_argument("--bootstrap", help="reuse a running loopback broker (HOST:PORT)")
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per system")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, state)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def kstreams_arguments(parser: Any, commit_ms: int | None = None) -> None:
    """The Kafka Streams app's options; ``commit_ms``: also ``--kstreams-commit-ms``, with
    that default (the commit interval of the streamjoin side of the benchmark)."""
    parser.add_argument("--rebuild", action="store_true", help="build the Kafka Streams app again")
    parser.add_argument(
        "--kstreams-java-options",
        default="",
        help="JVM options of the Kafka Streams app (default: none, the JVM's own heap sizing)",
    )
    if commit_ms is not None:
        parser.add_argument(
            "--kstreams-commit-ms",
            type=int,
            default=commit_ms,
            help="Kafka Streams' commit.interval.ms (its own default: 30000)",
        )


def venv_arguments(parser: Any) -> None:
    parser.add_argument("--venv-root", default=str(VENV_ROOT))
    parser.add_argument("--no-install", action="store_true", help="never create venvs")


def chosen_systems(args: Any, known: Sequence[str]) -> list[str]:
    """``--systems`` as a list, each one checked against ``known``."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for s in systems:
        if s not in known:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(known)}")
    return systems


def bench_main(
    args: Any,
    bench: str,
    run: Callable[[str, Path], Coroutine[Any, Any, dict[str, Any]]],
    table: Callable[[dict[str, Any]], str],
) -> int:
    """``run(bootstrap, workdir)`` on a broker (``args.bootstrap`` or a fresh one), print
    its report (JSON or ``table``); exit 1 when a streamjoin run's answer is wrong."""
    import json
    import tempfile

    from benchmarks.broker import broker

    workdir = Path(tempfile.mkdtemp(prefix=f"streamjoin-{bench}-"))
    try:
        with broker(args.bootstrap, sayer(bench)) as bootstrap:
            report = asyncio.run(run(bootstrap, workdir))
    finally:
        if args.keep:
            say(f"work dir kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else table(report))
    ours = [r for r in report["runs"] if r["system"].startswith("streamjoin")]
    return 0 if all(r["correct"] for r in ours) else 1


# --------------------------------------------------------------------------- workloads


#: systems of the workload benchmarks; "streamjoin-2w" is two streamjoin worker processes,
#: "kstreams" the workload's Kafka Streams app (``WorkloadSpec.kstreams_app``);
#: "streamjoin-str" decodes the window count's values as UTF-8 strings instead of JSON,
#: the work of the Kafka Streams peer (``Serdes.String()``: the count never reads them)
WORKLOAD_SYSTEMS = (
    "streamjoin",
    "streamjoin-take",
    "streamjoin-str",
    "streamjoin-2w",
    "streamjoin-base",
    "kstreams",
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
        if system == "streamjoin-str":
            if workload != "count":
                raise SystemExit("streamjoin-str is a window count system (its values unread)")
            env["BENCH_VALUES"] = "str"
        workers = 2 if system == "streamjoin-2w" else 1
        python_cmd = baseline_worker(env) if system == "streamjoin-base" else []
        app = "benchmarks.workload_streamjoin_app:app"
        return [
            (streamjoin_command(app, workdir / f"state-{name}-{i}", f"{name}-{i}", python_cmd), env)
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


WORKLOAD_COLUMNS = (
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


def workload_table(report: dict[str, Any]) -> str:
    """The report as a text table, with the ratios against one streamjoin worker."""
    results = {r["system"]: WorkloadResult(**r) for r in report["results"]}
    notes = [
        "cpu s: user + sys time of the system's process(es), all threads, from the first input",
        "event to the last partition's last offset; x by cpu: that system's cpu s / streamjoin's",
        "(in parentheses when its answer is wrong). peak RSS: the largest VmHWM of its processes.",
    ]
    ours, two = results.get("streamjoin"), results.get("streamjoin-2w")
    if ours and two and ours.correct and two.correct and ours.seconds and two.seconds:
        notes.append(
            f"2 workers vs 1: {ours.seconds / two.seconds:.2f}x events/s, cpu per event "
            f"{two.cpu_us_per_event or 0:.1f} vs {ours.cpu_us_per_event or 0:.1f} µs"
        )
    return results_table(
        report, WORKLOAD_COLUMNS, lambda _: "streamjoin", notes, rounds_by="seconds"
    )


def workload_arguments(parser: Any, *, events: int, keys: int) -> None:
    """The options window_count.py and enrichment.py share."""
    bench_arguments(
        parser,
        events=events,
        keys=keys,
        systems=WORKLOAD_SYSTEMS,
        default="streamjoin,kstreams,quix,faust",
        timeout=900,
    )
    parser.add_argument(
        "--workers",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: also run two streamjoin worker processes (streamjoin-2w) and report scaling",
    )
    parser.add_argument(
        "--baseline-tree",
        help="source tree of an older commit that the streamjoin-base system runs "
        "(the before side of an A/B in one run; copy benchmarks/ into it)",
    )
    venv_arguments(parser)
    kstreams_arguments(parser, commit_ms=1000)


def workload_systems(args: Any) -> list[str]:
    """``--systems``, with ``streamjoin-2w`` after ``streamjoin`` for ``--workers 2``."""
    if getattr(args, "baseline_tree", None):
        os.environ[BASELINE_TREE] = str(Path(args.baseline_tree).resolve())
    systems = chosen_systems(args, WORKLOAD_SYSTEMS)
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
    #: the ``kstreams`` system: the class of ``benchmarks/kstreams`` that runs the workload
    #: and its parameters besides the topics, app id, state dir and commit interval
    kstreams_app: str = ""
    kstreams_params: dict[str, Any] = field(default_factory=dict)


def kstreams_workload_command(
    args: Any,
    spec: WorkloadSpec,
    classpath: str,
    bootstrap: str,
    group: str,
    topics: Topics,
    state_dir: Path,
) -> tuple[list[str], dict[str, str]]:
    """The Kafka Streams process of ``spec`` (``--kstreams-*`` options of ``args``)."""
    named = {"table": topics.table, "output": topics.output}
    params: dict[str, Any] = {
        "bootstrap": bootstrap,
        "app-id": group,
        "input": topics.input,
        **{k: v for k, v in named.items() if v},
        "state-dir": state_dir,
        "commit-ms": args.kstreams_commit_ms,
        **spec.kstreams_params,
    }
    java_options = args.kstreams_java_options.split()
    return kstreams_command(spec.kstreams_app, classpath, java_options, params)


async def run_workload(
    args: Any, spec: WorkloadSpec, bootstrap: str, workdir: Path
) -> dict[str, Any]:
    """Produce the records once, run every system (rounds interleaved), check each answer."""
    import uuid

    from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

    progress = sayer(spec.bench)
    systems = workload_systems(args)
    pythons: dict[str, tuple[Path | None, str]] = {}
    ready: dict[str, tuple[str, str]] = {}
    classpath: str | None = None
    for s in systems:
        venv = VENV_OF.get(s)
        if s == "kstreams" and not spec.kstreams_app:
            ready[s] = ("", f"no Kafka Streams app for {spec.bench}")
            continue
        if s == "kstreams":
            classpath, why_no_java = kstreams_build(args.rebuild, spec.kstreams_app)
            ready[s] = (kstreams_version() if classpath else "", why_no_java)
            continue
        if venv is None:
            base = s == "streamjoin-base"
            version = tree_commit(os.environ.get(BASELINE_TREE, "")) if base else None
            ready[s] = (version or streamjoin_version(), "")
            continue
        if venv not in pythons:
            pythons[venv] = venv_python(venv, Path(args.venv_root), not args.no_install)
        python, why = pythons[venv]
        ready[s] = ("", why) if python is None else (dist_version(python, DIST_OF[venv]), "")
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

    def launch(system: str, r: int, name: str) -> Launch:
        topics = Topics(
            input=names["input"],
            table=names.get("table"),
            output=outputs[(system, r)] if spec.uses_output else None,
        )
        venv = VENV_OF.get(system)
        python = pythons[venv][0] if venv else None
        if system == "kstreams":
            assert classpath is not None
            group, state_dir = f"{prefix}-{name}", workdir / f"state-{name}"
            commands = [
                kstreams_workload_command(
                    args, spec, classpath, bootstrap, group, topics, state_dir
                )
            ]
        else:
            commands = workload_commands(
                system,
                spec.workload,
                bootstrap,
                f"{prefix}-{name}",
                topics,
                python,
                workdir,
                name,
                args.partitions,
            )

        async def check(marks: list[Path]) -> dict[str, int]:
            return await spec.check(marks, topics, bootstrap)

        async def settle(marks: list[Path]) -> None:
            if spec.settle is not None:
                await spec.settle(marks, topics, bootstrap)

        return Launch(commands, check, settle if spec.settle is not None else None)

    results = await run_rounds(
        args, systems, ready, launch, len(spec.records), last_inputs, workdir, progress
    )
    return rounds_report(
        " ".join([Path(sys.executable).name, "-m", f"benchmarks.{spec.bench}", *sys.argv[1:]]),
        f"{spec.head}; {args.partitions} partitions; {machine()}",
        args.repeat,
        results,
        records=len(spec.records),
        produce_seconds=round(produce_s, 2),
    )


def workload_main(args: Any, spec: WorkloadSpec) -> int:
    """Run ``spec`` on a broker (``args.bootstrap`` or a fresh one), print the report."""
    return bench_main(
        args,
        spec.bench,
        functools.partial(run_workload, args, spec),
        workload_table,
    )
