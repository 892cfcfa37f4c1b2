"""A transaction's commit that waits past the transaction timeout is reported every
``commit_stall_after`` seconds (the worker then closes its connections, in case one went
silent); a commit that finishes in time is not, and the watch ends with the commit.
tests/integration/test_network_faults.py runs it against half-open connections."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

import streamjoin
from streamjoin.runtime.table_state.flush import TableFlusher
from streamjoin.runtime.tasks.alignment import TimestampAligner
from streamjoin.runtime.tasks.processing import TaskProcessing
from streamjoin.runtime.tasks.task import TaskManager
from streamjoin.runtime.transport.connections import ALL_NODES, drop_connections
from tests.unit.runtime.test_silent_connections import ConnectedClient, FakeConnection


class _Barrier:
    async def settle_shared(self, timeout: float) -> bool:
        return True

    async def quiesce(self, timeout: float) -> bool:
        return True

    def resume(self) -> None:
        pass

    def open_dispatch(self) -> None:
        pass


class _Runtime:
    topics: frozenset[str] = frozenset()
    barrier = _Barrier()


class _Sender:
    async def flush(self) -> None:
        pass


class _Transaction:
    """Has data to commit; its commit waits until :attr:`release` is set."""

    has_data = True

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.commits = 0
        self.begun = 0
        self.aborts = 0

    def close_sends(self) -> None:
        pass

    async def send_writes(self, taken: list[Any]) -> list[Any]:
        return []

    async def commit(self, offsets: Mapping[Any, int]) -> None:
        await self.release.wait()
        self.commits += 1

    async def reopen(self) -> None:
        pass

    async def begin(self) -> None:
        self.begun += 1

    async def abort(self) -> None:
        self.aborts += 1

    def waiting_on(self) -> str:
        return "the test's release"


def _processing(
    transaction: _Transaction,
    stalls: list[tuple[float, str]],
    give_up_after: float | None = None,
) -> TaskProcessing:
    app = streamjoin.App("commit-watchdog")
    return TaskProcessing(
        TaskManager(app.topology()),
        _Runtime(),  # type: ignore[arg-type]
        TimestampAligner([], max_idle_ms=5_000),
        flusher=TableFlusher(_Sender(), {}, flush_sends=_Sender().flush),  # type: ignore[arg-type]
        offsets=None,  # type: ignore[arg-type]
        transaction=transaction,  # type: ignore[arg-type]
        on_commit_stalled=lambda waited, what: stalls.append((waited, what)),
        commit_stall_after=0.05,
        commit_give_up_after=give_up_after,
        on_transaction_aborted=lambda reason: None,
    )


async def test_a_commit_waiting_past_the_stall_bound_is_reported_until_it_ends() -> None:
    transaction, stalls = _Transaction(), []
    processing = _processing(transaction, stalls)
    commit = asyncio.ensure_future(processing.commit())
    await asyncio.sleep(0.18)
    assert [waited for waited, _ in stalls] == pytest.approx([0.05, 0.1, 0.15])
    # (each report says what the commit waits for)
    assert {what for _, what in stalls} == {"committing: the test's release"}
    transaction.release.set()
    await commit
    assert (transaction.commits, transaction.begun) == (1, 1)
    await asyncio.sleep(0.12)
    assert len(stalls) == 3  # (the watch ended with the commit)


async def test_a_commit_in_time_is_not_reported() -> None:
    transaction, stalls = _Transaction(), []
    transaction.release.set()
    processing = _processing(transaction, stalls)
    await processing.commit()
    await asyncio.sleep(0.12)
    assert stalls == []
    assert transaction.commits == 1


async def test_a_commit_waiting_past_the_give_up_bound_is_aborted() -> None:
    """A commit that never finishes (a wedged producer) is given up after
    ``commit_give_up_after`` seconds and aborted like a failed one: the worker goes on
    instead of leaving its partitions unprocessed."""
    transaction, stalls = _Transaction(), []
    processing = _processing(transaction, stalls, give_up_after=0.15)
    committed = await asyncio.wait_for(processing.commit(), timeout=5)
    assert committed == {}
    assert (transaction.commits, transaction.aborts, transaction.begun) == (0, 1, 0)
    assert [waited for waited, _ in stalls] == pytest.approx([0.05, 0.1])


def test_dropping_every_connection_closes_them_for_all_brokers() -> None:
    client = ConnectedClient([], {})
    conns = {(1, 0): FakeConnection(), (2, 0): FakeConnection(), (3, 1): FakeConnection()}
    client._conns = {**conns, ("1", "x"): None}  # (a key of another shape is left alone)
    assert drop_connections(client, ALL_NODES) == 3
    assert all(c.closed_for is not None for c in conns.values())
