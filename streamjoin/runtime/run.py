"""Run an app as a worker process until SIGINT/SIGTERM or a fatal error (the CLI's engine).

It takes anything that starts, stops and waits like an App (:class:`Runnable`), so the
runtime never imports the App.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from typing import Protocol

from streamjoin.errors import ConfigurationError, ProvisioningError

log = logging.getLogger("streamjoin.worker")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2


class Runnable(Protocol):
    """What :func:`serve` runs (``streamjoin.App`` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def running(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait(self) -> None: ...


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # aiokafka logs expected rebalance chatter at INFO/ERROR; keep it at WARNING.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        logging.getLogger("mode").setLevel(logging.WARNING)


async def serve(app: Runnable) -> int:
    """Start ``app``, run until a signal or a fatal error, stop it cleanly; the exit code."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_requested.set)
    try:
        try:
            await app.start()
        except (ConfigurationError, ProvisioningError) as exc:
            log.error("cannot start app %s: %s", app.id, exc)
            return EXIT_CONFIG
        print(f"worker for app {app.id!r} running; Ctrl-C to stop", file=sys.stderr, flush=True)
        waiter = asyncio.create_task(app.wait())
        stopper = asyncio.create_task(stop_requested.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stopper.done():
            log.info("stop requested; finishing in-flight events and committing")
            await app.stop()
        stopper.cancel()
        try:
            await waiter
        except Exception as exc:
            log.error("worker stopped after a fatal error: %s: %s", type(exc).__name__, exc)
            return EXIT_FAILURE
        return EXIT_OK
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if app.running:
            await app.stop()


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


def run_worker(app: Runnable, loglevel: str = "info") -> int:
    """The ``streamjoin worker`` process (embedded apps keep their host's GC settings)."""
    configure_logging(loglevel)
    tune_gc_for_worker()
    return asyncio.run(serve(app))
