"""The query endpoint's shell (runtime/ops/query_endpoint.py) over fakes: a real aiohttp server,
table declarations and in-memory stores; the group, the tasks and the state service faked.
Each rule of docs/queries.md ("Routing rules") that needs no second worker is checked here;
forwarding and redirects run through the real broker in tests/integration/test_queries.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import streamjoin
from streamjoin.errors import QueryUnavailable
from streamjoin.partitioner import partition_for_key
from streamjoin.query.routing import FORWARDED_HEADER
from streamjoin.runtime.group.group_info import GroupInfo, MemberInfo
from streamjoin.runtime.ops.query_endpoint import QueryService
from streamjoin.state import window_layout as layout
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.state.windows import TumblingWindows

PARTITIONS = 4
SELF = "127.0.0.1:1"
OTHER = "127.0.0.1:2"


def _app() -> streamjoin.App:
    app = streamjoin.App("q")
    source = app.topic("src", key_serializer="str", partitions=PARTITIONS)
    app.table("counts", key_serializer="str", copartitioned_with=source, partitions=PARTITIONS)
    app.table(
        "minutes",
        key_serializer="str",
        copartitioned_with=source,
        partitions=PARTITIONS,
        window=TumblingWindows(size_ms=60_000, retention_ms=600_000),
    )

    @app.agent(source, name="noop")
    async def noop(stream: Any) -> None:
        async for _ in stream:
            pass

    return app


@dataclass
class Membership:
    generation: int = 5
    rebalancing: bool = False


@dataclass
class Tables:
    active: dict[tuple[str, int], TablePartition] = field(default_factory=dict)
    restoring: set[tuple[str, int]] = field(default_factory=set)

    def active_partition(self, table: str, partition: int) -> TablePartition | None:
        return self.active.get((table, partition))

    def assigned_partition(self, table: str, partition: int) -> bool:
        return (table, partition) in self.active or (table, partition) in self.restoring


@dataclass
class Stores:
    held: dict[tuple[str, int], MemoryStorePartition] = field(default_factory=dict)

    def get(self, table: str, partition: int) -> MemoryStorePartition | None:
        return self.held.get((table, partition))


@dataclass
class State:
    lag: dict[str, dict[int, int]] = field(default_factory=dict)

    def lags(self) -> dict[str, dict[int, int]]:
        return self.lag


def _partition(key: str) -> int:
    return partition_for_key(key.encode(), PARTITIONS)


@dataclass
class Harness:
    service: QueryService
    tables: Tables
    stores: Stores
    state: State
    membership: Membership
    url: str
    described: list[int]

    async def get(self, path: str, **headers: str) -> tuple[int, dict[str, Any], Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.url + path, headers=headers, allow_redirects=False) as response,
        ):
            body = None if response.status == 307 else await response.json()
            return response.status, dict(response.headers), body


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    topology = _app().topology()
    tables, stores, state, membership = Tables(), Stores(), State(), Membership()
    described: list[int] = []

    async def describe() -> GroupInfo:
        described.append(membership.generation)
        members = (
            MemberInfo("m1", "w1", "h", 3, {"src": [0, 1]}, {"q-counts-changelog": [2]}, host=SELF),
            MemberInfo(
                "m2", "w2", "h", 3, {"src": [2, 3]}, {"q-counts-changelog": [0]}, host=OTHER
            ),
        )
        return GroupInfo("q", "Stable", "cooperative", members)

    service = QueryService(
        topology,
        tables=tables,
        stores=stores,  # type: ignore[arg-type]
        state_service=state,  # type: ignore[arg-type]
        membership=lambda: membership,  # type: ignore[arg-type,return-value]
        describe=describe,
        self_host=SELF,
        token=None,
    )
    app = web.Application()
    for method, path, handler in service.routes():
        app.router.add_route(method, path, handler)
    server = TestServer(app)
    await server.start_server()
    service.start(serving=True)
    service.assignment_changed()
    for _ in range(100):  # the refresher describes the group once
        if service.current_routing() is not None:
            break
        await asyncio.sleep(0.01)
    try:
        yield Harness(
            service, tables, stores, state, membership, str(server.make_url("")), described
        )
    finally:
        await service.stop()
        await server.close()


def _active(h: Harness, table: str, partition: int, data: dict[bytes, bytes]) -> TablePartition:
    store = MemoryStorePartition(table=table, partition=partition)
    store.write(data, 10)
    state = TablePartition(table, partition, store)
    h.tables.active[(table, partition)] = state
    return state


def _key_in(partition: int, skip: int = 0) -> str:
    """A key of ``partition`` (the ``skip``-th one found)."""
    found = [f"k{i}" for i in range(1000) if _partition(f"k{i}") == partition]
    return found[skip]


async def test_the_owner_answers_from_its_store_not_its_unflushed_writes(harness: Harness) -> None:
    key = _key_in(0)
    state = _active(harness, "counts", 0, {key.encode(): b"3"})
    state.put(key.encode(), b"4")  # buffered for the next flush: not visible yet
    status, _, body = await harness.get(f"/tables/counts/{key}")
    assert status == 200
    assert body == {
        "table": "counts",
        "key": key,
        "partition": 0,
        "served_by": SELF,
        "stale": False,
        "lag": None,
        "value": 3,
    }
    missing = _key_in(0, skip=1)
    status, _, body = await harness.get(f"/tables/counts/{missing}")
    assert status == 404 and body["error"] == "KeyNotFound"


async def test_a_restoring_owner_and_a_rebalancing_worker_answer_503(harness: Harness) -> None:
    key = _key_in(1)
    harness.tables.restoring.add(("counts", 1))
    status, headers, body = await harness.get(f"/tables/counts/{key}")
    assert status == 503 and "restoring" in body["message"]
    assert int(headers["Retry-After"]) >= 1
    _active(harness, "counts", 1, {key.encode(): b"1"})
    harness.membership.rebalancing = True
    status, _, body = await harness.get(f"/tables/counts/{key}")
    assert status == 503 and "rebalancing" in body["message"]
    with pytest.raises(QueryUnavailable):
        harness.service.locate("counts", key)


async def test_a_forwarded_read_is_never_forwarded_again(harness: Harness) -> None:
    key = _key_in(2)  # owned by OTHER
    status, _, body = await harness.get(f"/tables/counts/{key}", **{FORWARDED_HEADER: OTHER})
    assert status == 503 and "forwarded here" in body["message"]


async def test_redirects_name_the_owner(harness: Harness) -> None:
    key = _key_in(3)
    status, headers, _ = await harness.get(f"/tables/counts/{key}?redirect=1")
    assert status == 307
    assert headers["Location"] == f"http://{OTHER}/tables/counts/{key}?redirect=1"
    location = harness.service.locate("counts", key)
    assert (location.owner, location.partition, location.generation) == (OTHER, 3, 5)


async def test_a_standby_answers_stale_reads_with_its_lag(harness: Harness) -> None:
    key = _key_in(2)
    store = MemoryStorePartition(table="counts", partition=2)
    store.write({key.encode(): b"7"}, 3)
    harness.stores.held[("counts", 2)] = store
    harness.state.lag = {"q-counts-changelog": {2: 4}}
    status, _, body = await harness.get(f"/tables/counts/{key}?allow_stale=1")
    assert status == 200
    assert (body["value"], body["stale"], body["lag"], body["served_by"]) == (7, True, 4, SELF)
    assert harness.service.locate("counts", key).standbys == (SELF,)


async def test_windowed_reads_return_the_windows_in_range(harness: Harness) -> None:
    key = _key_in(0)
    data = {
        layout.data_key(key.encode(), start): str(n).encode()
        for start, n in ((0, 1), (60_000, 2), (120_000, 5))
    }
    _active(harness, "minutes", 0, data)
    status, _, body = await harness.get(f"/tables/minutes/{key}?from=60000&to=120000")
    assert status == 200, body
    assert body["windows"] == [
        {"start": 60_000, "end": 120_000, "value": 2},
        {"start": 120_000, "end": 180_000, "value": 5},
    ]
    status, _, body = await harness.get(f"/tables/minutes/{key}?from=soon")
    assert status == 400 and "?from=" in body["message"]


async def test_a_worker_without_web_server_describes_its_group_only_once_asked() -> None:
    calls = []

    async def describe() -> GroupInfo:
        calls.append(1)
        member = MemberInfo("m1", "w1", "h", 3, {"src": [0, 1, 2, 3]}, {}, host=SELF)
        return GroupInfo("q", "Stable", "cooperative", (member,))

    service = QueryService(
        _app().topology(),
        tables=Tables(),
        stores=None,
        state_service=None,
        membership=lambda: Membership(),  # type: ignore[arg-type,return-value]
        describe=describe,
        self_host=SELF,
    )
    service.start(serving=False)
    service.assignment_changed()
    await asyncio.sleep(0.1)
    assert calls == []
    with pytest.raises(QueryUnavailable, match="not known yet"):
        service.locate("counts", "k1")
    for _ in range(100):
        await asyncio.sleep(0.01)
        if service.current_routing() is not None:
            break
    assert service.locate("counts", "k1").owner == SELF
    assert len(calls) == 1
    await service.stop()


async def test_an_owner_that_does_not_answer_is_a_503_and_the_group_is_described_again(
    harness: Harness,
) -> None:
    key = _key_in(3)  # owned by OTHER, where nothing listens
    before = len(harness.described)
    status, headers, body = await harness.get(f"/tables/counts/{key}")
    assert status == 503 and f"the owner {OTHER} did not answer" in body["message"]
    assert "Retry-After" in headers
    # same generation, but a static member may have restarted on a new port: described again
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(harness.described) > before:
            break
    assert len(harness.described) == before + 1


async def test_keys_may_hold_slashes_and_spaces(harness: Harness) -> None:
    key = "a/b c"
    partition = _partition(key)
    _active(harness, "counts", partition, {key.encode(): b"9"})
    for path in ("a%2Fb%20c", "a/b%20c"):
        status, _, body = await harness.get(f"/tables/counts/{path}")
        assert (status, body["key"], body["value"]) == (200, key, 9), path
