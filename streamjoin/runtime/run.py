"""Run an app as a worker process until SIGINT/SIGTERM or a fatal error (the CLI's engine).

It takes anything that starts, stops and waits like an App (:class:`Runnable`), so the
runtime never imports the App. Every way out is bounded and ends in one line and an
exit code (:data:`EXIT_CODES`): a stop that cannot finish within ``shutdown_timeout``
(the broker is unreachable, so nothing can be flushed or committed) is abandoned, and
the process exits without waiting for its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from streamjoin.compiled import status as compiled_status
from streamjoin.errors import ConfigurationError, ProvisioningError, StartupError
from streamjoin.redaction import mask_secrets_in_logs
from streamjoin.runtime.transport.access import refusal_of
from streamjoin.runtime.transport.liveness import BrokerWatch

log = logging.getLogger("streamjoin.worker")

EXIT_OK = 0
EXIT_FAILURE = 1
#: click's code for a usage error (an unknown option, a missing ``-A``)
EXIT_USAGE = 2
EXIT_CANNOT_START = 3
#: the worker's exit codes, as ``streamjoin worker --help`` and docs/operations.md list them
EXIT_CODES = {
    EXIT_OK: "stopped cleanly (SIGINT/SIGTERM): in-flight events finished and committed",
    EXIT_FAILURE: "stopped by a processing failure, or a stop that could not finish within "
    "shutdown_timeout",
    EXIT_USAGE: "usage error (unknown option, missing argument)",
    EXIT_CANNOT_START: "cannot start: bad -A, the app module does not import, bad settings, "
    "broker unreachable for startup_timeout, unusable state dir, topics that do not fit, "
    "a login or ACL the brokers refuse (at start or later)",
}
#: what ``app.start()`` raises when the app cannot run as configured (exit code 3)
STARTUP_ERRORS: tuple[type[Exception], ...] = (
    StartupError,
    ConfigurationError,
    ProvisioningError,
)
#: the lingering tasks' last chance to end after a clean stop
_LEFTOVER_TIMEOUT = 5.0


class Runnable(Protocol):
    """What :func:`serve` runs (``streamjoin.App`` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def running(self) -> bool: ...

    @property
    def failure(self) -> BaseException | None:
        """The error stopping (or that stopped) the app, as soon as it is known."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait(self) -> None: ...


@dataclass
class Outcome:
    """How :func:`serve` ended: the exit code, and whether a stop was abandoned (tasks are
    still running: the process must exit without waiting for them)."""

    code: int = EXIT_OK
    abandoned: bool = False


def configure_logging(
    level: str, broker: str | None = None, secrets: Iterable[str] = ()
) -> BrokerWatch | None:
    """The worker's log: one format on stderr, ``secrets`` masked in every line; below
    DEBUG, no client internals, and the broker's connection failures summarized by a
    :class:`BrokerWatch` (returned)."""
    logging.basicConfig(
        level=level.upper(),
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    mask_secrets_in_logs(secrets)
    if logging.getLogger().level <= logging.DEBUG:
        return None
    # aiokafka and mode log their own machinery (connection retries, "Starting...",
    # "Terminating cancelled task", heartbeats of a normal rebalance): not an operator's
    # business. What matters of it reaches the log through streamjoin's own lines.
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    logging.getLogger("mode").setLevel(logging.WARNING)
    # mode's own lines about our services ("[^Worker]: Starting...") use the modules' names
    logging.getLogger("streamjoin.runtime").setLevel(logging.WARNING)
    if broker is None:
        return None
    watch = BrokerWatch(broker)
    for handler in logging.getLogger().handlers:
        handler.addFilter(watch)
    return watch


def _exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Errors of tasks nobody awaited: one line (traceback at DEBUG), never a traceback
    dump at the end of a stop."""
    exc = context.get("exception")
    message = context.get("message", "")
    if isinstance(exc, asyncio.CancelledError):
        return
    if "never retrieved" in message:
        log.debug("%s: %r", message, exc, exc_info=exc)
        return
    log.warning("%s: %r", message, exc)
    log.debug("traceback", exc_info=exc)


async def _bounded(task: asyncio.Future[Any], timeout: float) -> bool:
    """Wait for ``task`` at most ``timeout`` seconds (without cancelling it); done?"""
    done, _ = await asyncio.wait({task}, timeout=timeout)
    return bool(done)


async def serve(
    app: Runnable,
    *,
    shutdown_timeout: float = 30.0,
    outcome: Outcome | None = None,
    watch: BrokerWatch | None = None,
) -> int:
    """Start ``app``, run until a signal or a fatal error, stop it within
    ``shutdown_timeout``; the exit code (also in ``outcome``, with whether a stop was
    abandoned)."""
    outcome = outcome if outcome is not None else Outcome()
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_requested.set)
    stopper = asyncio.ensure_future(stop_requested.wait())
    tasks: list[asyncio.Future[Any]] = [stopper]
    try:
        starting = asyncio.ensure_future(app.start())
        tasks.append(starting)
        await asyncio.wait({starting, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # a signal while starting (e.g. waiting for the broker)
            log.info("stop requested while starting")
            starting.cancel()
            if not await _bounded(starting, shutdown_timeout):
                outcome.abandoned = True
            return EXIT_OK
        exc = starting.exception()
        if exc is not None:
            outcome.code = EXIT_CANNOT_START
            exc = refusal_of(exc) or exc  # a refused login or ACL, said as such
            if isinstance(exc, STARTUP_ERRORS):
                log.error("cannot start app %s: %s", app.id, exc)
            else:
                log.error("cannot start app %s: %s: %s", app.id, type(exc).__name__, exc)
            log.debug("traceback", exc_info=exc)
            return outcome.code
        print(f"worker for app {app.id!r} running; Ctrl-C to stop", file=sys.stderr, flush=True)
        waiter = asyncio.ensure_future(app.wait())
        failed = asyncio.ensure_future(_failure_of(app))
        tasks += [waiter, failed]
        await asyncio.wait({waiter, stopper, failed}, return_when=asyncio.FIRST_COMPLETED)
        if stopper.done() and app.failure is None and not waiter.done():
            log.info("stop requested; finishing in-flight events and committing")
            stopping = asyncio.ensure_future(app.stop())
            tasks.append(stopping)
            if not await _bounded(stopping, shutdown_timeout):
                outcome.abandoned = True
                log.error(
                    "stop did not finish within %.0f s (shutdown_timeout; is the broker "
                    "reachable?); exiting: what was not committed is processed again",
                    shutdown_timeout,
                )
                outcome.code = EXIT_FAILURE
                return outcome.code
        if not await _bounded(waiter, shutdown_timeout):
            outcome.abandoned = True
        failure = app.failure
        if failure is None and waiter.done() and not waiter.cancelled():
            failure = waiter.exception()
        refused = refusal_of(failure) if failure is not None else None
        if refused is not None:  # retrying as configured cannot help: "cannot start"
            outcome.code = EXIT_CANNOT_START
            log.error("worker stopped: %s", refused)
            return outcome.code
        if failure is not None:
            outcome.code = EXIT_FAILURE
            log.error(
                "worker stopped after a fatal error: %s: %s%s",
                type(failure).__name__,
                failure,
                f" (its stop did not finish within {shutdown_timeout:.0f} s)"
                if outcome.abandoned
                else "",
            )
            return outcome.code
        if outcome.abandoned:
            outcome.code = EXIT_FAILURE
            log.error("stop did not finish within %.0f s; exiting", shutdown_timeout)
        elif watch is not None and watch.since is not None:
            # the stop ended, but nothing could be flushed or committed: not a clean stop
            outcome.code = EXIT_FAILURE
            log.error(
                "stopped while broker %s was unreachable: what was processed since the last "
                "commit was not committed and is processed again",
                watch.bootstrap,
            )
        return outcome.code
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for task in tasks:
            if not task.done():
                task.cancel()
        if not outcome.abandoned and app.running:
            stopping = asyncio.ensure_future(app.stop())
            if not await _bounded(stopping, shutdown_timeout):
                outcome.abandoned = True


async def _failure_of(app: Runnable) -> None:
    """Until the app has a failure (it is then stopping; its stop is what gets bounded)."""
    while app.failure is None:  # noqa: ASYNC110 (a Runnable exposes a property, no event)
        await asyncio.sleep(0.1)


#: first-generation threshold of the worker's cyclic garbage collector (CPython's default is
#: 700 allocations): a worker allocates a few short-lived objects per record, and with the
#: default it spends several percent of its time in collections that find no cycles
WORKER_GC_THRESHOLD = 50_000


def tune_gc_for_worker() -> None:
    """A worker process owns its interpreter: collect less often, and never rescan the
    objects that exist once the app is loaded (modules, declarations)."""
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(WORKER_GC_THRESHOLD, second, third)


def run_worker(
    app: Runnable,
    loglevel: str = "info",
    *,
    broker: str | None = None,
    shutdown_timeout: float = 30.0,
    secrets: Iterable[str] = (),
) -> int:
    """The ``streamjoin worker`` process (embedded apps keep their host's GC settings);
    ``secrets`` (the app's credentials) are masked in its log.

    Never hangs: a stop abandoned after ``shutdown_timeout`` ends the process at once
    (``os._exit``), without waiting for clients that cannot reach the broker."""
    watch = configure_logging(loglevel, broker, secrets)
    tune_gc_for_worker()
    log.info("per-event modules: %s", compiled_status())
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_exception_handler)
    outcome = Outcome()
    watcher = loop.create_task(watch.run()) if watch is not None else None
    try:
        loop.run_until_complete(
            serve(app, shutdown_timeout=shutdown_timeout, outcome=outcome, watch=watch)
        )
        if watcher is not None:
            watcher.cancel()
        if outcome.abandoned:
            _exit_now(outcome.code)
        _finish_leftovers(loop)
    finally:
        if not loop.is_closed():
            loop.close()
    return outcome.code


def _finish_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does at its end, bounded: cancel the tasks still there and give
    them a moment to end."""
    leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        gathered = asyncio.gather(*leftovers, return_exceptions=True)
        with contextlib.suppress(asyncio.TimeoutError):
            loop.run_until_complete(asyncio.wait_for(gathered, _LEFTOVER_TIMEOUT))
    loop.run_until_complete(loop.shutdown_asyncgens())


def _exit_now(code: int) -> None:
    """End the process without running what would wait for the unreachable broker."""
    logging.shutdown()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)
