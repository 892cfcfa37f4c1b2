"""Restoring tables through the raw changelog reader, on the real broker.

Changelogs with offset gaps: transaction markers (committed and aborted
transactions), tombstones, and a log the broker's cleaner really compacted.
Each restore is checked for exact store contents and stored changelog offsets.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from streamjoin.app import App
from streamjoin.errors import ChangelogOffsetOutOfRange
from streamjoin.runtime.table_state.changelog_reader import ChangelogReader
from streamjoin.runtime.table_state.changelog_records import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Record,
)
from streamjoin.runtime.table_state.service import StateService, TableStores
from streamjoin.runtime.transport.topic_admin import TopicSpec, ensure_topics

TABLE = "items"
PARTITIONS = 2
Write = tuple[int, bytes, bytes | None]  # partition, key, value (None: tombstone)


@pytest.fixture
async def producers(kafka_bootstrap: str) -> AsyncIterator[Callable[..., AIOKafkaProducer]]:
    started: list[AIOKafkaProducer] = []

    def make(**options: object) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=0, **options)
        started.append(producer)
        return producer

    yield make
    for producer in started:
        await producer.stop()


def expected_state(writes: list[Write]) -> dict[int, dict[bytes, bytes]]:
    state: dict[int, dict[bytes, bytes]] = {p: {} for p in range(PARTITIONS)}
    for partition, key, value in writes:
        if value is None:
            state[partition].pop(key, None)
        else:
            state[partition][key] = value
    return state


async def restore(
    app: App, partitions: set[int], standby: set[int] | None = None
) -> tuple[StateService, TableStores]:
    """A started StateService with these partitions assigned, once the active ones are ready."""
    stores = TableStores(app.tables, app.config.state_path)
    ready: set[int] = set()
    all_ready = asyncio.Event()

    def on_ready(name: str, partition: int, store: Any) -> None:
        ready.add(partition)
        if ready >= partitions:
            all_ready.set()

    service = StateService(
        stores, bootstrap_servers=app.config.broker, client_options={}, on_ready=on_ready
    )
    await service.start()
    service.set_assignment({TABLE: set(partitions)}, {TABLE: set(standby or ())})
    if partitions:
        await asyncio.wait_for(all_ready.wait(), timeout=60)
    return service, stores


def contents(stores: TableStores, partition: int) -> dict[bytes, bytes]:
    store = stores.get(TABLE, partition)
    assert store is not None, f"partition {partition} is not open"
    return dict(store.items())


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    reader = ChangelogReader(bootstrap)
    await reader.start()
    try:
        ends = await reader.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        await reader.close()
    return {tp.partition: offset for tp, offset in ends.items()}


def new_app(kafka_bootstrap: str, unique_topic: Callable[..., str], state_dir: Path) -> App:
    app = App(unique_topic("app"), broker=f"kafka://{kafka_bootstrap}", state_dir=state_dir)
    app.table(TABLE, partitions=PARTITIONS)
    return app


async def test_restore_across_transaction_markers_and_tombstones(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    producers: Callable[..., AIOKafkaProducer],
    tmp_path: Path,
) -> None:
    app = new_app(kafka_bootstrap, unique_topic, tmp_path / "a")
    topic = app.tables[TABLE].changelog.name
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(topic, PARTITIONS, config={"cleanup.policy": "compact"})]
    )
    plain = producers()
    txn = producers(transactional_id=f"tx-{uuid.uuid4().hex}")
    await plain.start()
    await txn.start()
    writes: list[Write] = []

    async def send(
        producer: AIOKafkaProducer, partition: int, key: bytes, value: bytes | None
    ) -> None:
        await producer.send(topic, value, key=key, partition=partition)
        writes.append((partition, key, value))

    for i in range(30):
        await send(plain, i % PARTITIONS, b"k%d" % (i % 7), b"plain-%d" % i)
    await plain.flush()
    for round_ in range(3):  # each commit leaves a marker (an offset gap) in both partitions
        async with txn.transaction():
            for i in range(10):
                await send(txn, i % PARTITIONS, b"k%d" % (i % 9), b"txn-%d-%d" % (round_, i))
            await send(txn, 0, b"k0", None)  # a tombstone
    for i in range(4):
        await send(plain, i % PARTITIONS, b"late-%d" % i, b"plain-late-%d" % i)
    await plain.flush()
    async with txn.transaction():  # the log ends with markers: the last offsets hold no data
        await send(txn, 1, b"k1", b"txn-last")
        await send(txn, 0, b"k2", None)

    ends = await end_offsets(kafka_bootstrap, topic)
    expected = expected_state(writes)
    service, stores = await restore(app, {0, 1})
    try:
        assert service.restored_records == len(writes)  # data records only, not markers
        for partition in range(PARTITIONS):
            store = stores.get(TABLE, partition)
            assert store is not None
            assert contents(stores, partition) == expected[partition]
            # the trailing marker counts as read: the store is caught up, not one behind
            assert store.changelog_offset() == ends[partition] - 1
    finally:
        await service.stop()

    # a restart on the same state finds nothing to replay and reports no lag
    again, stores = await restore(app, {0, 1})
    try:
        assert again.restored_records == 0
        assert again.lags()[topic] == {0: 0, 1: 0}
        assert contents(stores, 1) == expected[1]
    finally:
        await again.stop()


async def test_a_standby_follows_the_changelog_across_markers(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    producers: Callable[..., AIOKafkaProducer],
    tmp_path: Path,
) -> None:
    app = new_app(kafka_bootstrap, unique_topic, tmp_path / "s")
    topic = app.tables[TABLE].changelog.name
    await ensure_topics(
        kafka_bootstrap, [TopicSpec(topic, PARTITIONS, config={"cleanup.policy": "compact"})]
    )
    txn = producers(transactional_id=f"tx-{uuid.uuid4().hex}")
    await txn.start()
    service, stores = await restore(app, set(), standby={0})
    try:
        async with txn.transaction():
            await txn.send(topic, b"v1", key=b"a", partition=0)
            await txn.send(topic, b"v2", key=b"b", partition=0)
        async with txn.transaction():
            await txn.send(topic, None, key=b"a", partition=0)
        end = (await end_offsets(kafka_bootstrap, topic))[0]
        deadline = time.monotonic() + 30
        store = None
        while time.monotonic() < deadline:
            store = stores.get(TABLE, 0)
            if store is not None and store.changelog_offset() == end - 1:
                break
            await asyncio.sleep(0.1)
        assert store is not None and store.changelog_offset() == end - 1
        assert contents(stores, 0) == {b"b": b"v2"}
    finally:
        await service.stop()


async def test_restore_of_a_compacted_changelog(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    producers: Callable[..., AIOKafkaProducer],
    tmp_path: Path,
) -> None:
    app = new_app(kafka_bootstrap, unique_topic, tmp_path / "c")
    topic = app.tables[TABLE].changelog.name
    config = {
        "cleanup.policy": "compact",
        # roll segments almost at once and clean anything dirty: the cleaner (which runs
        # every 15 s by default) compacts all but the active segment
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0",
    }
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, PARTITIONS, config=config)])
    producer = producers()
    await producer.start()
    writes: list[Write] = []

    async def send(partition: int, key: bytes, value: bytes | None) -> None:
        await producer.send_and_wait(topic, value, key=key, partition=partition)
        writes.append((partition, key, value))

    for i in range(200):
        await send(i % PARTITIONS, b"k%d" % (i % 10), b"v%d" % i)
    await send(0, b"k0", None)

    # wait for the cleaner: reading the whole log returns fewer records than offsets
    reader = ChangelogReader(kafka_bootstrap)
    await reader.start()
    tp = TopicPartition(topic, 1)
    deadline = time.monotonic() + 90
    try:
        while True:
            await asyncio.sleep(0.5)
            await send(1, b"roll", b"r%d" % len(writes))  # rolls the aged segment
            end = (await reader.end_offsets([tp]))[tp]
            records = await read_range(reader, tp, 0, end)
            if len(records) < end:
                break
            assert time.monotonic() < deadline, "the log cleaner never compacted the changelog"
    finally:
        await reader.close()
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    ends = await end_offsets(kafka_bootstrap, topic)
    service, stores = await restore(app, {0, 1})
    try:
        expected = expected_state(writes)
        for partition in range(PARTITIONS):
            assert contents(stores, partition) == expected[partition]
            store = stores.get(TABLE, partition)
            assert store is not None
            assert store.changelog_offset() == ends[partition] - 1
    finally:
        await service.stop()


async def read_range(reader: ChangelogReader, tp: TopicPartition, start: int, end: int) -> list:
    reader.assign({tp: (start, end)})
    records: list[Record] = []
    deadline = time.monotonic() + 30
    while (reader.position(tp) or 0) < end:
        assert time.monotonic() < deadline, f"reading {tp} stopped at {reader.position(tp)}"
        chunks = await reader.read(1000, 0.2)
        if tp in chunks:
            records += chunks[tp].records
    return records


async def test_read_committed_skips_aborted_transactions_and_uncommitted_does_not(
    kafka_bootstrap: str,
    unique_topic: Callable[..., str],
    producers: Callable[..., AIOKafkaProducer],
) -> None:
    topic = unique_topic("cl")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    plain = producers()
    txn = producers(transactional_id=f"tx-{uuid.uuid4().hex}")
    await plain.start()
    await txn.start()
    committed: list[Record] = []
    aborted: list[Record] = []

    async def send(producer: AIOKafkaProducer, key: bytes, value: bytes) -> Record:
        meta = await (await producer.send(topic, value, key=key, partition=0))
        return (meta.offset, key, value)

    committed.append(await send(plain, b"a", b"1"))
    await txn.begin_transaction()
    pending = [await txn.send(topic, b"x%d" % i, key=b"x", partition=0) for i in range(3)]
    await txn.abort_transaction()
    aborted += [(m.offset, b"x", b"x%d" % i) for i, m in enumerate(await asyncio.gather(*pending))]
    async with txn.transaction():
        pending = [await txn.send(topic, b"y%d" % i, key=b"y", partition=0) for i in range(2)]
    committed += [
        (m.offset, b"y", b"y%d" % i) for i, m in enumerate(await asyncio.gather(*pending))
    ]
    committed.append(await send(plain, b"b", b"2"))

    tp = TopicPartition(topic, 0)
    for isolation, expected in (
        (READ_COMMITTED, sorted(committed)),
        (READ_UNCOMMITTED, sorted(committed + aborted)),
    ):
        reader = ChangelogReader(kafka_bootstrap, isolation_level=isolation)
        await reader.start()
        try:
            end = (await reader.end_offsets([tp]))[tp]
            assert await read_range(reader, tp, 0, end) == expected
            # reading from the middle of the log starts exactly there
            middle = expected[2][0]
            assert await read_range(reader, tp, middle, end) == expected[2:]
            assert reader.position(tp) == end
        finally:
            await reader.close()


async def test_an_offset_beyond_the_log_is_reported_not_skipped(
    kafka_bootstrap: str, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic("cl")
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    reader = ChangelogReader(kafka_bootstrap)
    await reader.start()
    tp = TopicPartition(topic, 0)
    try:
        reader.assign({tp: (5, None)})
        with pytest.raises(ChangelogOffsetOutOfRange) as caught:
            for _ in range(50):
                await reader.read(1000, 0.2)
        assert caught.value.offsets == {tp: 5}
        assert reader.assigned() == []
    finally:
        await reader.close()
