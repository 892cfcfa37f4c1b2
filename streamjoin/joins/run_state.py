"""A stream-stream join while a worker runs it: its state in each task, its counters.

The declaration (:class:`~streamjoin.joins.api.StreamStreamJoinDecl`) keeps nothing
at run time:

* a :class:`JoinPartition` lives in the task that owns the partition (``Task.joins``)
  and goes with it: the join core over the task's buffer partition, and the summary
  of that partition's late events;
* the join's :class:`JoinStats` are kept by the worker's agent runtime for as long as
  it runs, across tasks: ``App.join_stats`` and the metrics report them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streamjoin.joins.core import StreamStreamJoin
from streamjoin.joins.idle import IdleClock
from streamjoin.log_summary import Summary

__all__ = ["JoinPartition", "JoinStats"]

log = logging.getLogger("streamjoin.joins")


class JoinPartition:
    """One task's part of a join: its core, its late and beyond-grace events (the
    first logged at once, then a count per period) and, for a join declared with
    ``close_idle_after=``, the clock that advances its stream time while it is idle."""

    __slots__ = ("core", "idle", "idle_failure", "late_events")

    def __init__(self, core: StreamStreamJoin, idle: IdleClock | None = None) -> None:
        self.core = core
        self.idle = idle
        #: why an idle close failed (its join function raised, under on_error="stop"):
        #: every later flush of the partition fails with it
        self.idle_failure: Exception | None = None
        self.late_events = Summary(log)


@dataclass
class JoinStats:
    """A join's counters on this worker since it started (kept by the worker)."""

    #: results passed to the join function
    emitted: int = 0
    #: inputs dropped because their window had closed
    late: int = 0
    #: inputs accepted beyond the grace period (their partners may be gone)
    beyond_grace: int = 0
    #: results of windows closed on an idle partition (``close_idle_after=``; in ``emitted``)
    idle_emitted: int = 0
