"""The changelog reader's shell against a scripted client: routing, budgets, errors."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.fetch import FetchRequest, FetchResponse_v11
from aiokafka.protocol.offset import OffsetRequest, OffsetResponse_v3
from aiokafka.structs import TopicPartition
from changelog_support import batch, marker, rec

from streamjoin.errors import ChangelogOffsetOutOfRange, ChangelogReadError
from streamjoin.runtime.table_state.changelog_reader import ChangelogChunk, ChangelogReader
from streamjoin.runtime.table_state.changelog_records import Record

T0, T1 = TopicPartition("cl", 0), TopicPartition("cl", 1)


class FakeCluster:
    def __init__(self, leaders: dict[TopicPartition, int]) -> None:
        self.leaders = leaders

    def leader_for_partition(self, tp: TopicPartition) -> int | None:
        return self.leaders.get(tp)


class FakeClient:
    """Answers Fetch and ListOffsets from in-memory logs, with scripted errors."""

    def __init__(self, logs: dict[TopicPartition, list[tuple[int, bytes]]]) -> None:
        self.logs = logs  # per partition: (next offset after the batch, batch bytes)
        self.cluster = FakeCluster({tp: 1 for tp in logs})
        #: leaders after the next metadata refresh
        self.next_leaders: dict[TopicPartition, int] | None = None
        self.errors: dict[TopicPartition, deque[int]] = {}
        self.send_failures: deque[Exception] = deque()
        self.fetches: list[tuple[int, dict[TopicPartition, int]]] = []
        self.metadata_updates = 0

    def end(self, tp: TopicPartition) -> int:
        return self.logs[tp][-1][0] if self.logs[tp] else 0

    def _done(self) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(True)
        return future

    def set_topics(self, topics: list[str]) -> asyncio.Future[Any]:
        return self._done()

    def force_metadata_update(self) -> asyncio.Future[Any]:
        self.metadata_updates += 1
        if self.next_leaders is not None:
            self.cluster.leaders, self.next_leaders = self.next_leaders, None
        return self._done()

    async def close(self) -> None:
        pass

    def _error(self, node: int, tp: TopicPartition) -> int:
        if self.cluster.leaders.get(tp) != node:
            return 6  # NOT_LEADER_OR_FOLLOWER
        queued = self.errors.get(tp)
        return queued.popleft() if queued else 0

    async def send(self, node: int, request: Any) -> Any:
        await asyncio.sleep(0)
        if self.send_failures:
            raise self.send_failures.popleft()
        if isinstance(request, OffsetRequest):
            struct = request.prepare({2: (1, 3)})
            topics = []
            for topic, parts in struct.topics:
                out = []
                for partition, timestamp in parts:
                    tp = TopicPartition(topic, partition)
                    offset = 0 if timestamp == -2 else self.end(tp)
                    out.append((partition, self._error(node, tp), -1, offset))
                topics.append((topic, out))
            return OffsetResponse_v3(0, topics)
        assert isinstance(request, FetchRequest)
        asked = {
            TopicPartition(topic, p): offset
            for topic, parts in request.topics
            for p, offset, _ in parts
        }
        self.fetches.append((node, asked))
        topics = []
        for topic, parts in request.topics:
            out = []
            for partition, offset, _max_bytes in parts:
                tp = TopicPartition(topic, partition)
                code = self._error(node, tp)
                data = b""
                if code == 0:
                    if offset > self.end(tp):
                        code = 1  # OFFSET_OUT_OF_RANGE
                    else:
                        # two batches per answer at most: reads take several fetches
                        data = b"".join([b for end, b in self.logs[tp] if end > offset][:2])
                hw = self.end(tp)
                out.append((partition, code, hw, hw, 0, None, -1, data))
            topics.append((topic, out))
        return FetchResponse_v11(0, 0, 0, topics)


def log_of(*batches: tuple[int, bytes]) -> list[tuple[int, bytes]]:
    return list(batches)


def simple_log(n: int, per_batch: int = 2) -> list[tuple[int, bytes]]:
    out = []
    for base in range(0, n, per_batch):
        records = [rec(o) for o in range(base, min(n, base + per_batch))]
        out.append((records[-1][0] + 1, batch(base, records)))
    return out


@pytest.fixture
async def reader_for() -> AsyncIterator[Any]:
    readers: list[ChangelogReader] = []

    async def make(client: FakeClient, **options: Any) -> ChangelogReader:
        reader = ChangelogReader("unused:9092", retry_backoff=0.01, **options)
        await reader.start(client)  # type: ignore[arg-type]
        readers.append(reader)
        return reader

    yield make
    for reader in readers:
        await reader.close()


async def read_until(
    reader: ChangelogReader, ends: dict[TopicPartition, int], max_records: int = 1000
) -> dict[TopicPartition, list[Record]]:
    got: dict[TopicPartition, list[Record]] = {tp: [] for tp in ends}
    positions = {tp: -1 for tp in ends}
    for _ in range(200):
        chunks: dict[TopicPartition, ChangelogChunk] = await reader.read(max_records, 0.05)
        for tp, chunk in chunks.items():
            assert chunk.next_offset > positions[tp]
            positions[tp] = chunk.next_offset
            got[tp] += chunk.records
        if all(positions[tp] >= end for tp, end in ends.items()):
            return got
    raise AssertionError(f"stuck at {positions}")


async def test_reads_several_partitions_from_their_start_to_their_end(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(9), T1: simple_log(4)})
    reader = await reader_for(client)
    reader.assign({T0: (3, 9), T1: (0, 4)})
    got = await read_until(reader, {T0: 9, T1: 4})
    assert got == {T0: [rec(o) for o in range(3, 9)], T1: [rec(o) for o in range(4)]}
    # one request per leader carries both partitions
    assert all(set(asked) <= {T0, T1} for _, asked in client.fetches)
    assert any(len(asked) == 2 for _, asked in client.fetches)
    # nothing is fetched past the end captured at plan time
    before = len(client.fetches)
    assert await reader.read(1000, 0.05) == {}
    assert len(client.fetches) == before


async def test_read_hands_out_about_max_records_at_a_time(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(40, per_batch=4)})
    reader = await reader_for(client)
    reader.assign({T0: (0, 40)})
    await asyncio.sleep(0)
    sizes = []
    position = 0
    while position < 40:
        chunks = await reader.read(5, 0.05)
        if T0 in chunks:
            sizes.append(len(chunks[T0].records))
            position = chunks[T0].next_offset
    assert max(sizes) <= 8  # whole batches: one batch past the budget at most
    assert sum(sizes) == 40


async def test_gaps_and_markers_move_the_position(reader_for: Any) -> None:
    log = log_of(
        (5, batch(0, [rec(0), rec(3)], last_offset=4)),
        (7, batch(5, [rec(5), rec(6)], producer_id=3, transactional=True)),
        (8, marker(7, 3, commit=True)),
    )
    reader = await reader_for(FakeClient({T0: log}))
    reader.assign({T0: (0, 8)})
    got = await read_until(reader, {T0: 8})
    assert got[T0] == [rec(0), rec(3), rec(5), rec(6)]
    assert reader.position(T0) == 8


async def test_a_moved_leader_is_found_again(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(6)})
    client.cluster.leaders = {T0: 1}
    client.next_leaders = {T0: 2}
    client.errors[T0] = deque([6])  # node 1 answers NOT_LEADER once
    reader = await reader_for(client)
    reader.assign({T0: (0, 6)})
    client.cluster.leaders = {T0: 1}
    got = await read_until(reader, {T0: 6})
    assert got[T0] == [rec(o) for o in range(6)]
    assert client.metadata_updates >= 1
    assert client.fetches[-1][0] == 2


async def test_transport_errors_are_retried(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(4)})
    client.send_failures.append(KafkaConnectionError("broken"))
    reader = await reader_for(client)
    reader.assign({T0: (0, 4)})
    got = await read_until(reader, {T0: 4})
    assert got[T0] == [rec(o) for o in range(4)]


async def test_offset_out_of_range_is_raised_and_the_partition_dropped(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(4), T1: simple_log(4)})
    reader = await reader_for(client)
    reader.assign({T0: (0, 4), T1: (10, None)})
    with pytest.raises(ChangelogOffsetOutOfRange) as caught:
        for _ in range(50):
            await reader.read(1000, 0.05)
    assert caught.value.offsets == {T1: 10}
    assert reader.assigned() == [T0]
    got = await read_until(reader, {T0: 4})
    assert got[T0] == [rec(o) for o in range(4)]  # the other partition lost nothing


async def test_other_errors_fail_loudly(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(4)})
    client.errors[T0] = deque([29])  # TOPIC_AUTHORIZATION_FAILED
    reader = await reader_for(client)
    reader.assign({T0: (0, 4)})
    with pytest.raises(ChangelogReadError, match="TopicAuthorizationFailed"):
        for _ in range(50):
            await reader.read(1000, 0.05)


async def test_list_offsets_retries_a_moved_leader(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(6), T1: simple_log(2)})
    client.errors[T0] = deque([6])
    reader = await reader_for(client)
    assert await reader.end_offsets([T0, T1]) == {T0: 6, T1: 2}
    assert await reader.beginning_offsets([T0]) == {T0: 0}
    client.errors[T1] = deque([29])
    with pytest.raises(ChangelogReadError, match="TopicAuthorizationFailed"):
        await reader.end_offsets([T1])


async def test_a_standby_follows_new_records(reader_for: Any) -> None:
    client = FakeClient({T0: simple_log(2)})
    reader = await reader_for(client, max_wait_ms=10)
    reader.assign({T0: (0, None)})
    got = await read_until(reader, {T0: 2})
    client.logs[T0].append((4, batch(2, [rec(2), rec(3)])))
    more = await read_until(reader, {T0: 4})
    assert got[T0] + more[T0] == [rec(o) for o in range(4)]
