"""Timers, crontabs and app tasks without a broker: the pure schedule and leader gate
(``streamjoin.timers``), the declarations (``app.timer``, ``app.crontab``, ``app.task``),
the runner (``runtime.scheduled``) on a fake clock, the test driver and the metrics."""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import streamjoin
from streamjoin.errors import ConfigurationError, TimerFailed
from streamjoin.runtime.metrics import WorkerCounters, samples
from streamjoin.runtime.ops.status_page import render_status_page
from streamjoin.runtime.scheduled import LEADER_POLL_SECONDS, ScheduledWork
from streamjoin.testing.driver import TestDriver
from streamjoin.timers import (
    AppTask,
    Crontab,
    Every,
    Timer,
    interval_seconds,
    should_run,
)

# ---------------------------------------------------------------------- the pure schedule


def test_an_interval_fires_one_interval_after_start_then_on_the_grid() -> None:
    every = Every(10.0)
    assert every.next_fire(100.0, 100.0) == 110.0
    assert every.next_fire(100.0, 109.999) == 110.0
    # exactly on a tick: the next one (a tick that ran is never run again)
    assert every.next_fire(100.0, 110.0) == 120.0
    # before start (a clock that went back): the first tick
    assert every.next_fire(100.0, 50.0) == 110.0


def test_an_interval_skips_the_ticks_a_run_overran() -> None:
    every = Every(10.0)
    # the run due at 110 ended at 135.5: 120 and 130 are skipped, 140 is next
    assert every.next_fire(100.0, 135.5) == 140.0
    # no drift however long the runs: still on start + k * interval
    assert every.next_fire(0.0, 1_000_003.7) == 1_000_010.0
    assert Every(0.1).next_fire(0.0, 0.3) > 0.3


def test_interval_seconds_takes_timedeltas_and_seconds() -> None:
    assert interval_seconds(timedelta(minutes=2), "t") == 120.0
    assert interval_seconds(5, "t") == 5.0
    assert interval_seconds(0.25, "t") == 0.25


@pytest.mark.parametrize("bad", [0, -1, 0.0, timedelta(0), float("nan"), float("inf"), True, "5"])
def test_interval_seconds_refuses_what_is_not_a_positive_duration(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"app\.timer"):
        interval_seconds(bad, "app.timer(...)")


def _at(*args: int, tz: Any = UTC) -> float:
    return datetime(*args, tzinfo=tz).timestamp()  # type: ignore[misc]


def test_a_crontab_fires_at_its_next_time() -> None:
    every_five = Crontab.parse("*/5 * * * *", None, "c")
    assert every_five.next_fire(_at(2026, 1, 1, 10, 2, 30)) == _at(2026, 1, 1, 10, 5)
    # exactly at a time: the next one
    assert every_five.next_fire(_at(2026, 1, 1, 10, 5)) == _at(2026, 1, 1, 10, 10)
    # an overrun skips the times it covered
    assert every_five.next_fire(_at(2026, 1, 1, 10, 17, 1)) == _at(2026, 1, 1, 10, 20)


def test_a_crontab_reads_its_times_in_its_timezone() -> None:
    paris = Crontab.parse("0 9 * * *", "Europe/Paris", "c")
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer
    assert paris.next_fire(_at(2026, 1, 15, 12)) == _at(2026, 1, 16, 8)
    assert paris.next_fire(_at(2026, 7, 15, 12)) == _at(2026, 7, 16, 7)
    assert paris.next_fire(_at(2026, 7, 15, 12)) == _at(2026, 7, 16, 9, tz=ZoneInfo("Europe/Paris"))


def test_a_crontab_takes_seconds_as_a_sixth_field() -> None:
    every_two_seconds = Crontab.parse("* * * * * */2", None, "c")
    assert every_two_seconds.next_fire(_at(2026, 1, 1, 0, 0, 0) + 0.5) == _at(2026, 1, 1, 0, 0, 2)


@pytest.mark.parametrize("bad", ["*/5 * * *", "61 * * * *", "every minute", ""])
def test_a_bad_cron_expression_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid cron expression"):
        Crontab.parse(bad, None, "app.crontab")


def test_an_unknown_timezone_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="unknown timezone 'Mars/Olympus'"):
        Crontab.parse("* * * * *", "Mars/Olympus", "app.crontab")


