"""Start streamjoin worker processes of a chosen source tree and watch them from outside.

``many_partitions.py`` and ``group_scale.py`` use it. A worker is watched through its own
``/status.json`` (roles of its partitions and table partitions, the group generation) and
through ``/proc`` (open files, peak RSS); nothing is added to the worker for the benchmark.

The pure parts (is a worker running every task it holds? has the group settled?) are
functions of status snapshots, unit-tested in ``tests/unit/test_bench_scale.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: status.json roles of a task that processes records now
RUNNING_SOURCE_ROLES = frozenset({"active"})
#: status.json roles of table partitions that do not hold a task back
SETTLED_TABLE_ROLES = frozenset({"active", "standby"})


# --------------------------------------------------------------------------- pure


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def running_partitions(status: Mapping[str, Any]) -> set[tuple[str, int]]:
    """The source partitions a worker's snapshot shows as processing (role ``active``)."""
    return {
        (row["topic"], row["partition"])
        for row in status.get("partitions", ())
        if row.get("role") in RUNNING_SOURCE_ROLES
    }


def tasks_running(status: Mapping[str, Any], partitions: int, tables: int) -> bool:
    """Whether one worker holding every partition runs every task: ``partitions`` source
    partitions active and ``tables`` x ``partitions`` table partitions active."""
    active_tables = sum(1 for row in status.get("tables", ()) if row.get("role") == "active")
    return len(running_partitions(status)) == partitions and active_tables == partitions * tables


def group_settled(
    statuses: Sequence[Mapping[str, Any] | None], wanted: set[tuple[str, int]]
) -> bool:
    """Whether a group of workers runs every task of ``wanted`` exactly once: every worker
    answered, none is rebalancing, all are at one generation, each wanted source partition
    is active on exactly one worker, and no table partition waits (restoring, pending,
    warmup)."""
    if not statuses or any(s is None for s in statuses):
        return False
    seen: list[tuple[str, int]] = []
    generations = set()
    for status in statuses:
        assert status is not None
        if status.get("rebalance", {}).get("in_progress"):
            return False
        generations.add(status.get("worker", {}).get("generation"))
        if any(row.get("role") not in RUNNING_SOURCE_ROLES for row in status.get("partitions", ())):
            return False
        if any(row.get("role") not in SETTLED_TABLE_ROLES for row in status.get("tables", ())):
            return False
        seen.extend(running_partitions(status))
    return len(generations) == 1 and len(seen) == len(set(seen)) and set(seen) == wanted


def median(values: Iterable[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# --------------------------------------------------------------------------- processes


#: run as ``python -P -c``: import ``streamjoin`` (from ``PYTHONPATH``, the tree), then put
#: this checkout first on ``sys.path`` for ``benchmarks``, then run the CLI as ``-m`` would
_LAUNCH = (
    "import runpy, sys, streamjoin; sys.path.insert(0, {root!r}); "
    "sys.argv[0] = 'streamjoin'; runpy.run_module('streamjoin.cli', run_name='__main__')"
)


def worker_command(
    tree: Path, app_spec: str, args: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """``streamjoin worker -A app_spec args`` with ``streamjoin`` imported from ``tree`` and
    the app (under ``benchmarks/``) from this checkout, whatever else is on ``sys.path``
    (the tree's own ``benchmarks/``, this checkout installed in the venv)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    launch = _LAUNCH.format(root=str(ROOT))
    cmd = [sys.executable, "-P", "-c", launch, "worker", "-A", app_spec, *args]
    return cmd, env


def _raise_open_files_limit() -> None:  # pragma: no cover - runs in the child before exec
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class WatchedWorker:
    """One worker process: its status port, and what was sampled of it."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    spawned: float
    peak_open_files: int = 0
    peak_rss_mb: float = 0.0
    exit_code: int | None = None
    #: ``ru_maxrss`` of the exited process (exact, unlike sampling), MB
    final_peak_rss_mb: float | None = None
    stop_seconds: float | None = None
    samples: int = 0
    rss_now_mb: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def sample(self) -> None:
        """Open files now and peak RSS so far (kept as maxima)."""
        with contextlib.suppress(OSError):
            self.peak_open_files = max(
                self.peak_open_files, len(os.listdir(f"/proc/{self.pid}/fd"))
            )
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_mb = max(self.peak_rss_mb, int(line.split()[1]) / 1024)
                elif line.startswith("VmRSS:"):
                    self.rss_now_mb = int(line.split()[1]) / 1024
        self.samples += 1

    def status(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The worker's ``/status.json`` (None while it does not answer)."""
        url = f"http://127.0.0.1:{self.port}/status.json"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                data: dict[str, Any] = json.loads(response.read())
                return data
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        return self.exit_code is None and self.proc.poll() is None


def spawn_worker(
    name: str,
    tree: Path,
    app_spec: str,
    env_extra: Mapping[str, str],
    state_dir: Path,
    log: Path,
    extra_args: Sequence[str] = (),
) -> WatchedWorker:
    """Start one worker (its own session, open-files soft limit raised to the hard one)."""
    port = free_port()
    args = [
        "--state-dir",
        str(state_dir),
        "--metrics-port",
        str(port),
        "--loglevel",
        "info",
        *extra_args,
    ]
    cmd, env = worker_command(tree, app_spec, args)
    env.update(env_extra)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_raise_open_files_limit,
        )
    return WatchedWorker(name, proc, port, log, time.monotonic())


def _reap(worker: WatchedWorker) -> None:
    """Wait for the process and keep its exit code and exact peak RSS (``wait4``)."""
    _, status, usage = os.wait4(worker.pid, 0)
    worker.exit_code = os.waitstatus_to_exitcode(status)
    worker.proc.returncode = worker.exit_code
    worker.final_peak_rss_mb = usage.ru_maxrss / 1024


async def stop_worker(worker: WatchedWorker, timeout: float = 120.0) -> None:
    """SIGTERM, then wait for the exit (SIGKILL after ``timeout``); times the stop."""
    if worker.exit_code is not None:
        return
    worker.sample()
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    reap = asyncio.ensure_future(asyncio.to_thread(_reap, worker))
    while not reap.done():
        if time.monotonic() - started > timeout:
            worker.notes.append(f"no exit {timeout:.0f}s after SIGTERM: killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            break
        worker.sample()
        await asyncio.sleep(0.2)
    await reap
    worker.stop_seconds = time.monotonic() - started


def kill_all(workers: Iterable[WatchedWorker]) -> None:
    """Last resort at exit: SIGKILL every worker still running (by its own process group)."""
    for worker in workers:
        if worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                worker.proc.wait(10)


def log_tail(path: Path, lines: int = 20) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
