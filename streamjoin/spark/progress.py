"""A progress line for long Spark jobs: records read, partitions done, outputs (from accumulators).

Spark's UI shows stages and tasks; this is the one-line summary a terminal
needs. Accumulators are updated as tasks finish, so the line moves per partition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

__all__ = ["Counters", "Progress", "ProgressReporter"]


@dataclass(frozen=True)
class Progress:
    """A snapshot of a running (or finished) job."""

    job: str
    records_read: int
    partitions_done: int
    partitions_total: int
    outputs: int
    elapsed_s: float
    finished: bool = False

    def line(self) -> str:
        state = "done" if self.finished else "running"
        return (
            f"[{self.job}] {state}: {self.partitions_done}/{self.partitions_total} partitions, "
            f"{self.records_read:,} records read, {self.outputs:,} written, "
            f"{self.elapsed_s:.1f}s"
        )


class Counters:
    """The job's accumulators (created on the driver, added to by tasks)."""

    def __init__(self, sc: Any) -> None:
        self.records = sc.accumulator(0)
        self.outputs = sc.accumulator(0)
        self.partitions = sc.accumulator(0)
        self.late = sc.accumulator(0)


class ProgressReporter:
    """Calls ``callback`` with a :class:`Progress` every ``interval`` s and once at the end."""

    def __init__(
        self,
        job: str,
        counters: Counters,
        partitions_total: int,
        callback: Callable[[Progress], None] | None,
        interval: float = 2.0,
    ) -> None:
        self.job = job
        self.counters = counters
        self.total = partitions_total
        self.callback = callback
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()

    def snapshot(self, finished: bool = False) -> Progress:
        return Progress(
            self.job,
            int(self.counters.records.value),
            int(self.counters.partitions.value),
            self.total,
            int(self.counters.outputs.value),
            time.monotonic() - self._started,
            finished,
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self.callback is not None:
                self.callback(self.snapshot())

    def __enter__(self) -> ProgressReporter:
        self._started = time.monotonic()
        if self.callback is not None:
            self._thread = threading.Thread(target=self._loop, name="sj-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.callback is not None and exc is None:
            self.callback(self.snapshot(finished=True))
