"""When an idle join partition's stream time moves on by itself (pure: the caller reads the clock).

Stream time only moves when a record arrives, so on a partition whose input stops, the
windows of its last events never close and their unmatched left/outer results wait for
data that may never come. With ``close_idle_after=``, the worker asks an
:class:`IdleClock` at every commit (the flush of the join's buffer partition, which runs
even when nothing arrives) how far stream time has moved:

* a partition that received records since the previous commit is **active**: the clock
  notes this commit's wall-clock time and the partition's stream time (a stream time
  known at that commit; the records came at most one commit interval earlier, so
  idleness is never overestimated);
* once it has received nothing for ``close_idle_after`` since then, stream time is the
  noted one plus the wall-clock time elapsed since the note: event time is taken to move
  in step with wall-clock time, as it does on a live stream. It is relative to the
  partition's own last stream time, not the wall clock itself, so a stream whose event
  times lag the wall clock (a replay, a producer with a skewed clock) does not have every
  window closed at once.

``docs/joins.md`` ("Idle partitions") states it for users.
"""

from __future__ import annotations

from streamjoin.errors import ConfigurationError

__all__ = ["IdleClock"]

_MAX_TIMESTAMP_MS = (1 << 63) - 1


class IdleClock:
    """The stream time an idle join partition has reached, decided at each commit.

    ``now_ms`` is a monotonic wall-clock reading in milliseconds (any origin: only
    differences count); ``processed`` is a count of the records the partition received,
    which grows with every one (the join core's ``stats.processed``).
    """

    __slots__ = ("_processed", "_since_ms", "_stream_time_ms", "idle_after_ms")

    def __init__(
        self, idle_after_ms: int, *, now_ms: int, processed: int, stream_time_ms: int | None
    ) -> None:
        if isinstance(idle_after_ms, bool) or not isinstance(idle_after_ms, int):
            raise ConfigurationError(f"idle_after_ms must be an int, got {idle_after_ms!r}")
        if idle_after_ms <= 0:
            raise ConfigurationError(f"idle_after_ms must be positive, got {idle_after_ms}")
        self.idle_after_ms = idle_after_ms
        # A partition is idle from the moment its clock starts (a task that has just been
        # assigned, with the stream time its state was restored with).
        self._processed = processed
        self._since_ms = now_ms
        self._stream_time_ms = stream_time_ms

    @property
    def idle_since_ms(self) -> int:
        """The clock reading at which the partition was last seen receiving records."""
        return self._since_ms

    def tick(self, now_ms: int, processed: int, stream_time_ms: int | None) -> int | None:
        """At a commit: the stream time to advance to, or None (active, or not idle long
        enough, or no stream time yet: nothing was ever buffered).

        ``stream_time_ms`` is the partition's stream time now; it is noted when records
        arrived since the last tick.
        """
        if processed != self._processed:
            self._processed = processed
            self._since_ms = now_ms
            self._stream_time_ms = stream_time_ms
            return None
        noted = self._stream_time_ms
        idle_ms = now_ms - self._since_ms
        if noted is None or idle_ms < self.idle_after_ms:
            return None
        return min(noted + idle_ms, _MAX_TIMESTAMP_MS)