def test_the_leader_gate() -> None:
    assert should_run(on_leader=False, leading=False)
    assert should_run(on_leader=False, leading=True)
    assert should_run(on_leader=True, leading=True)
    assert not should_run(on_leader=True, leading=False)


# ---------------------------------------------------------------------- declarations


def test_the_app_declares_timers_crontabs_and_tasks_into_its_topology() -> None:
    app = streamjoin.App("timers-unit")

    @app.timer(timedelta(seconds=30), on_leader=True, name="sweep")
    async def sweep() -> None: ...

    @app.crontab("0 * * * *", timezone="Europe/Paris", on_error="skip")
    async def hourly(app: streamjoin.App) -> None: ...

    @app.task
    async def background() -> None: ...

    @app.task(on_leader=True, name="leading")
    async def leading() -> None: ...

    topology = app.topology()
    assert set(topology.timers) == {"sweep", f"{__name__}.{hourly.__qualname__}"}
    assert topology.timers["sweep"].schedule == Every(30.0)
    assert topology.timers["sweep"].on_leader
    cron = topology.timers[f"{__name__}.{hourly.__qualname__}"]
    assert cron.on_error == "skip"
    assert isinstance(cron.schedule, Crontab) and cron.schedule.timezone == ZoneInfo("Europe/Paris")
    assert set(topology.app_tasks) == {f"{__name__}.{background.__qualname__}", "leading"}
    assert topology.runs_on_leader
    assert not streamjoin.App("plain").topology().runs_on_leader


async def test_a_function_taking_the_app_is_given_it() -> None:
    app = streamjoin.App("timers-unit")
    seen: list[object] = []

    @app.timer(1, name="t")
    async def tick(given: streamjoin.App) -> None:
        seen.append(given)

    await app.topology().timers["t"].fun()
    assert seen == [app]


def test_declarations_are_checked() -> None:
    app = streamjoin.App("timers-unit")

    @app.timer(1, name="t")
    async def first() -> None: ...

    with pytest.raises(ConfigurationError, match="'t' is declared twice"):
        app.task(name="t")(first)
    with pytest.raises(ConfigurationError, match="must be an async function"):
        app.timer(1)(lambda: None)
    with pytest.raises(ConfigurationError, match="takes 2 arguments"):

        @app.timer(1)
        async def two(a: object, b: object) -> None: ...

    with pytest.raises(ConfigurationError, match="on_error must be 'stop' or 'skip'"):
        app.timer(1, on_error="dead_letter")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"app.timer\(0\): the interval must be more"):
        app.timer(0)
    with pytest.raises(ConfigurationError, match="invalid cron expression '\\* \\*'"):
        app.crontab("* *")


# ---------------------------------------------------------------------- the runner


