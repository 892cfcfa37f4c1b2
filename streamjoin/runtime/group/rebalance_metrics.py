"""Rebalance metrics, as KIP-429 names them for the Java consumer (pure: time is passed in).

A rebalance starts when this member learns it must (re)join and ends when it
has applied the new assignment (revoked, assigned). The metrics are kept by
the membership service, logged once per rebalance as one line, and read by
the app (``App.rebalance_metrics()``) and the metrics endpoint.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["CallbackTimes", "RebalanceMetrics", "RebalanceRecord"]

_HOUR = 3600.0


@dataclass
class CallbackTimes:
    """Latency of one kind of rebalance callback (revoked, assigned or lost)."""

    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    @property
    def avg(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass(frozen=True)
class RebalanceRecord:
    """What one completed rebalance did (logged as one line)."""

    generation: int
    protocol: str
    seconds: float
    assigned: int
    revoked: int
    owned: int
    leader: bool
    followup: bool


@dataclass
class RebalanceMetrics:
    """Counters and latencies of this member's rebalances."""

    rebalance_total: int = 0
    failed_rebalance_total: int = 0
    latency_total: float = 0.0
    latency_max: float = 0.0
    last_rebalance_at: float | None = None
    revoked: CallbackTimes = field(default_factory=CallbackTimes)
    assigned: CallbackTimes = field(default_factory=CallbackTimes)
    lost: CallbackTimes = field(default_factory=CallbackTimes)
    partitions_lost_total: int = 0
    last: RebalanceRecord | None = None
    _started: float | None = None
    _completed_at: deque[float] = field(default_factory=deque)
    _failed_at: deque[float] = field(default_factory=deque)

    def started(self, now: float) -> None:
        """A rebalance began (the first of several join attempts counts)."""
        if self._started is None:
            self._started = now

    @property
    def in_progress(self) -> bool:
        return self._started is not None

    def completed(self, now: float, record: RebalanceRecord) -> RebalanceRecord:
        started = self._started if self._started is not None else now
        self._started = None
        seconds = max(0.0, now - started)
        record = RebalanceRecord(**{**record.__dict__, "seconds": seconds})
        self.rebalance_total += 1
        self.latency_total += seconds
        self.latency_max = max(self.latency_max, seconds)
        self.last_rebalance_at = now
        self.last = record
        self._completed_at.append(now)
        self._trim(now)
        return record

    def failed(self, now: float) -> None:
        """A join or sync attempt failed (the rebalance goes on with another attempt)."""
        self.failed_rebalance_total += 1
        self._failed_at.append(now)
        self._trim(now)

    def _trim(self, now: float) -> None:
        for times in (self._completed_at, self._failed_at):
            while times and times[0] < now - _HOUR:
                times.popleft()

    def snapshot(self, now: float) -> dict[str, float | int | None]:
        """The KIP-429 metric names and values (seconds, counts)."""
        self._trim(now)
        return {
            "rebalance-latency-avg": (
                self.latency_total / self.rebalance_total if self.rebalance_total else 0.0
            ),
            "rebalance-latency-max": self.latency_max,
            "rebalance-latency-total": self.latency_total,
            "rebalance-total": self.rebalance_total,
            "rebalance-rate-per-hour": len(self._completed_at),
            "failed-rebalance-total": self.failed_rebalance_total,
            "failed-rebalance-rate-per-hour": len(self._failed_at),
            "last-rebalance-seconds-ago": (
                None if self.last_rebalance_at is None else now - self.last_rebalance_at
            ),
            "partition-revoked-latency-avg": self.revoked.avg,
            "partition-revoked-latency-max": self.revoked.max,
            "partition-assigned-latency-avg": self.assigned.avg,
            "partition-assigned-latency-max": self.assigned.max,
            "partition-lost-latency-avg": self.lost.avg,
            "partition-lost-latency-max": self.lost.max,
            "partitions-lost-total": self.partitions_lost_total,
        }
