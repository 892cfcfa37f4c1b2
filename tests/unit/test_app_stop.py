"""``App.stop()`` (and so ``async with app:``) returns only once the worker has stopped,
also when a fatal error's stop was already under way: a second stop of the worker returns
at once, and an app started again in the same process found its state directory still
locked (``StateDirInUse``)."""

from __future__ import annotations

import asyncio

import streamjoin


class _StoppingWorker:
    """A worker whose stop, started by a fatal error, is still running: ``stop()`` returns
    at once (mode's second stop), ``stopped()`` when that first stop is done."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.failure: BaseException | None = None

    async def stop(self) -> None:
        return

    async def stopped(self) -> None:
        await self.done.wait()


async def test_stop_waits_for_a_stop_already_under_way() -> None:
    app = streamjoin.App("stop-waits")
    worker = _StoppingWorker()
    app._worker = worker  # type: ignore[assignment]
    stopping = asyncio.ensure_future(app.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done(), "App.stop() returned while the worker was still stopping"
    worker.done.set()
    await asyncio.wait_for(stopping, timeout=5)
