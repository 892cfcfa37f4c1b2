"""``streamjoin worker --processes N`` (streamjoin/cli_processes.py): what each child gets,
and how the parent supervises real child processes (stop requests, crashes, hangs)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from streamjoin import cli_processes
from streamjoin.cli_processes import child_command, child_settings, run_processes
from streamjoin.errors import ConfigurationError

#: a child that exits 0 on SIGTERM and otherwise waits (as a worker does)
OBEDIENT = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "time.sleep(60)\n"
)


def test_each_child_has_its_own_state_dir_instance_id_and_port() -> None:
    children = child_settings(3, Path("/data/app"), "node-a", 8080)
    assert [c.state_dir for c in children] == [
        Path("/data/app/process-0"),
        Path("/data/app/process-1"),
        Path("/data/app/process-2"),
    ]
    assert [c.instance_id for c in children] == ["node-a-0", "node-a-1", "node-a-2"]
    assert [c.web_port for c in children] == [8080, 8081, 8082]


def test_no_instance_id_or_web_port_stays_none_and_port_zero_stays_zero() -> None:
    assert {(c.instance_id, c.web_port) for c in child_settings(2, Path("s"), None, None)} == {
        (None, None)
    }
    assert [c.web_port for c in child_settings(2, Path("s"), None, 0)] == [0, 0]


def test_ports_past_65535_are_refused_naming_the_last_port() -> None:
    with pytest.raises(ConfigurationError, match="65536"):
        child_settings(2, Path("s"), None, 65535)
    with pytest.raises(ConfigurationError, match="processes must be >= 1"):
        child_settings(0, Path("s"), None, None)


def test_a_child_command_is_a_one_process_worker_with_its_own_settings() -> None:
    settings = child_settings(2, Path("/d"), "id", 9000)[1]
    command = child_command("pkg.mod:app", "info", settings, ["--broker", "kafka://h:1"])
    assert command[:4] == [sys.executable, "-m", "streamjoin.cli", "worker"]
    joined = " ".join(command)
    assert "-A pkg.mod:app" in joined
    assert "--state-dir /d/process-1" in joined
    assert "--instance-id id-1" in joined
    assert "--web-port 9001" in joined
    assert "--broker kafka://h:1" in joined
    assert "--processes" not in joined


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_stop_request_reaches_every_child_and_a_clean_stop_exits_0() -> None:
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        assert run_processes([_python(OBEDIENT)] * 2, shutdown_timeout=10) == 0
    finally:
        timer.cancel()


def test_a_child_that_ends_on_its_own_stops_the_others_with_its_exit_code() -> None:
    failing = _python("import time, sys; time.sleep(0.5); sys.exit(3)")
    assert run_processes([_python(OBEDIENT), failing], shutdown_timeout=10) == 3


def test_a_child_killed_by_a_signal_is_a_failure() -> None:
    killed = _python("import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), 9)")
    assert run_processes([killed, _python(OBEDIENT)], shutdown_timeout=10) == 1


def test_a_child_that_ignores_its_stop_is_killed_after_the_shutdown_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli_processes, "KILL_MARGIN", 0.0)
    stubborn = _python(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"
    )
    failing = _python("import time, sys; time.sleep(0.5); sys.exit(0)")
    # (a child that exits 0 unasked also ends the command: the worker is not whole)
    assert run_processes([stubborn, failing], shutdown_timeout=0.5) == 1