class FakeTime:
    """A monotonic clock and a wall clock that move only when told; sleeps wait on them."""

    def __init__(self, wall_start: float = 1_000_000.0) -> None:
        self.now = 0.0
        self._wall_offset = wall_start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self._wall_offset

    async def sleep(self, delay: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._sleepers, (self.now + delay, self._seq, future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, waking each sleeper at its deadline in order."""
        target = self.now + seconds
        await settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, deadline)
            if not future.done():
                future.set_result(None)
            await settle()
        self.now = target
        await settle()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class Leader:
    def __init__(self, leading: bool = True) -> None:
        self.leading = leading

    def __call__(self) -> bool:
        return self.leading


def runner(
    time: FakeTime,
    timers: list[Timer] = [],  # noqa: B006 (never mutated)
    tasks: list[AppTask] = [],  # noqa: B006
    *,
    leader: Callable[[], bool] = lambda: True,
    crashes: list[BaseException] | None = None,
) -> ScheduledWork:
    return ScheduledWork(
        timers,
        tasks,
        is_leader=leader,
        on_crash=(crashes if crashes is not None else []).append,
        counters=WorkerCounters(),
        clock=time.clock,
        wall_clock=time.wall,
        sleep=time.sleep,
    )


async def test_an_interval_timer_runs_once_per_interval() -> None:
    time = FakeTime()
    runs: list[float] = []

    async def tick() -> None:
        runs.append(time.now)

    work = runner(time, [Timer("t", tick, Every(10.0))])
    work.start()
    await time.advance(35.0)
    assert runs == [10.0, 20.0, 30.0]
    stats = work.snapshot()["t"]
    assert stats["runs"] == 3 and stats["errors"] == 0 and stats["kind"] == "interval"
    assert stats["next_run_at"] == time.wall() + 5.0
    await work.stop()


async def test_a_slow_run_delays_the_next_tick_and_skips_the_overrun_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    starts: list[float] = []
    active = 0
    most = 0

    async def slow() -> None:
        nonlocal active, most
        starts.append(time.now)
        active += 1
        most = max(most, active)
        if len(starts) == 1:
            await time.sleep(25.0)  # the run due at 10 ends at 35: 20 and 30 are skipped
        active -= 1

    work = runner(time, [Timer("slow", slow, Every(10.0))])
    work.start()
    with caplog.at_level(logging.WARNING, logger="streamjoin.timers"):
        await time.advance(55.0)
    assert starts == [10.0, 40.0, 50.0]
    assert most == 1
    assert work.stats["slow"].skipped_overrun == 2
    assert work.stats["slow"].last_duration == 0.0
    assert "timer slow: the run took 25.000s, past 2 later ticks" in caplog.text
    await work.stop()


async def test_a_crontab_runs_at_its_wall_clock_times() -> None:
    start = _at(2026, 1, 1, 0, 0, 3)
    time = FakeTime(wall_start=start)
    runs: list[float] = []

    async def tick() -> None:
        runs.append(time.wall())

    work = runner(time, [Timer("c", tick, Crontab.parse("* * * * * */10", None, "c"))])
    work.start()
    await time.advance(30.0)
    assert runs == [start + 7, start + 17, start + 27]
    assert work.snapshot()["c"]["kind"] == "crontab"
    await work.stop()


async def test_an_on_leader_timer_runs_only_while_this_worker_leads() -> None:
    time = FakeTime()
    leader = Leader(leading=False)
    runs: list[float] = []

    async def tick() -> None:
        runs.append(time.now)

    work = runner(time, [Timer("t", tick, Every(1.0), on_leader=True)], leader=leader)
    work.start()
    await time.advance(2.5)
    leader.leading = True  # a leader change: asked again at each tick
    await time.advance(2.0)
    leader.leading = False
    await time.advance(2.0)
    assert runs == [3.0, 4.0]
    assert work.stats["t"].skipped_not_leader == 4
    await work.stop()


async def test_an_error_under_skip_is_logged_counted_and_the_timer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    crashes: list[BaseException] = []

    async def flaky() -> None:
        raise ValueError("no database")

    work = runner(time, [Timer("flaky", flaky, Every(1.0), on_error="skip")], crashes=crashes)
    work.start()
    with caplog.at_level(logging.WARNING, logger="streamjoin.timers"):
        await time.advance(3.0)
    assert crashes == []
    assert work.stats["flaky"].runs == 3 and work.stats["flaky"].errors == 3
    assert work.counters.errors == {"timer": 3}
    assert "timer flaky failed: ValueError: no database" in caplog.text
    assert "skipped (it runs again at its next tick)" in caplog.text
    await work.stop()


async def test_an_error_under_stop_stops_the_worker_with_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    crashes: list[BaseException] = []
    runs = 0

    async def broken() -> None:
        nonlocal runs
        runs += 1
        raise KeyError("gone")

    work = runner(time, [Timer("broken", broken, Every(1.0))], crashes=crashes)
    work.start()
    with caplog.at_level(logging.ERROR, logger="streamjoin.timers"):
        await time.advance(5.0)
    assert runs == 1  # it ticks no more
    [failure] = crashes
    assert isinstance(failure, TimerFailed)
    assert "timer broken failed: KeyError: 'gone'" in str(failure)
    assert isinstance(failure.__cause__, KeyError)
    assert "timer broken failed: KeyError: 'gone'" in caplog.text and "stopping" in caplog.text
    await work.stop()


async def test_stop_cancels_a_run_in_progress_and_awaits_it() -> None:
    time = FakeTime()
    cancelled = asyncio.Event()

    async def long_run() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    work = runner(time, [Timer("long", long_run, Every(1.0))])
    work.start()
    await time.advance(1.0)
    assert work.stats["long"].running
    running = list(work._running)
    await work.stop()
    assert cancelled.is_set()
    assert all(task.done() for task in running)
    assert not work.stats["long"].running


async def test_an_app_task_starts_once_and_is_cancelled_on_stop() -> None:
    time = FakeTime()
    started = 0
    cancelled = asyncio.Event()

    async def background() -> None:
        nonlocal started
        started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    work = runner(time, tasks=[AppTask("bg", background)])
    work.start()
    await time.advance(100.0)
    assert started == 1
    await work.stop()
    assert cancelled.is_set()
    assert work.snapshot()["bg"]["kind"] == "task"


async def test_an_app_task_that_fails_under_skip_stays_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    crashes: list[BaseException] = []

    async def once() -> None:
        raise RuntimeError("boom")

    work = runner(time, tasks=[AppTask("once", once, on_error="skip")], crashes=crashes)
    with caplog.at_level(logging.WARNING, logger="streamjoin.timers"):
        work.start()
        await time.advance(10.0)
    assert crashes == [] and work.stats["once"].errors == 1 and work.stats["once"].runs == 1
    assert "app task once failed: RuntimeError: boom" in caplog.text
    assert work.counters.errors == {"task": 1}
    await work.stop()


async def test_an_on_leader_app_task_runs_while_leading_and_restarts_on_leading_again() -> None:
    time = FakeTime()
    leader = Leader(leading=False)
    starts: list[float] = []
    cancels: list[float] = []

    async def leading() -> None:
        starts.append(time.now)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancels.append(time.now)
            raise

    work = runner(time, tasks=[AppTask("lead", leading, on_leader=True)], leader=leader)
    work.start()
    await time.advance(2.0)
    assert starts == []
    leader.leading = True
    await time.advance(LEADER_POLL_SECONDS)
    assert len(starts) == 1
    leader.leading = False
    await time.advance(LEADER_POLL_SECONDS)
    assert len(cancels) == 1
    leader.leading = True
    await time.advance(LEADER_POLL_SECONDS)
    assert len(starts) == 2
    await work.stop()
    assert len(cancels) == 2


# ---------------------------------------------------------------------- driver and metrics


async def test_the_driver_fires_timers_by_hand_and_runs_app_tasks() -> None:
    app = streamjoin.App("timers-driver")
    out = app.topic("ticks", partitions=1, value_serializer="str")
    task_ran = asyncio.Event()

    @app.timer(60.0, name="every-minute")
    async def every_minute() -> None:
        await out.send(value="tick")

    @app.timer(60.0, on_leader=True, name="leader-only")
    async def leader_only() -> None:
        await out.send(value="leader")

    @app.task
    async def background() -> None:
        task_ran.set()

    async with TestDriver(app) as driver:
        await asyncio.wait_for(task_ran.wait(), 1.0)
        assert await driver.run_timers() == ["every-minute", "leader-only"]
        driver.leader = False
        assert await driver.run_timers() == ["every-minute"]
        assert await driver.run_timers("leader-only") == []
        with pytest.raises(ConfigurationError, match="no timer named nope"):
            await driver.run_timers("nope")
    assert [e.value for e in driver.records("ticks")] == ["tick", "leader", "tick"]


async def test_the_driver_raises_a_timer_failure_under_stop() -> None:
    app = streamjoin.App("timers-driver-fail")

    @app.timer(1.0, name="broken")
    async def broken() -> None:
        raise ValueError("bad")

    async with TestDriver(app) as driver:
        with pytest.raises(TimerFailed, match="timer broken failed: ValueError: bad"):
            await driver.run_timers()


def test_the_timer_metrics_are_exported_per_timer() -> None:
    snapshot = {
        "timers": {
            "sweep": {
                "runs": 4,
                "errors": 1,
                "last_duration_seconds": 0.25,
                "skipped_overrun": 2,
                "skipped_not_leader": 0,
            }
        }
    }
    values = samples(snapshot)
    assert values["streamjoin_timer_runs"] == [(("sweep",), 4.0)]
    assert values["streamjoin_timer_errors"] == [(("sweep",), 1.0)]
    assert values["streamjoin_timer_last_duration_seconds"] == [(("sweep",), 0.25)]
    assert values["streamjoin_timer_ticks_skipped"] == [
        (("sweep", "overrun"), 2.0),
        (("sweep", "not_leader"), 0.0),
    ]


def test_the_status_page_lists_timers() -> None:
    snapshot = {"timers": {"sweep": {"kind": "interval", "schedule": "every 30s", "runs": 4}}}
    page = render_status_page(snapshot, now=0.0)
    assert "<h2>Timers and app tasks</h2>" in page
    assert ">sweep<" in page and ">every 30s<" in page
    assert "Timers and app tasks" not in render_status_page({}, now=0.0)
