"""Is the broker reachable? Waiting for it at start, and one log line while it is not.

aiokafka logs every failed connection attempt of every client at ERROR: a worker whose
broker went away wrote hundreds of lines a second. :class:`BrokerWatch` is a logging
filter that takes those records out of the log and notes the trouble instead; while
it lasts, the worker logs one line every ``interval`` seconds ("broker 127.0.0.1:9092
unreachable for 12 s; retrying"), and one when the broker answers again.
:func:`wait_for_broker` is the start's patience: it retries, backing off exponentially,
for ``startup_timeout`` seconds before the worker gives up with
:class:`~streamjoin.errors.StartupError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable

from streamjoin.errors import StartupError

__all__ = ["BrokerWatch", "broker_answers", "wait_for_broker"]

log = logging.getLogger("streamjoin.broker")

#: aiokafka's log lines that only say "the broker did not answer" (every client, every retry)
CONNECTION_TROUBLE = re.compile(
    r"Unable connect to|Unable to update metadata|Failed fetch messages|NodeNotReady"
    r"|KafkaConnectionError|Connect call failed|Connection at .* closed|Cannot send"
    r"|Could not send|Heartbeat|[Cc]oordinator|OffsetCommit failed|Failed to commit"
    r"|RequestTimedOut|Unable to request metadata|not ready|Connection refused",
)
#: aiokafka's lines about conditions it retries itself while the broker answers (a leader
#: not elected yet right after a topic is created, metadata catching up, a replica of a
#: cluster restarting so that fewer than min.insync.replicas are in sync): not an outage
RETRIED_BY_THE_CLIENT = re.compile(
    r"NotLeaderForPartition|LeaderNotAvailable|UnknownTopicOrPartition|Failed fetch offsets"
    r"|NotCoordinator|CoordinatorLoadInProgress|NotEnoughReplicas",
)
#: first and longest pause between two attempts to reach the broker while starting
BACKOFF_START, BACKOFF_MAX = 0.1, 5.0


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port,...`` as (host, port) pairs (IPv6 hosts without their brackets)."""
    out = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out


async def broker_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """Whether one of the bootstrap servers accepts a connection."""
    for host, port in bootstrap_addresses(bootstrap):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, asyncio.TimeoutError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


async def wait_for_broker(bootstrap: str, timeout: float, *, report_every: float = 10.0) -> None:
    """Until a bootstrap server accepts a connection: retries with exponential backoff
    (capped), one log line every ``report_every`` seconds; :class:`StartupError`
    after ``timeout`` seconds."""
    started = time.monotonic()
    reported = started
    backoff = BACKOFF_START
    while not await broker_answers(bootstrap):
        now = time.monotonic()
        waited = now - started
        if waited >= timeout:
            raise StartupError(
                f"broker {bootstrap} unreachable for {waited:.0f} s at start "
                f"(startup_timeout={timeout:g} s); is it running, and is the address right?"
            )
        if now - reported >= report_every:
            reported = now
            log.warning("broker %s unreachable for %.0f s; retrying", bootstrap, waited)
        await asyncio.sleep(min(backoff, max(0.0, timeout - waited)))
        backoff = min(backoff * 2, BACKOFF_MAX)
    if time.monotonic() - started >= 1.0:
        log.info("broker %s reachable after %.0f s", bootstrap, time.monotonic() - started)


def _lost_connection(record: logging.LogRecord) -> bool:
    """Whether the record's traceback is a lost connection (aiokafka's producer logs one
    under "Unexpected error in sender routine" when its transaction coordinator's
    connection breaks; the worker replaces that producer and says so itself)."""
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None:
        if CONNECTION_TROUBLE.search(type(exc).__name__) or isinstance(exc, ConnectionError):
            return True
        exc = exc.__cause__
    return False


class BrokerWatch(logging.Filter):
    """A filter for the worker's log handler: aiokafka's connection failures become one
    line every ``interval`` seconds (see the module docstring). Run :meth:`run` beside the
    worker so the line comes even when aiokafka goes quiet between its retries."""

    def __init__(
        self,
        bootstrap: str,
        *,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self.interval = interval
        self._clock = clock
        #: when the current outage was first noticed (None: the broker answers)
        self.since: float | None = None
        self.last_trouble: float | None = None
        self._reported: float | None = None
        #: aiokafka records taken out of the log during the current outage
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiokafka") or record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if RETRIED_BY_THE_CLIENT.search(message):
            return False
        if not CONNECTION_TROUBLE.search(message) and not _lost_connection(record):
            return True
        self.trouble()
        return False

    def trouble(self) -> None:
        """A connection to the broker failed just now."""
        now = self._clock()
        self.last_trouble = now
        self.suppressed += 1
        if self.since is None:
            self.since = self._reported = now
            log.warning("broker %s unreachable; retrying", self.bootstrap)

    def tick(self) -> None:
        """Report the outage if ``interval`` passed since the last line."""
        if self.since is None or self._reported is None:
            return
        now = self._clock()
        if now - self._reported >= self.interval:
            self._reported = now
            log.warning(
                "broker %s unreachable for %.0f s; retrying", self.bootstrap, now - self.since
            )

    def recovered(self) -> None:
        """The broker answers again."""
        if self.since is not None:
            log.info(
                "broker %s reachable again after %.0f s",
                self.bootstrap,
                self._clock() - self.since,
            )
        self.since = self._reported = None
        self.suppressed = 0

    async def run(self, probe_every: float = 1.0) -> None:
        """While an outage lasts: report it every ``interval`` seconds, and probe the broker
        to notice when it answers again (quiet aiokafka for a while is not enough)."""
        while True:
            await asyncio.sleep(probe_every)
            if self.since is None:
                continue
            self.tick()
            quiet = self.last_trouble is None or self._clock() - self.last_trouble >= 2.0
            if quiet and await broker_answers(self.bootstrap):
                self.recovered()
