"""The last minutes of a worker's numbers, for the status page's charts (pure).

The monitor adds one :class:`Sample` per refresh (every few seconds), made by
:func:`sample_of` from two consecutive snapshots; :class:`History` keeps the newest
ones in a ring of fixed size, so memory stays bounded however long the worker runs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["History", "Sample", "capacity_for", "sample_of"]

#: how far back the charts look
DEFAULT_SPAN_SECONDS = 600.0


@dataclass(frozen=True)
class Sample:
    """One point of every chart. ``at`` is wall-clock seconds; a None value is a gap
    (no commit in the interval has no commit latency)."""

    at: float
    records_in_per_second: float
    lag: int | None
    commit_latency_ms: float | None
    restore_records_left: int
    restored_per_second: float


def capacity_for(interval_seconds: float, span_seconds: float = DEFAULT_SPAN_SECONDS) -> int:
    """How many samples taken every ``interval_seconds`` cover ``span_seconds``."""
    return max(2, math.ceil(span_seconds / max(interval_seconds, 0.1)) + 1)


def sample_of(
    snapshot: Mapping[str, Any], previous: Mapping[str, Any] | None, seconds: float, at: float
) -> Sample:
    """The sample of ``snapshot`` (see ``monitor.collect``) taken at wall-clock ``at``,
    with the rates and the mean commit latency over the ``seconds`` since ``previous``
    (None: the first sample)."""
    throughput = snapshot.get("throughput") or {}
    lags = [row["lag"] for row in snapshot.get("partitions") or () if row.get("lag") is not None]
    left = sum(
        row.get("records_left") or 0
        for row in snapshot.get("tables") or ()
        if row.get("role") == "restoring"
    )
    latency = None
    restored_rate = 0.0
    if previous is not None:
        now_commits = snapshot.get("commit_latency") or {}
        then_commits = previous.get("commit_latency") or {}
        commits = now_commits.get("count", 0) - then_commits.get("count", 0)
        if commits > 0:
            spent = now_commits.get("sum", 0.0) - then_commits.get("sum", 0.0)
            latency = 1000.0 * spent / commits
        restored = snapshot.get("restored_records", 0) - previous.get("restored_records", 0)
        restored_rate = max(0.0, restored / max(seconds, 1e-6))
    return Sample(
        at=at,
        records_in_per_second=float(throughput.get("records_in_per_second") or 0.0),
        lag=sum(lags) if lags else None,
        commit_latency_ms=latency,
        restore_records_left=int(left),
        restored_per_second=restored_rate,
    )


class History:
    """The newest ``capacity`` samples (two at least: a line needs two points), oldest
    first."""

    def __init__(self, capacity: int) -> None:
        self._samples: deque[Sample] = deque(maxlen=max(2, capacity))

    @property
    def capacity(self) -> int:
        return self._samples.maxlen or 0

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)

    def rows(self) -> list[dict[str, Any]]:
        """The samples as plain dicts (the snapshot's ``history``), oldest first."""
        return [asdict(s) for s in self._samples]

    def __len__(self) -> int:
        return len(self._samples)
