"""Rebalance benchmark: what joins, leaves and crashes of workers cost a running group.

    .venv/bin/python -m benchmarks.rebalance [--protocol eager,cooperative] [--repeat 1]
        [--rate 1000] [--events join,leave,kill-restart] [--workdir DIR]
        [--bootstrap 127.0.0.1:PORT] [--json]

One run per protocol (and per ``--repeat`` round, protocols interleaved):

1. Fresh topics: a 12-partition source, and the tracker app's table changelog. A producer in
   this process sends ``--rate`` events/s, keyed over ``--keys`` keys (every partition gets
   traffic), from before the first worker starts to the end of the run.
2. Three workers of ``tests/integration/apps/tracker.py`` (``streamjoin worker`` processes,
   static members ``w1``..``w3``, 1 standby replica, RocksDB state) count events per key and
   trace every event they process (worker, pid, partition, offset, time, count) to a file.
3. After ``--quiet`` seconds of steady processing, the events (``--events``, by default
   join, leave, kill-restart) run in order, each once the group has settled from the one
   before and stayed quiet for ``--quiet`` seconds:

   * ``join``: a 4th worker starts.
   * ``leave``: one worker gets SIGTERM (a clean stop; a static member sends no LeaveGroup,
     so the group notices it when its session times out).
   * ``kill-restart``: one worker gets kill -9 and is started again ``--restart-delay``
     seconds later with the same ``--instance-id`` (and state directory).
   * ``kill-new-id``: the same, restarted under a new instance id and a new state directory
     (its old static membership lingers until the session timeout).

   Leaves and kills pick the second worker in start order, never ``w1`` (the first member,
   usually the group's leader).

   An event has settled when the group is Stable with the expected members, every
   partition has been processed since the event by a live process, and every expected
   worker processes some partition; its window ends ``--settle`` seconds later.
4. The producer stops; the workers finish the input and stop. The trace is analysed by
   ``benchmarks/rebalance_analysis.py`` (where every term below is defined):

   * latency: from the event to the last partition that stalled (a gap longer than
     ``--stall-factor`` x the largest gap of any partition in the quiet window before it,
     beginning before the group settled and its last assignment was logged) processing
     again; ``logs``: from the event to the last "assigned" line of any worker.
   * unmoved gap: the largest gap of each partition processed by the same process before
     and after the event (p50/p99/max over those partitions) against the same partitions'
     largest gap in the quiet window before it.
   * moved: partitions processed by another process after the event (restarted: by a new
     process of the same worker); revoke->resume is the time from the old process's last
     processing to the new one's first.
   * restored: changelog records the workers' restores replayed in the window (their
     "restored ..." log lines), and that as a share of those partitions' changelogs.
   * duplicates: processings in the window of offsets processed before.
   * For the whole run: overlaps (two processes processing one partition at the same
     time), duplicates, produced offsets never processed, keys counted twice (allowed
     after a crash: at-least-once) and keys that lost counts (never allowed), and the CPU
     time of the workers and of this process (the producer).

Each run sets the workers' ``App(rebalance_protocol=...)``. Logs, traces and state stay
in ``--workdir`` (a temporary directory otherwise, removed at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

import streamjoin
from benchmarks.broker import broker
from benchmarks.rebalance_analysis import (
    TP,
    TRACE_SUFFIX,
    EventStats,
    LogEvent,
    Processed,
    Spread,
    analyze_event,
    by_partition,
    count_errors,
    duplicates,
    log_events,
    missing,
    overlaps,
    read_trace_dir,
    runs,
    summarize_logs,
)
from streamjoin.runtime.group.group_info import describe_group
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics
from tests.integration.support import Workers, tracker_workers

#: what ``--protocol`` accepts: the rebalance protocol, "-ha" adding high availability
#: (KIP-441 warmups: tasks stay on caught-up members while their new owner warms up)
PROTOCOLS = ("eager", "cooperative", "eager-ha", "cooperative-ha")
EVENTS = ("join", "leave", "kill-restart", "kill-new-id")
#: the issue's sequence; kill-new-id breaks the eager group today (the leader's SyncGroup
#: fails with FENCED_INSTANCE_ID, see docs/benchmarks.md#rebalancing): asked for apart
DEFAULT_EVENTS = ("join", "leave", "kill-restart")
#: the tracker app's table (its changelog is ``<app id>-counts-changelog``)
TABLE = "counts"


def say(message: str) -> None:
    print(f"[rebalance-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def check_protocols(protocols: list[str]) -> None:
    """SystemExit for an unknown protocol."""
    for p in protocols:
        if p not in PROTOCOLS:
            raise SystemExit(f"--protocol: unknown protocol {p!r}; choose from {PROTOCOLS}")


# --------------------------------------------------------------------------- input


class SteadyProducer:
    """Sends ``rate`` events/s to ``topic`` (keys drawn from ``keys``) until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: float, keys: int, seed: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.rate = rate
        self.keys = [f"k{i}".encode() for i in range(keys)]
        self.rng = random.Random(seed)
        self.sent = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        self._task = asyncio.create_task(self._run(producer))

    async def _run(self, producer: AIOKafkaProducer) -> None:
        pending: list[asyncio.Future[Any]] = []
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self.rate)
                while self.sent < due:
                    key = self.rng.choice(self.keys)
                    pending.append(await producer.send(self.topic, b"1", key=key))
                    self.sent += 1
                for fut in [f for f in pending if f.done()]:
                    fut.result()  # raises a failed send
                pending = [f for f in pending if not f.done()]
                await asyncio.sleep(0.01)
            await producer.flush()
            for fut in pending:
                await fut
        finally:
            await producer.stop()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


