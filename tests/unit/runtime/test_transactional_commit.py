"""The exactly-once commit path of TaskProcessing, in memory (the broker tests are in
tests/integration/test_exactly_once*.py): a snapshot between events, stores written only
after the transaction commits, and an abort that loses every task."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

import streamjoin
from streamjoin.errors import TransactionFailed
from streamjoin.runtime.table_state.flush import Sending, TakenWrites, send_writes
from streamjoin.runtime.tasks.processing import MAX_ABORTS_IN_A_ROW, TaskProcessing
from streamjoin.runtime.tasks.task import TaskState
from streamjoin.stream import Stream
from streamjoin.tables import Table
from streamjoin.testing.driver import TestDriver
from tests.unit.runtime.counting_app import counting_app


class FakeTransaction:
    """A transaction whose commit can be held (``gate``) or made to fail (``fail_with``)."""

    def __init__(self, driver: TestDriver, tables: Mapping[str, Table]) -> None:
        self.driver = driver
        self.tables = tables
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_commit = asyncio.Event()
        self.fail_with: TransactionFailed | None = None
        self.sends_open = True
        self.committed: list[dict[tuple[str, int], int]] = []
        self.aborts = 0
        self.begins = 0
        self.has_data = False

    def close_sends(self) -> None:
        self.sends_open = False

    async def reopen(self) -> None:
        self.sends_open = True

    async def send_writes(self, taken: list[TakenWrites]) -> list[Sending]:
        self.has_data = self.has_data or bool(taken)
        return await send_writes(taken, self.tables, self.driver)

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.in_commit.set()
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        self.committed.append(dict(offsets))

    async def begin(self) -> None:
        self.begins += 1
        self.has_data = False
        self.sends_open = True

    async def abort(self) -> None:
        self.aborts += 1
        await self.begin()


def _transactional(driver: TestDriver) -> tuple[TaskProcessing, FakeTransaction, list[str]]:
    processing, topology, runtime = driver.processing, driver.topology, driver.runtime
    assert processing is not None and topology is not None and runtime is not None
    txn = FakeTransaction(driver, topology.tables)
    aborted: list[str] = []
    runtime.transactional = True
    processing.transaction = txn
    processing._on_transaction_aborted = lambda exc: aborted.append(str(exc))
    return processing, txn, aborted


async def _process(driver: TestDriver, n: int) -> None:
    for _ in range(n):
        await driver.put("clicks", key="a", value=1)
    for _ in range(50):
        await asyncio.sleep(0)


async def test_stores_get_a_commits_writes_only_once_the_transaction_committed() -> None:
    app, _counts = counting_app("txn-store-after-commit")
    async with TestDriver(app) as driver:
        processing, txn, _ = _transactional(driver)
        await _process(driver, 3)
        (task,) = processing.tasks.live()
        store = task.tables["counts"].store
        txn.gate.clear()
        commit = asyncio.create_task(processing.commit())
        await txn.in_commit.wait()
        assert store.get(b"a") is None, "written to the store before the transaction committed"
        assert not txn.sends_open, "sends must wait while the transaction ends"
        txn.gate.set()
        assert await commit == {("clicks", 0): 3}
        assert store.get(b"a") == b"3"
        assert txn.committed == [{("clicks", 0): 3}] and txn.sends_open


async def test_an_aborted_transaction_loses_every_task_and_leaves_the_stores_alone() -> None:
    app, _counts = counting_app("txn-abort")
    async with TestDriver(app) as driver:
        processing, txn, aborted = _transactional(driver)
        await _process(driver, 2)
        assert await processing.commit() == {("clicks", 0): 2}
        await _process(driver, 3)
        (task,) = processing.tasks.live()
        store = task.tables["counts"].store
        txn.fail_with = TransactionFailed("injected", fenced=False)
        assert await processing.commit() == {}
        assert task.state is TaskState.LOST and processing.tasks.live() == []
        assert store.get(b"a") == b"2", "an aborted transaction's writes reached the store"
        assert txn.aborts == 1 and len(aborted) == 1 and "injected" in aborted[0]
        assert txn.committed == [{("clicks", 0): 2}]


async def test_aborts_that_keep_coming_back_stop_the_worker() -> None:
    app, _counts = counting_app("txn-abort-loop")
    async with TestDriver(app) as driver:
        processing, txn, _ = _transactional(driver)
        txn.fail_with = TransactionFailed("not allowed to write", fenced=False)
        for _ in range(MAX_ABORTS_IN_A_ROW - 1):
            await driver.assign([("clicks", 0)])
            await _process(driver, 1)
            assert await processing.commit() == {}
        await driver.assign([("clicks", 0)])
        await _process(driver, 1)
        with pytest.raises(TransactionFailed, match="in a row"):
            await processing.commit()
        txn.fail_with = None


async def test_a_fenced_worker_rejoins_however_often_it_is_fenced() -> None:
    app, _counts = counting_app("txn-fenced")
    async with TestDriver(app) as driver:
        processing, txn, aborted = _transactional(driver)
        txn.fail_with = TransactionFailed("partitions moved", fenced=True)
        for _ in range(MAX_ABORTS_IN_A_ROW + 1):
            await driver.assign([("clicks", 0)])
            await _process(driver, 1)
            assert await processing.commit() == {}
        assert len(aborted) == MAX_ABORTS_IN_A_ROW + 1
        txn.fail_with = None


async def test_the_snapshot_waits_for_an_event_in_progress() -> None:
    """An event half processed (a table written, then an await) at the snapshot would put
    its writes in one transaction and its offset in the next."""
    app = streamjoin.App("txn-snapshot", topic_partitions=1)
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=1)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=clicks)
    inside, release = asyncio.Event(), asyncio.Event()

    @app.agent(clicks)
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1
            inside.set()
            await release.wait()
            counts[event.key] += 10

    async with TestDriver(app) as driver:
        processing, txn, _ = _transactional(driver)
        await driver.put("clicks", key="a", value=1)
        await inside.wait()
        commit = asyncio.create_task(processing.commit())
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert not txn.in_commit.is_set(), "the snapshot was taken inside an event"
        release.set()
        assert await commit == {("clicks", 0): 1}
        (task,) = processing.tasks.live()
        assert task.tables["counts"].store.get(b"a") == b"11"


async def test_a_commit_with_nothing_to_commit_keeps_the_transaction_open() -> None:
    app, _counts = counting_app("txn-idle")
    async with TestDriver(app) as driver:
        processing, txn, _ = _transactional(driver)
        assert await processing.commit() == {}
        assert txn.begins == 0 and not txn.in_commit.is_set() and txn.sends_open


async def test_sends_of_an_event_in_progress_when_a_transaction_aborts_are_dropped() -> None:
    """An event of a lost task that is still being processed when the abort begins must
    finish before the abort: its sends (held for the next transaction) are dropped with the
    aborted one, never committed without their offset."""
    app = streamjoin.App("txn-abort-inflight", topic_partitions=1)
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=1)
    inside, release = asyncio.Event(), asyncio.Event()

    @app.agent(clicks)
    async def slow(stream: Stream) -> None:
        async for _event in stream:
            inside.set()
            await release.wait()

    async with TestDriver(app) as driver:
        processing, txn, _ = _transactional(driver)
        await driver.put("clicks", key="a", value=1)
        await inside.wait()
        txn.fail_with = TransactionFailed("injected", fenced=True)
        assert processing.tasks.live()
        transaction = processing.transaction
        assert transaction is not None
        abort = asyncio.create_task(processing._aborted(transaction, txn.fail_with))
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert txn.aborts == 0 and not txn.sends_open, "aborted while an event was in progress"
        release.set()
        await abort
        assert txn.aborts == 1 and txn.sends_open
        txn.fail_with = None


async def test_a_failing_part_of_the_commit_cancels_the_other_before_raising() -> None:
    """The flush and the offsets request run together; when one fails, the other must not
    go on into the next transaction (plain ``asyncio.gather`` would leave it running)."""
    from streamjoin.runtime.group.transaction import gather_or_cancel

    offsets_request_ended = asyncio.Event()
    cancelled: list[bool] = []

    async def flush() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("flush failed")

    async def add_offsets() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        finally:
            offsets_request_ended.set()

    with pytest.raises(RuntimeError, match="flush failed"):
        await gather_or_cancel(flush(), add_offsets())
    assert offsets_request_ended.is_set() and cancelled == [True]
    assert await gather_or_cancel(asyncio.sleep(0, "a"), asyncio.sleep(0, "b")) == ["a", "b"]


def _two_agents_on_one_topic(
    name: str, *, take: bool = False
) -> tuple[streamjoin.App, asyncio.Event, list[int]]:
    """A counting agent and a second agent on the same topic that waits for ``release``
    before each event (or batch): the counter runs ahead of it."""
    app = streamjoin.App(name, broker="kafka://127.0.0.1:1", topic_partitions=1)
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json")
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=clicks)
    release = asyncio.Event()
    slow_seen: list[int] = []

    @app.agent(clicks, name="counter")
    async def counter(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    if take:

        @app.agent(clicks, name="slow")
        async def slow_batches(stream: Stream) -> None:
            async for batch in stream.take(2, within=30):
                await release.wait()
                slow_seen.extend(event.offset for event in batch)

    else:

        @app.agent(clicks, name="slow")
        async def slow(stream: Stream) -> None:
            async for event in stream:
                await release.wait()
                slow_seen.append(event.offset)

    return app, release, slow_seen


@pytest.mark.parametrize("take", [False, True], ids=["one at a time", "stream.take"])
async def test_agents_sharing_a_topic_commit_their_writes_with_their_offsets(take: bool) -> None:
    """The counter is three events ahead of the other agent on the same partition when the
    commit starts: the snapshot must not hold counts of events whose offset it does not
    commit (a restart would count them again). The commit waits for the slow agent to
    process what it was given, then commits all of it."""
    app, release, slow_seen = _two_agents_on_one_topic(f"txn-shared-{take}", take=take)
    async with TestDriver(app) as driver:
        processing, txn, _ = _transactional(driver)
        await _process(driver, 3)
        (task,) = processing.tasks.live()
        assert task.tables["counts"].lookup(b"a") == b"3" and slow_seen == []
        commit = asyncio.create_task(processing.commit())
        await asyncio.sleep(0.05)
        assert not commit.done(), "committed while an agent on the topic was behind"
        release.set()
        # (a batch being filled is handed out at once, not after its 30 s)
        positions = await asyncio.wait_for(commit, 5)
        assert slow_seen == [0, 1, 2]
        assert positions == {("clicks", 0): 3} and txn.committed == [positions]
        assert task.tables["counts"].store.get(b"a") == b"3"
        # records put meanwhile were handed out once the snapshot was taken
        await _process(driver, 2)
        assert slow_seen == [0, 1, 2, 3, 4]
