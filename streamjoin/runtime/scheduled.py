"""Runs the app's timers, crontabs and app tasks while the worker runs (the asyncio shell
around :mod:`streamjoin.timers`, which decides when a timer fires).

One asyncio task per timer: it sleeps until the next tick, asks the leader gate, awaits
the user's function, then computes the next tick still ahead, so a timer never runs
twice at once and the ticks a slow run overran are skipped (counted, and logged once per
overrun). One asyncio task per app task: started once; with ``on_leader``, started when
this worker leads the group and cancelled when it stops leading. An error follows the
declaration's ``on_error``: ``stop`` logs one line naming it and stops the worker with
:class:`~streamjoin.errors.TimerFailed` as the app's failure; ``skip`` logs it and the
timer keeps ticking. :meth:`ScheduledWork.stop` cancels every task and awaits it.

The worker builds it (started once the group is joined, stopped first); the in-memory
test driver builds its own and fires timers by hand. Leadership comes in as a callable,
so this module knows nothing of the group. What it counts per timer (runs, errors, last
duration, skipped ticks) is :meth:`ScheduledWork.snapshot`, read by the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamjoin.errors import AgentFailed, TimerFailed
from streamjoin.runtime.metrics import WorkerCounters
from streamjoin.timers import AppTask, Crontab, Every, OnTimerError, Timer, should_run

__all__ = ["ScheduledWork", "TimerStats"]

log = logging.getLogger("streamjoin.timers")

#: how often an ``on_leader`` app task's runner asks whether this worker leads (seconds)
LEADER_POLL_SECONDS = 0.5
#: the most missed crontab times counted after one overrun (a per-second crontab after a
#: run of hours would otherwise walk every second)
MAX_COUNTED_MISSES = 10_000


@dataclass
class TimerStats:
    """What one timer or app task did on this worker (mutated by its runner)."""

    kind: str  # "interval", "crontab" or "task"
    schedule: str
    on_leader: bool
    runs: int = 0
    errors: int = 0
    #: ticks skipped because a run was still going when they were due
    skipped_overrun: int = 0
    #: ticks skipped because this worker did not lead the group (``on_leader``)
    skipped_not_leader: int = 0
    last_duration: float | None = None
    #: wall-clock time the last run started (seconds since the epoch)
    last_run_at: float | None = None
    #: wall-clock time of the next tick (None: an app task, or not scheduled)
    next_run_at: float | None = None
    running: bool = False
    #: ``on_leader``: whether this worker led at the last tick (None: no tick yet)
    leading: bool | None = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "schedule": self.schedule,
            "on_leader": self.on_leader,
            "runs": self.runs,
            "errors": self.errors,
            "skipped_overrun": self.skipped_overrun,
            "skipped_not_leader": self.skipped_not_leader,
            "last_duration_seconds": self.last_duration,
            "last_run_at": self.last_run_at,
            "next_run_at": self.next_run_at,
            "running": self.running,
        }


class ScheduledWork:
    """The timers and app tasks of one worker: started, ticking, stopped."""

    def __init__(
        self,
        timers: Iterable[Timer],
        tasks: Iterable[AppTask] = (),
        *,
        is_leader: Callable[[], bool],
        on_crash: Callable[[BaseException], None],
        counters: WorkerCounters | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        stop_timeout: float = 10.0,
    ) -> None:
        self.timers = {t.name: t for t in timers}
        self.tasks = {t.name: t for t in tasks}
        self._is_leader = is_leader
        self._on_crash = on_crash
        self.counters = counters if counters is not None else WorkerCounters()
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._stop_timeout = stop_timeout
        self.stats: dict[str, TimerStats] = {}
        for timer in self.timers.values():
            kind = "interval" if isinstance(timer.schedule, Every) else "crontab"
            self.stats[timer.name] = TimerStats(kind, timer.schedule.describe(), timer.on_leader)
        for task in self.tasks.values():
            self.stats[task.name] = TimerStats("task", "once", task.on_leader)
        self._running: list[asyncio.Task[None]] = []
        self._stopped = False

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Name -> its counters and state, sorted by name (the metrics' ``timers``)."""
        return {name: stats.snapshot() for name, stats in sorted(self.stats.items())}

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, timers: bool = True) -> None:
        """Start every app task, and (``timers``) a ticking task per timer; the test
        driver starts only the app tasks and fires timers by hand."""
        loop = asyncio.get_running_loop()
        for task in self.tasks.values():
            self._running.append(loop.create_task(self._run_task(task), name=task.name))
        if timers:
            for timer in self.timers.values():
                self._running.append(loop.create_task(self._tick(timer), name=timer.name))
        for name, stats in sorted(self.stats.items()):
            if stats.kind == "task" or timers:
                what = "app task" if stats.kind == "task" else "timer"
                where = "on the group's leader only" if stats.on_leader else "on every worker"
                log.info("%s %s started: %s, %s", what, name, stats.schedule, where)

    async def stop(self) -> None:
        """Cancel every timer and app task and await them (a run in progress is cancelled
        where it awaits); one still running after the stop timeout is named in a warning."""
        self._stopped = True
        running = [t for t in self._running if t is not asyncio.current_task()]
        self._running = []
        for task in running:
            task.cancel()
        if not running:
            return
        done, pending = await asyncio.wait(running, timeout=self._stop_timeout)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("%s ended with %r while stopping", task.get_name(), task.exception())
        if pending:
            log.warning(
                "timers or app tasks still running %.0fs after they were cancelled (they "
                "swallow cancellation?): %s",
                self._stop_timeout,
                ", ".join(sorted(t.get_name() for t in pending)),
            )

    # ------------------------------------------------------------------ timers

    async def run_timer(self, name: str) -> bool:
        """Run timer ``name`` once now, as a tick would (leader gate, ``on_error``,
        counters); False if the gate said no or it failed. For the test driver."""
        return await self._fire(self.timers[name])

    async def _tick(self, timer: Timer) -> None:
        schedule = timer.schedule
        stats = self.stats[timer.name]
        if isinstance(schedule, Every):
            start = self._clock()
            due = schedule.next_fire(start, start)
        else:
            due = schedule.next_fire(self._wall())
        while not self._stopped:
            now = self._clock() if isinstance(schedule, Every) else self._wall()
            stats.next_run_at = self._wall() + (due - now)
            await self._sleep(max(0.0, due - now))
            await self._fire(timer)
            if timer.on_error == "stop" and stats.errors:
                return  # the worker is stopping with the error
            if isinstance(schedule, Every):
                following = schedule.next_fire(start, max(self._clock(), due))
                missed = round((following - due) / schedule.seconds) - 1
            else:
                following = schedule.next_fire(max(self._wall(), due))
                missed = _misses(schedule, due, following)
            if missed > 0:
                stats.skipped_overrun += missed
                log.warning(
                    "timer %s: the run took %.3fs, past %d later ticks of its schedule (%s): "
                    "skipped",
                    timer.name,
                    stats.last_duration or 0.0,
                    missed,
                    schedule.describe(),
                )
            due = following

    async def _fire(self, timer: Timer) -> bool:
        """One tick: run ``timer`` if the gate lets it; True if it ran and returned."""
        stats = self.stats[timer.name]
        if timer.on_leader:
            leading = self._is_leader()
            if leading != stats.leading:
                what = "leads the group: runs" if leading else "does not lead the group: skips"
                log.info("timer %s: this worker %s its ticks", timer.name, what)
                stats.leading = leading
            if not should_run(timer.on_leader, leading):
                stats.skipped_not_leader += 1
                return False
        return await self._call(timer.name, "timer", timer.fun, timer.on_error, stats)

    async def _call(
        self,
        name: str,
        what: str,
        fun: Callable[[], Awaitable[None]],
        on_error: OnTimerError,
        stats: TimerStats,
    ) -> bool:
        """Await ``fun()``, counted in ``stats``; an error follows ``on_error``."""
        started = self._clock()
        stats.last_run_at = self._wall()
        stats.runs += 1
        stats.running = True
        try:
            await fun()
        except Exception as exc:
            self._failed(name, what, on_error, exc, stats)
            return False
        finally:
            stats.running = False
            stats.last_duration = self._clock() - started
        return True

    def _failed(
        self, name: str, what: str, on_error: OnTimerError, exc: Exception, stats: TimerStats
    ) -> None:
        stats.errors += 1
        self.counters.error(what.replace("app ", ""))
        if isinstance(exc, AgentFailed):  # a channel agent's (memory_channels): logged there
            self._on_crash(exc)
            return
        if on_error == "skip":
            after = "it runs again at its next tick" if what == "timer" else "it stays ended"
            log.warning("%s %s failed: %s; skipped (%s)", what, name, _say(exc), after)
            log.debug("traceback of %s %s", what, name, exc_info=exc)
            return
        log.error("%s %s failed: %s; stopping", what, name, _say(exc))
        log.debug("traceback of %s %s", what, name, exc_info=exc)
        failure = TimerFailed(f"{what} {name} failed: {_say(exc)}")
        failure.__cause__ = exc
        self._on_crash(failure)

    # ------------------------------------------------------------------ app tasks

    async def _run_task(self, task: AppTask) -> None:
        stats = self.stats[task.name]
        if not task.on_leader:
            await self._call(task.name, "app task", task.fun, task.on_error, stats)
            log.debug("app task %s ended", task.name)
            return
        while not self._stopped:
            if not should_run(True, self._is_leader()):
                await self._sleep(LEADER_POLL_SECONDS)
                continue
            log.info("app task %s starts: this worker leads the group", task.name)
            run = asyncio.get_running_loop().create_task(
                self._call(task.name, "app task", task.fun, task.on_error, stats),
                name=task.name,
            )
            try:
                while not run.done() and should_run(True, self._is_leader()):
                    await self._wait_or_poll(run)
            finally:
                if not run.done():
                    run.cancel()
                    await asyncio.gather(run, return_exceptions=True)
            if not run.cancelled():
                return  # it ended (returned, or failed under its on_error)
            log.info("app task %s cancelled: this worker no longer leads the group", task.name)

    async def _wait_or_poll(self, run: asyncio.Task[bool]) -> None:
        """Until ``run`` ends or one leader poll interval passed (on the injected sleep)."""
        poll: asyncio.Future[Any] = asyncio.ensure_future(self._sleep(LEADER_POLL_SECONDS))
        try:
            await asyncio.wait({run, poll}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)


def _misses(schedule: Crontab, due: float, following: float) -> int:
    """How many times of ``schedule`` lie strictly between ``due`` and ``following``."""
    missed, at = 0, schedule.next_fire(due)
    while at < following and missed < MAX_COUNTED_MISSES:
        missed += 1
        at = schedule.next_fire(at)
    return missed


def _say(exc: BaseException) -> str:
    """``Type: message (file:line)``, where the user's code raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{place}"
