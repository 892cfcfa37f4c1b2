"""The worker's claim on its state directory: checked writable and locked before it joins.

Two workers sharing one state directory would open each other's stores (RocksDB refuses,
mid-rebalance) and overwrite each other's ``membership.json``. So a worker takes an OS
file lock (``flock``) on ``<state_dir>/.streamjoin.lock`` before it creates topics or joins
its group, writes its pid into that file, and keeps the lock until it stops. The kernel
drops the lock when the process dies, so a crashed worker never leaves a stale lock
behind. The pid in the file is only for the message: the lock itself decides.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
from pathlib import Path

from streamjoin.errors import ConfigurationError, StateDirInUse

__all__ = ["LOCK_FILE", "StateDirLock"]

#: the lock (and pid) file inside the state directory
LOCK_FILE = ".streamjoin.lock"


class StateDirLock:
    """An exclusive, per-directory lock held by one worker while it runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Check that the directory is writable and lock it, or raise
        :class:`ConfigurationError` / :class:`StateDirInUse` naming the path."""
        if self._fd is not None:
            return
        self._check_writable()
        lock_path = self.path / LOCK_FILE
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigurationError(
                f"state dir {self.path}: cannot open {lock_path}: {exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateDirInUse(self.path, holder) from None
            raise ConfigurationError(
                f"state dir {self.path}: cannot lock {lock_path}: {exc}"
            ) from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise ConfigurationError(
                f"state dir {self.path}: cannot write {lock_path}: {exc}"
            ) from exc
        self._fd = fd

    def release(self) -> None:
        """Give the directory up (idempotent). The pid file stays; only the lock counts."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor releases the flock

    def _check_writable(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            # a real write: access() says yes on read-only mounts and to root
            with tempfile.TemporaryFile(dir=self.path, prefix=".write-check-"):
                pass
        except OSError as exc:
            raise ConfigurationError(f"state dir {self.path} is not writable: {exc}") from exc


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
