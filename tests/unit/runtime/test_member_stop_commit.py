"""A stop that lands while the commit loop commits lets that commit finish.

Cut short, an exactly-once commit leaves its transaction half done: the sends it held for
the next transaction are released only by the ``begin()`` it never reaches, so the stop's
final commit takes their events' offsets (and table writes) without them, and the stop
aborts them. Found by tests/integration/test_table_kinds_rebalance.py (a foreign-key
join's subscriptions lost when a worker left with SIGTERM).
"""

from __future__ import annotations

import asyncio
from typing import Any

from streamjoin.runtime.member import GroupMember
from streamjoin.runtime.metrics import WorkerCounters


class _Fetcher:
    """Started, and never returns records (only the commit loop works)."""

    started = True
    epoch = 0

    async def getmany(self, timeout_ms: int) -> dict[Any, Any]:
        await asyncio.Event().wait()
        return {}


class _Processing:
    """A commit that waits until released, and says whether it ran to its end."""

    def __init__(self) -> None:
        self.began = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = False

    async def commit(self, tasks: object = None) -> dict[Any, int]:
        self.began.set()
        await self.release.wait()
        self.finished = True
        return {}


def _fatal(exc: BaseException) -> None:
    raise AssertionError(f"unexpected fatal error: {exc!r}")


async def test_a_stop_during_a_commit_lets_the_commit_finish() -> None:
    processing = _Processing()
    member = GroupMember(
        _Fetcher(),  # type: ignore[arg-type]
        processing,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        commit_interval=0.01,
        counters=WorkerCounters(),
        on_fatal=_fatal,
        on_assignment=lambda tps: None,
        on_revoke=lambda tasks: None,
    )
    await member.start()
    await asyncio.wait_for(processing.began.wait(), 5)
    await asyncio.wait_for(member.stop(), 5)  # (cancels the loops)
    processing.release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert processing.finished, "the stop cut the commit under way short"
