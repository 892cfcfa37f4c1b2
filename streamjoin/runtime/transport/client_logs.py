"""aiokafka's ERROR lines about conditions it retries, said at DEBUG with the reason.

When a consumer looks up where to start reading a partition whose leader is not known
yet (a topic just created, a broker starting or moving leaders), aiokafka logs
``Failed fetch offsets from 1: [Error 6] NotLeaderForPartitionError`` at ERROR and
retries after its backoff; nothing failed. In an app embedded without logging set up,
Python prints such a line bare on stderr. :func:`quiet_retried_offset_lookups` installs
a filter on aiokafka's fetcher logger that turns the line into a DEBUG one saying it is
retried (and drops it unless that logger is enabled for DEBUG); errors aiokafka does not
retry stay as they are.
"""

from __future__ import annotations

import logging

#: where aiokafka logs the line, and its format string (aiokafka 0.14, consumer/fetcher.py)
FETCHER_LOGGER = "aiokafka.consumer.fetcher"
FAILED_OFFSET_LOOKUP = "Failed fetch offsets from %s: %s"
RETRIED = (
    "offset lookup on broker %s: %s; retried (the partition's leader is not known yet, as "
    "while a topic is created or a broker starts)"
)


class RetriedOffsetLookups(logging.Filter):
    """Downgrades aiokafka's retried offset-lookup failures to DEBUG (see the module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != FAILED_OFFSET_LOOKUP or not _retried(record.args):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname, record.msg = logging.DEBUG, "DEBUG", RETRIED
        return True


def _retried(args: object) -> bool:
    return isinstance(args, tuple) and len(args) == 2 and bool(getattr(args[1], "retriable", False))


def quiet_retried_offset_lookups() -> None:
    """Install the filter on aiokafka's fetcher logger (once per process)."""
    logger = logging.getLogger(FETCHER_LOGGER)
    if not any(isinstance(f, RetriedOffsetLookups) for f in logger.filters):
        logger.addFilter(RetriedOffsetLookups())
