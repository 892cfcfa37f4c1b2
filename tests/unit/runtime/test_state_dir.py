"""The state directory lock: one worker per directory, checked writable before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamjoin.errors import ConfigurationError, StateDirInUse
from streamjoin.runtime.table_state.state_dir import LOCK_FILE, StateDirLock


def test_a_second_lock_on_the_same_directory_names_the_holder(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path / "state")
    first.acquire()
    assert (tmp_path / "state" / LOCK_FILE).read_text().strip() == str(os.getpid())
    second = StateDirLock(tmp_path / "state")
    with pytest.raises(StateDirInUse) as caught:
        second.acquire()
    assert str(caught.value) == (
        f"state dir {tmp_path / 'state'} in use by pid {os.getpid()}; "
        "give each worker its own --state-dir"
    )
    assert isinstance(caught.value, ConfigurationError)  # a "cannot start" error
    first.release()
    second.acquire()  # free again once released
    assert second.held
    second.release()


def test_the_lock_is_held_against_another_process(tmp_path: Path) -> None:
    lock = StateDirLock(tmp_path)
    lock.acquire()
    code = (
        "import sys; from pathlib import Path\n"
        "from streamjoin.runtime.table_state.state_dir import StateDirLock\n"
        "from streamjoin.errors import StateDirInUse\n"
        "try:\n"
        f"    StateDirLock(Path({str(tmp_path)!r})).acquire()\n"
        "except StateDirInUse as exc:\n"
        "    print(exc); sys.exit(7)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 7, result.stderr
    assert f"in use by pid {os.getpid()}" in result.stdout
    lock.release()
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    assert again.returncode == 0


def test_a_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("x")
    with pytest.raises(ConfigurationError, match=r"state dir .*/f is not writable: .*exists"):
        StateDirLock(file).acquire()
    with pytest.raises(ConfigurationError, match=r"state dir .*/f/sub is not writable: .*dir"):
        StateDirLock(file / "sub").acquire()