async def wait_leaders(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> None:
    """Until every partition of a new topic has a leader (no produce retries at the start)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await end_offsets(bootstrap, topic, partitions)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[TP, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {(tp.topic, tp.partition): o for tp, o in ends.items()}
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------- watching


class TraceTail:
    """Follows the trace files as workers write them: the last record of each partition."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.positions: dict[Path, int] = {}
        self.last: dict[TP, Processed] = {}
        self.highest: dict[TP, int] = {}

    def poll(self) -> None:
        for path in self.directory.glob(f"*{TRACE_SUFFIX}"):
            with path.open("rb") as f:
                f.seek(self.positions.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.positions[path] = self.positions.get(path, 0) + len(complete)
            for line in complete.decode().splitlines():
                r = Processed.from_line(line)
                if r.tp not in self.last or r.time >= self.last[r.tp].time:
                    self.last[r.tp] = r
                self.highest[r.tp] = max(self.highest.get(r.tp, -1), r.offset)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a live process has used so far; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- one run


@dataclass
class Settings:
    rate: float
    partitions: int
    workers: int
    standbys: int
    keys: int
    quiet: float
    settle: float
    restart_delay: float
    session_timeout_ms: int
    commit_interval: float
    stall_factor: float
    event_timeout: float
    events: list[str]


@dataclass
class EventRecord:
    name: str
    detail: str
    t: float
    settled: float = math.nan
    end: float = math.nan
    changelog_ends: dict[int, int] = field(default_factory=dict)


@dataclass
class RunRecord:
    """What a run observed, saved in report.json (``--reanalyse`` starts from it)."""

    protocol: str
    round: int
    app_id: str
    source: str
    dir: str
    error: str | None
    sent: int
    produced: dict[int, int]  #: partition -> end offset of the source
    events: list[EventRecord]
    worker_cpu: dict[str, float]  #: "<worker>.<pid>" -> CPU seconds
    bench_cpu: float  #: this process's CPU seconds while the workers ran (the producer)
    loadavg: list[float]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        events = [
            EventRecord(
                **{**e, "changelog_ends": {int(p): o for p, o in e["changelog_ends"].items()}}
            )
            for e in data["events"]
        ]
        produced = {int(p): o for p, o in data["produced"].items()}
        return cls(**{**data, "events": events, "produced": produced})


class GroupRun:
    """One protocol's run: the workers, the producer and the events, then the analysis."""

    def __init__(
        self, bootstrap: str, protocol: str, round_: int, s: Settings, workdir: Path
    ) -> None:
        self.bootstrap = bootstrap
        self.protocol = protocol
        self.round = round_
        self.s = s
        self.dir = workdir / f"round{round_}-{protocol}"
        run_id = f"rb-{protocol}-{round_}-{uuid.uuid4().hex[:6]}"
        extra = {
            "SJT_STANDBYS": str(s.standbys),
            "SJT_SESSION_TIMEOUT_MS": str(s.session_timeout_ms),
            "SJT_COMMIT_INTERVAL": str(s.commit_interval),
            "SJT_REBALANCE_PROTOCOL": protocol.removesuffix("-ha"),
            "SJT_HIGH_AVAILABILITY": "1" if protocol.endswith("-ha") else "0",
        }
        self.workers: Workers = tracker_workers(
            bootstrap,
            lambda prefix: f"{run_id}-{prefix}",
            self.dir,
            s.partitions,
            **extra,
        )
        self.app_id = self.workers.env["SJT_APP_ID"]
        self.source = self.workers.env["SJT_SOURCE"]
        self.changelog = f"{self.app_id}-{TABLE}-changelog"
        self.tail = TraceTail(self.dir / "trace")
        self.events: list[EventRecord] = []
        self.live: list[str] = []
        self.next_worker = 1
        self.cpu: dict[str, float] = {}

    # -- workers

    def start_worker(self, name: str | None = None) -> str:
        if name is None:
            name = f"w{self.next_worker}"
            self.next_worker += 1
        self.workers.start(name)
        self.live.append(name)
        return name

    async def stop_worker(self, name: str, sig: int) -> None:
        proc = self.workers.procs[name]
        self.cpu[f"{name}.{proc.pid}"] = cpu_seconds(proc.pid)
        self.live.remove(name)
        await asyncio.to_thread(self.workers.stop, name, sig)

    async def settle(self, since: float, what: str) -> float:
        """Wait until the group works again with exactly ``self.live``: Stable with those
        members, and every partition processed since ``since`` by a live process."""
        deadline = time.monotonic() + self.s.event_timeout
        state = "?"
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            self.tail.poll()
            for name, proc in self.workers.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited ({proc.returncode}) during {what}")
            live = {(name, proc.pid) for name, proc in self.workers.procs.items()}
            last = self.tail.last.values()
            if not (
                len(self.tail.last) == self.s.partitions
                and all(r.time > since and r.member in live for r in last)
                and {r.worker for r in last} == set(self.live)
            ):
                continue
            with contextlib.suppress(Exception):
                info = await describe_group(self.bootstrap, self.app_id)
                state = info.state
                if state == "Stable" and {m.instance_id for m in info.members} == set(self.live):
                    return time.time()
        errors = [
            f"{name}: {line[:300]}"
            for name in self.live
            for line in self.workers.log_of(name).splitlines()
            if "ERROR" in line
        ]
        raise RuntimeError(
            f"{what}: the group did not settle within {self.s.event_timeout:.0f}s (group "
            f"{state}, partitions last processed by "
            f"{sorted({r.worker for r in self.tail.last.values()})}, expected {self.live}); "
            f"errors logged: {errors[-6:] or 'none'}"
        )

    # -- events

    async def event(self, name: str) -> EventRecord:
        actions: dict[str, Callable[[], Awaitable[str]]] = {
            "join": self._join,
            "leave": self._leave,
            "kill-restart": self._kill_restart,
            "kill-new-id": self._kill_new_id,
        }
        record = EventRecord(name, "", time.time())
        record.detail = await actions[name]()
        say(f"{self.protocol}: {name}: {record.detail}")
        record.settled = await self.settle(record.t, name)
        # restores read up to the changelog's end when they start, before this
        ends = await end_offsets(self.bootstrap, self.changelog, self.s.partitions)
        record.changelog_ends = {p: o for (_, p), o in ends.items()}
        await asyncio.sleep(self.s.settle)
        record.end = time.time()
        say(f"{self.protocol}: {name}: settled after {record.settled - record.t:.1f}s")
        return record

    async def _join(self) -> str:
        return f"{self.start_worker()} started"

    async def _leave(self) -> str:
        name = self.live[1]
        await self.stop_worker(name, signal.SIGTERM)
        return f"{name} stopped (SIGTERM)"

    async def _kill_restart(self) -> str:
        name = self.live[1]
        await self.stop_worker(name, signal.SIGKILL)
        await asyncio.sleep(self.s.restart_delay)
        self.start_worker(name)
        return f"{name} killed, restarted as {name} after {self.s.restart_delay:.0f}s"

    async def _kill_new_id(self) -> str:
        name = self.live[1]
        await self.stop_worker(name, signal.SIGKILL)
        await asyncio.sleep(self.s.restart_delay)
        new = self.start_worker()
        return f"{name} killed, restarted as {new} after {self.s.restart_delay:.0f}s"

    # -- the run

    async def run(self) -> dict[str, Any]:
        s = self.s
        self.dir.mkdir(parents=True, exist_ok=True)
        await ensure_topics(self.bootstrap, [TopicSpec(self.source, s.partitions)])
        await wait_leaders(self.bootstrap, self.source, s.partitions)
        producer = SteadyProducer(self.bootstrap, self.source, s.rate, s.keys, self.round)
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        error = None
        produced: dict[TP, int] = {}
        try:
            await producer.start()
            started = time.time()
            for _ in range(s.workers):
                self.start_worker()
            await self.settle(started, "start")
            say(f"{self.protocol}: {len(self.live)} workers processing; steady for {s.quiet:.0f}s")
            for name in s.events:
                await asyncio.sleep(s.quiet)
                self.events.append(await self.event(name))
        except RuntimeError as exc:
            error = str(exc)
            say(f"{self.protocol}: FAILED: {error}")
        finally:
            await producer.stop()
            cpu_after = resource.getrusage(resource.RUSAGE_SELF)
            produced = await end_offsets(self.bootstrap, self.source, s.partitions)
            if error is None:
                error = await self._drain(produced)
            for name in list(self.live):
                with contextlib.suppress(Exception):
                    await self.stop_worker(name, signal.SIGTERM)
            self.workers.close()
        bench_cpu = (
            cpu_after.ru_utime - cpu_before.ru_utime + cpu_after.ru_stime - cpu_before.ru_stime
        )
        record = RunRecord(
            self.protocol,
            self.round,
            self.app_id,
            self.source,
            str(self.dir),
            error,
            producer.sent,
            {p: end for (_, p), end in produced.items()},
            self.events,
            self.cpu,
            bench_cpu,
            [round(x, 2) for x in os.getloadavg()],
        )
        return analyse_run(record, self.s)

    async def _drain(self, produced: dict[TP, int]) -> str | None:
        """Wait for the workers to process every produced event (or say what is left)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.tail.poll()
            if all(self.tail.highest.get(tp, -1) >= end - 1 for tp, end in produced.items()):
                return None
            await asyncio.sleep(0.5)
        behind = {
            tp[1]: end - 1 - self.tail.highest.get(tp, -1)
            for tp, end in produced.items()
            if self.tail.highest.get(tp, -1) < end - 1
        }
        return f"the workers did not finish the input within 60 s (behind: {behind})"


def analyse_run(run: RunRecord, s: Settings) -> dict[str, Any]:
    """The report of one run, from what it saved: its record, trace files and worker logs."""
    directory = Path(run.dir)
    records = read_trace_dir(directory / "trace")
    parts = by_partition(records)
    logs: list[LogEvent] = []
    for path in sorted(directory.glob("*.log")):
        logs.extend(log_events(path.stem, path.read_text(errors="replace")))
    events = []
    for e in run.events:
        summary = summarize_logs(logs, e.t, e.end)
        # the rebalance is over once the group settled and the last assignment was made
        cutoff = max(e.settled, e.t + (summary.last_assigned or 0.0))
        stats = analyze_event(parts, e.t, e.end, s.quiet, s.stall_factor, cutoff=cutoff)
        changelog = sum(e.changelog_ends.get(p, 0) for _, p in summary.restored_partitions)
        events.append(
            {
                "event": e.name,
                "detail": e.detail,
                "settled_s": e.settled - e.t,
                "window_s": e.end - e.t,
                **event_row(stats),
                "log_latency_s": summary.last_assigned,
                "log_assignments": summary.assignments,
                "rebalances": summary.rebalances,
                "restores_planned": summary.restores_planned,
                "restored": summary.restored,
                "restored_share": summary.restored / changelog if changelog else None,
                "restore_max_s": summary.restore_seconds,
            }
        )
    found = overlaps(runs(records))
    dups = duplicates(records)
    absent = missing(records, {(run.source, p): (0, end) for p, end in run.produced.items()})
    wrong = count_errors(records).values()
    return {
        "protocol": run.protocol,
        "round": run.round,
        "app_id": run.app_id,
        "dir": run.dir,
        "error": run.error,
        "produced": run.sent,
        "processed": len(records),
        "events": events,
        "overlaps": len(found),
        "overlap_max_s": max((o.seconds for o in found), default=0.0),
        "overlap_examples": [
            f"{o.tp[1]}: {o.a.member[0]}/{o.a.member[1]} and {o.b.member[0]}/{o.b.member[1]} "
            f"for {o.seconds:.3f}s"
            for o in found[:5]
        ],
        "duplicates": sum(len(d.times) - 1 for d in dups),
        "missing": sum(absent.values()),
        "missing_by_partition": {str(tp[1]): n for tp, n in absent.items()},
        # at-least-once: a crash may count events twice, but never lose a count
        "keys_counted_twice": sum(1 for c, n in wrong if c > n),
        "keys_with_lost_counts": sum(1 for c, n in wrong if c < n),
        "worker_cpu_s": round(sum(run.worker_cpu.values()), 2),
        "bench_cpu_s": round(run.bench_cpu, 2),
        "loadavg_at_end": run.loadavg,
        "record": asdict(run),
    }


def event_row(stats: EventStats) -> dict[str, Any]:
    """The numbers of one event that go into the report (seconds)."""
    moved = {**{tp: "moved" for tp in stats.moved}, **{tp: "restarted" for tp in stats.restarted}}
    handovers = [stats.handover[tp] for tp in moved if tp in stats.handover]
    return {
        "latency_s": stats.latency,
        "threshold_s": stats.threshold,
        "stalled": len(stats.stalled),
        "partitions": len(stats.stayed) + len(moved) + len(stats.unprocessed),
        "unmoved": len(stats.stayed),
        "unmoved_gap": asdict(stats.stayed_gap),
        "unmoved_normal": asdict(stats.stayed_normal),
        "normal": asdict(stats.normal),
        "moved": len(stats.moved),
        "restarted": len(stats.restarted),
        "unprocessed": len(stats.unprocessed),
        "handover": asdict(Spread.of(handovers)),
        "duplicates": stats.duplicates,
        "records": stats.records,
    }


# --------------------------------------------------------------------------- report


def ms(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 1000:,.0f}"


def sec(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    return "never" if math.isinf(x) else f"{x:.2f}"


def table(report: dict[str, Any]) -> str:
    head = (
        "protocol",
        "round",
        "event",
        "latency s",
        "logs s",
        "stalled",
        "unmoved gap p50/p99/max ms",
        "normal p50/max ms",
        "moved",
        "revoke->resume p50/max s",
        "restored",
        "dups",
        "rebalances",
    )
    rows = [head]
    for run in report["runs"]:
        for e in run["events"]:
            g, n, h = e["unmoved_gap"], e["unmoved_normal"], e["handover"]
            share = e["restored_share"]
            rows.append(
                (
                    run["protocol"],
                    str(run["round"]),
                    e["event"],
                    sec(e["latency_s"]),
                    sec(e["log_latency_s"]),
                    f"{e['stalled']}/{e['partitions']}",
                    f"{ms(g['p50'])}/{ms(g['p99'])}/{ms(g['max'])} ({g['n']})",
                    f"{ms(n['p50'])}/{ms(n['max'])}",
                    f"{e['moved']}+{e['restarted']}r" if e["restarted"] else str(e["moved"]),
                    f"{sec(h['p50'])}/{sec(h['max'])}",
                    f"{e['restored']:,}" + (f" ({share:.0%})" if share is not None else ""),
                    f"{e['duplicates']:,}",
                    str(e["rebalances"]),
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    for run in report["runs"]:
        lines.append(
            f"{run['protocol']} round {run['round']}: {run['processed']:,} processings of "
            f"{run['produced']:,} events; overlaps {run['overlaps']} "
            f"(max {run['overlap_max_s']:.3f}s), duplicates {run['duplicates']:,}, "
            f"missing {run['missing']:,}, keys counted twice {run['keys_counted_twice']}, "
            f"keys with lost counts {run['keys_with_lost_counts']}; "
            f"CPU: workers {run['worker_cpu_s']:.1f}s, producer+bench {run['bench_cpu_s']:.1f}s; "
            f"load {run['loadavg_at_end']}" + (f"; ERROR: {run['error']}" if run["error"] else "")
        )
    if len({r["round"] for r in report["runs"]}) > 1:
        lines += ["", "medians over rounds:"]
        keys = sorted({(r["protocol"], e["event"]) for r in report["runs"] for e in r["events"]})
        for protocol, event in keys:
            es = [
                e
                for r in report["runs"]
                if r["protocol"] == protocol
                for e in r["events"]
                if e["event"] == event
            ]
            lines.append(
                f"  {protocol:<11} {event:<12} latency {sec(med([e['latency_s'] for e in es]))}s, "
                f"unmoved gap max {ms(med([e['unmoved_gap']['max'] for e in es]))} ms, "
                f"revoke->resume max {sec(med([e['handover']['max'] for e in es]))}s, "
                f"restored {med([e['restored'] for e in es]):,.0f}, "
                f"duplicates {med([e['duplicates'] for e in es]):,.0f} ({len(es)} runs)"
            )
    return "\n".join(lines)


def med(values: list[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


# --------------------------------------------------------------------------- main


async def bench(args: argparse.Namespace, bootstrap: str, workdir: Path) -> dict[str, Any]:
    settings = Settings(
        rate=args.rate,
        partitions=args.partitions,
        workers=args.workers,
        standbys=args.standbys,
        keys=args.keys,
        quiet=args.quiet,
        settle=args.settle,
        restart_delay=args.restart_delay,
        session_timeout_ms=args.session_timeout_ms,
        commit_interval=args.commit_interval,
        stall_factor=args.stall_factor,
        event_timeout=args.event_timeout,
        events=args.events,
    )
    results = []
    for round_ in range(1, args.repeat + 1):
        for protocol in args.protocol:
            say(f"round {round_}: {protocol}")
            run = GroupRun(bootstrap, protocol, round_, settings, workdir)
            results.append(await run.run())
    return {
        "benchmark": "rebalance",
        "settings": asdict(settings),
        "streamjoin": streamjoin.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "runs": results,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rebalance", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--protocol", default="eager,cooperative", help="comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over all protocols")
    parser.add_argument("--rate", type=float, default=1000.0, help="input events/s")
    parser.add_argument(
        "--events",
        default=",".join(DEFAULT_EVENTS),
        help=f"comma-separated, in order, from {','.join(EVENTS)}",
    )
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--workers", type=int, default=3, help="workers before the events")
    parser.add_argument("--standbys", type=int, default=1, help="standby replicas")
    parser.add_argument("--keys", type=int, default=1200, help="distinct keys of the input")
    parser.add_argument("--quiet", type=float, default=10.0, help="steady seconds before events")
    parser.add_argument("--settle", type=float, default=5.0, help="window seconds after settling")
    parser.add_argument("--restart-delay", type=float, default=2.0, help="kill -9 to restart, s")
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    parser.add_argument("--commit-interval", type=float, default=1.0, help="the App's, seconds")
    parser.add_argument("--stall-factor", type=float, default=2.0)
    parser.add_argument("--event-timeout", type=float, default=90.0, help="seconds to settle")
    parser.add_argument("--bootstrap", help="use this loopback broker instead of starting one")
    parser.add_argument("--workdir", type=Path, help="keep logs, traces and state here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--reanalyse", type=Path, metavar="WORKDIR", help="report on a kept --workdir again"
    )
    args = parser.parse_args(argv)
    args.protocol = [p.strip() for p in args.protocol.split(",") if p.strip()]
    args.events = [e.strip() for e in args.events.split(",") if e.strip()]
    for e in args.events:
        if e not in EVENTS:
            parser.error(f"--events: unknown event {e!r}; choose from {','.join(EVENTS)}")
    if args.workers < 2 or args.repeat < 1 or args.rate <= 0:
        parser.error("--workers must be >= 2, --repeat >= 1 and --rate > 0")
    return args


def reanalyse(workdir: Path, stall_factor: float) -> dict[str, Any]:
    """The report of an earlier run kept in ``workdir``, analysed again (same settings but
    ``stall_factor``): for changing the analysis without running the group again."""
    report: dict[str, Any] = json.loads((workdir / "report.json").read_text())
    settings = Settings(**{**report["settings"], "stall_factor": stall_factor})
    report["settings"] = asdict(settings)
    report["runs"] = [
        analyse_run(RunRecord.from_json(run["record"]), settings) for run in report["runs"]
    ]
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        report = reanalyse(args.reanalyse, args.stall_factor)
        print(json.dumps(report, indent=2) if args.json else table(report))
        return 0
    check_protocols(args.protocol)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="streamjoin-rebalance-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with broker(args.bootstrap, say) as bootstrap:
            report = asyncio.run(bench(args, bootstrap, workdir))
        (workdir / "report.json").write_text(json.dumps(report, indent=2))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0 if all(r["error"] is None for r in report["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
