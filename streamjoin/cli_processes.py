"""``streamjoin worker --processes N``: one command, N worker processes, one per core.

A worker runs its agents on one asyncio thread, so one process uses about one core
however many the machine has. Kafka Streams spreads a worker over ``num.stream.threads``;
a Python worker spreads over processes instead: each child is a whole worker (its own
event loop, group membership, state and web server), started with the same app and
options, and the group assigns tasks to the children as to any other members.

What differs per child (a pure function, :func:`child_settings`, so it is tested alone):

* its state directory: ``<state dir>/process-<i>``, the same for child ``i`` at every
  start, so a restarted child finds the state it left (placement prefers it);
* its static instance id, when the worker has one: ``<instance id>-<i>``;
* its web port, when the worker serves one: ``<port> + i`` (0 stays 0: any free port).

The parent supervises (:func:`run_processes`): it forwards SIGTERM and SIGINT to every
child, and when a child ends without being asked to (a crash, a fatal error, kill -9) it
stops the others and exits with that child's code, so that whatever restarts the command
(systemd, Kubernetes) sees the failure instead of a worker running at a fraction of its
size. On Linux a child also gets SIGTERM if the parent itself dies.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from streamjoin.errors import ConfigurationError

__all__ = ["ChildSettings", "child_command", "child_settings", "run_processes"]

log = logging.getLogger("streamjoin.processes")

#: how often the parent looks at its children (seconds)
POLL_INTERVAL = 0.2
#: extra seconds past the children's shutdown timeout before they are killed
KILL_MARGIN = 10.0
#: the parent's exit code for a child that a signal ended (kill -9): a failure
EXIT_CHILD_KILLED = 1


@dataclass(frozen=True)
class ChildSettings:
    """What child ``index`` of a ``--processes`` worker runs with, besides the app's own."""

    index: int
    state_dir: Path
    instance_id: str | None
    web_port: int | None


def child_settings(
    processes: int, state_dir: Path, instance_id: str | None, web_port: int | None
) -> list[ChildSettings]:
    """The settings of each of ``processes`` children of a worker whose own (resolved)
    state directory, instance id and web port are given."""
    if processes < 1:
        raise ConfigurationError(f"processes must be >= 1, got {processes}")
    if web_port and web_port + processes - 1 > 65535:
        raise ConfigurationError(
            f"--processes {processes} from web port {web_port}: the last process's port "
            f"would be {web_port + processes - 1} (ports go to 65535); choose a lower port "
            "or 0 (any free port)"
        )
    return [
        ChildSettings(
            index=i,
            state_dir=state_dir / f"process-{i}",
            instance_id=None if instance_id is None else f"{instance_id}-{i}",
            web_port=None if web_port is None else (0 if web_port == 0 else web_port + i),
        )
        for i in range(processes)
    ]


def child_command(
    app_spec: str, loglevel: str, settings: ChildSettings, passed: Sequence[str]
) -> list[str]:
    """The ``streamjoin worker`` command of one child: the parent's options (``passed``:
    the ones given on the command line that are the same for every child) and its own."""
    command = [
        sys.executable,
        "-m",
        "streamjoin.cli",
        "worker",
        "-A",
        app_spec,
        "--loglevel",
        loglevel,
        "--state-dir",
        str(settings.state_dir),
        *passed,
    ]
    if settings.instance_id is not None:
        command += ["--instance-id", settings.instance_id]
    if settings.web_port is not None:
        command += ["--web-port", str(settings.web_port)]
    return command


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: have the kernel send this process SIGTERM when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def exit_code_of(returncode: int) -> int:
    """The parent's exit code for a child's: the same, or a failure for a signal."""
    return EXIT_CHILD_KILLED if returncode < 0 else returncode


def run_processes(
    commands: Sequence[Sequence[str]],
    shutdown_timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    spawn: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
) -> int:
    """Start one child per command and supervise them until they have all ended; the
    exit code: 0 when every child stopped cleanly after a stop request, else the code of
    the first child that ended on its own (or failed its stop)."""
    children: list[subprocess.Popen[bytes]] = []
    stopping = False
    outcome = 0

    def stop_all(reason: str) -> None:
        nonlocal stopping
        if not stopping:
            log.info("stopping %d worker process(es): %s", len(children), reason)
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop_all(f"{signal.Signals(signum).name} received")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for command in commands:
            if stopping:
                break  # (a stop request while starting them)
            children.append(
                spawn(
                    list(command),
                    env=None if env is None else dict(env),
                    # (its own process group: a terminal's Ctrl-C reaches the children
                    # once, through the parent, not twice)
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            )
        log.info(
            "started %d worker processes: %s",
            len(children),
            ", ".join(str(child.pid) for child in children),
        )
        deadline: float | None = None
        running = list(children)
        while running:
            for child in list(running):
                code = child.poll()
                if code is None:
                    continue
                running.remove(child)
                if not stopping:
                    outcome = exit_code_of(code)
                    log.error(
                        "worker process %d (pid %d) ended on its own with exit code %d",
                        children.index(child),
                        child.pid,
                        code,
                    )
                    stop_all(f"process {children.index(child)} ended")
                elif code != 0 and outcome == 0:
                    outcome = exit_code_of(code)
            if stopping and deadline is None:
                deadline = time.monotonic() + shutdown_timeout + KILL_MARGIN
            if deadline is not None and time.monotonic() > deadline:
                for child in running:
                    log.error("worker process pid %d did not stop in time: killed", child.pid)
                    child.kill()
                    child.wait()
                    if outcome == 0:
                        outcome = EXIT_CHILD_KILLED
                break
            time.sleep(POLL_INTERVAL)
    finally:
        for child in children:
            if child.poll() is None:  # (an error of the parent itself: leave none behind)
                child.kill()
                child.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return outcome
