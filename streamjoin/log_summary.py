"""Repeated warnings as one line per period with a count (no asyncio, no Kafka).

A join fed with old data can drop thousands of late events a second; one warning each
would bury everything else in the log. :class:`Summary` logs the first occurrence of
each kind at once, then at most one line per ``period`` seconds saying how many more
there were ("120 late events dropped in the last 30 s on topic clicks").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

__all__ = ["DEFAULT_PERIOD", "Summary"]

#: seconds between two summary lines of one kind
DEFAULT_PERIOD = 30.0


class Summary:
    """Counts occurrences per key; logs the first at once, then one line per period."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        period: float = DEFAULT_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.period = period
        self._clock = clock
        #: key -> (when its last line was logged, occurrences since)
        self._pending: dict[Hashable, tuple[float, int]] = {}

    def note(
        self, key: Hashable, first: Callable[[], str], summary: Callable[[int, float], str]
    ) -> None:
        """One occurrence of ``key``: ``first()`` is logged if it is the first in a period,
        ``summary(count, seconds)`` once the period is over and more came meanwhile."""
        now = self._clock()
        seen = self._pending.get(key)
        if seen is None:
            self._pending[key] = (now, 0)
            self.logger.warning("%s", first())
            return
        logged_at, count = seen
        count += 1
        if now - logged_at < self.period:
            self._pending[key] = (logged_at, count)
            return
        self._pending[key] = (now, 0)
        self.logger.warning("%s", summary(count, now - logged_at))
