"""Web views and health probes (runtime/ops/views.py, runtime/ops/health.py) on real aiohttp
servers: two fake workers, each with the query endpoint's routing over faked group, tasks
and stores (the fakes of test_queries_handler.py), serving the same declared views. A
routed view is answered by the key's owner through either worker; the token, JSON answers
and errors are checked here; the real broker runs them in
tests/integration/test_web_views.py."""

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
from streamjoin.runtime.group.group_info import GroupInfo, MemberInfo
from streamjoin.runtime.ops.health import HealthProbes, WorkerHealth, readiness
from streamjoin.runtime.ops.query_endpoint import QueryService
from streamjoin.runtime.ops.views import WebViews
from streamjoin.runtime.tasks.task import TaskManager
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition
from tests.unit.runtime.test_queries_handler import PARTITIONS, Membership, Tables, _partition

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: worker A owns partitions 0 and 1 of the source (and so of the table), B owns 2 and 3
OWNED = {"A": [0, 1], "B": [2, 3]}


def _app() -> streamjoin.App:
    app = streamjoin.App("v")
    source = app.topic("src", key_serializer="str", partitions=PARTITIONS)
    counts = app.table("counts", key_serializer="str", copartitioned_with=source)

    @app.agent(source, name="noop")
    async def noop(stream: Any) -> None:
        async for _ in stream:
            pass

    @app.page("/count/{word}")
    @app.table_route(counts, match_info="word")
    async def count(request: web.Request, word: str) -> dict[str, Any]:
        return {"word": word, "served_by": request.host}

    @app.page("/lookup", methods=("GET", "POST"))
    @app.table_route(counts, query_param="user")
    async def lookup(request: web.Request) -> dict[str, Any]:
        body = await request.json() if request.method == "POST" else None
        return {"served_by": request.host, "method": request.method, "body": body}

    @app.page("/hello", public=True)
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="<p>hi</p>", content_type="text/html")

    @app.page("/missing")
    async def missing(request: web.Request) -> None:
        raise web.HTTPNotFound(text="no such thing")

    @app.page("/broken")
    async def broken(request: web.Request) -> None:
        raise ZeroDivisionError("secret detail")

    return app


@dataclass
class Worker:
    """One fake worker: its tables, its group view, its server."""

    name: str
    tables: Tables = field(default_factory=Tables)
    membership: Membership = field(default_factory=Membership)
    service: QueryService | None = None
    server: TestServer | None = None

    @property
    def host(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    async def request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
    ) -> tuple[int, dict[str, str], Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method,
                f"http://{self.host}{path}",
                headers=headers or {},
                allow_redirects=False,
                **kw,
            ) as response,
        ):
            text = await response.text()
            is_json = response.content_type == "application/json"
            body = await response.json() if is_json else text
            return response.status, dict(response.headers), body

    async def get(self, path: str, **headers: str) -> tuple[int, dict[str, str], Any]:
        return await self.request("GET", path, headers={**AUTH, **headers})


def _key_in(partition: int) -> str:
    return next(f"k{i}" for i in range(1000) if _partition(f"k{i}") == partition)


@pytest.fixture
async def workers() -> AsyncIterator[dict[str, Worker]]:
    app = _app()
    topology = app.topology()
    found = {name: Worker(name) for name in OWNED}

    async def describe() -> GroupInfo:
        members = tuple(
            MemberInfo(f"m-{w.name}", w.name, "h", 5, {"src": OWNED[w.name]}, {}, host=w.host)
            for w in found.values()
        )
        return GroupInfo("v", "Stable", "cooperative", members)

    for worker in found.values():
        for partition in OWNED[worker.name]:
            store = MemoryStorePartition(table="counts", partition=partition)
            worker.tables.active[("counts", partition)] = TablePartition("counts", partition, store)
        worker.service = QueryService(
            topology,
            tables=worker.tables,
            stores=None,
            state_service=None,
            membership=lambda w=worker: w.membership,  # type: ignore[misc]
            describe=describe,
            self_host=None,
            token=TOKEN,
        )
        server_app = web.Application()
        views = WebViews(app.views, queries=worker.service, token=TOKEN)
        for method, path, handler in [*worker.service.routes(), *views.routes()]:
            server_app.router.add_route(method, path, handler)
        worker.server = TestServer(server_app)
        await worker.server.start_server()
    for worker in found.values():
        assert worker.service is not None
        worker.service.self_host = worker.host
        worker.service.start(serving=True)
        for _ in range(200):  # the refresher describes the group once
            if worker.service.current_routing() is not None:
                break
            await asyncio.sleep(0.01)
    try:
        yield found
    finally:
        for worker in found.values():
            assert worker.service is not None and worker.server is not None
            await worker.service.stop()
            await worker.server.close()


async def test_a_routed_view_is_answered_by_the_owner_through_either_worker(
    workers: dict[str, Worker],
) -> None:
    for owner, partitions in OWNED.items():
        for partition in partitions:
            key = _key_in(partition)
            for asked in workers.values():
                status, _, body = await asked.get(f"/count/{key}")
                assert status == 200, body
                assert body == {"word": key, "served_by": workers[owner].host}


async def test_a_routed_view_redirects_when_asked_to(workers: dict[str, Worker]) -> None:
    key = _key_in(2)  # B's
    status, headers, _ = await workers["A"].get(f"/count/{key}?redirect=1")
    assert status == 307
    assert headers["Location"] == f"http://{workers['B'].host}/count/{key}?redirect=1"


async def test_a_view_routed_by_a_query_parameter_forwards_the_method_and_body(
    workers: dict[str, Worker],
) -> None:
    key = _key_in(3)  # B's
    status, _, body = await workers["A"].request(
        "POST", f"/lookup?user={key}", headers=AUTH, json={"n": 1}
    )
    assert status == 200, body
    assert body == {"served_by": workers["B"].host, "method": "POST", "body": {"n": 1}}
    status, _, body = await workers["A"].get("/lookup")
    assert status == 400 and "query parameter ?user=" in body["message"]


async def test_while_the_owner_restores_or_the_worker_rebalances_a_routed_view_is_503(
    workers: dict[str, Worker],
) -> None:
    key = _key_in(2)
    b = workers["B"]
    del b.tables.active[("counts", 2)]
    b.tables.restoring.add(("counts", 2))
    for asked in workers.values():  # asked of B, or forwarded by A to B
        status, headers, body = await asked.get(f"/count/{key}")
        assert status == 503 and "restoring" in body["message"], body
        assert int(headers["Retry-After"]) >= 1
    workers["A"].membership.rebalancing = True
    status, _, body = await workers["A"].get(f"/count/{_key_in(0)}")
    assert status == 503 and "rebalancing" in body["message"]


async def test_views_ask_for_the_token_unless_public(workers: dict[str, Worker]) -> None:
    a = workers["A"]
    status, headers, body = await a.request("GET", f"/count/{_key_in(0)}")
    assert status == 401 and body["error"] == "QueryUnauthorized"
    assert headers["WWW-Authenticate"] == "Bearer"
    status, _, _ = await a.request("GET", "/broken", headers={"Authorization": "Bearer wrong"})
    assert status == 401
    status, headers, body = await a.request("GET", "/hello")  # public, no token
    assert status == 200 and body == "<p>hi</p>" and headers["Content-Type"].startswith("text/html")


async def test_a_views_own_http_errors_pass_and_its_failures_are_500_without_details(
    workers: dict[str, Worker], caplog: pytest.LogCaptureFixture
) -> None:
    a = workers["A"]
    status, _, body = await a.get("/missing")
    assert (status, body) == (404, "no such thing")
    status, _, body = await a.get("/broken")
    assert status == 500 and body["error"] == "ViewFailed"
    assert "ZeroDivisionError" in body["message"] and "secret detail" not in body["message"]
    assert "secret detail" in caplog.text  # the worker's log has it all


# ---------------------------------------------------------------------- health


def test_readiness_names_every_reason_and_is_ready_with_none() -> None:
    assert readiness(WorkerHealth(group_member=False)) == []
    assert readiness(WorkerHealth(group_member=True, generation=3)) == []
    assert readiness(WorkerHealth(group_member=True)) == ["not in the group yet (joining)"]
    assert readiness(
        WorkerHealth(
            failure="AgentFailed",
            stopping=True,
            group_member=True,
            generation=4,
            rebalancing=True,
            pending=[("src", 3), ("src", 1)],
            restoring={"counts": [3, 1], "other": []},
            global_restoring=["users"],
        )
    ) == [
        "a fatal error (AgentFailed) is stopping the worker",
        "the group is rebalancing (generation 4)",
        "waiting for src[1], src[3] to be handed over by their owner",
        "table 'counts' is restoring partition(s) 1, 3",
        "global table 'users' is restoring",
    ]
    assert readiness(WorkerHealth(stopping=True)) == ["the worker is stopping"]


@dataclass
class HealthWorker:
    """What the probes read of a worker, with the real task manager."""

    topology: Any
    tasks: TaskManager
    runtime: Any = None
    membership: Membership | None = None
    assignor: Any = None
    global_tables: Any = None
    failure: BaseException | None = None
    should_stop: bool = False


@dataclass
class Runtime:
    topics: set[str]


@dataclass
class Assignor:
    pending: dict[str, list[int]]


async def test_ready_goes_from_503_to_200_as_the_worker_joins_and_restores() -> None:
    topology = _app().topology()
    worker = HealthWorker(topology, TaskManager(topology), runtime=Runtime({"src"}))
    server_app = web.Application()
    for method, path, handler in HealthProbes(worker).routes():  # type: ignore[arg-type]
        server_app.router.add_route(method, path, handler)
    server = TestServer(server_app)
    await server.start_server()

    async def probe(path: str) -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as session, session.get(server.make_url(path)) as r:
            return r.status, await r.json()

    try:
        assert await probe("/health/live") == (200, {"live": True})
        status, body = await probe("/health/ready")
        assert status == 503 and body["reasons"] == ["not in the group yet (joining)"]
        worker.membership = Membership(generation=7)
        worker.tasks.assign([("src", 0)])  # and src[2], once its owner gives it up
        worker.assignor = Assignor({"src": [2], "v-counts-changelog": [2]})
        status, body = await probe("/health/ready")
        assert status == 503
        assert body["reasons"] == [
            "waiting for src[2] to be handed over by their owner",
            "table 'counts' is restoring partition(s) 0",
        ]
        worker.assignor = Assignor({})
        worker.tasks.assign([("src", 2)])
        status, body = await probe("/health/ready")
        assert status == 503
        assert body["reasons"] == ["table 'counts' is restoring partition(s) 0, 2"]
        assert (body["restoring_tasks"], body["active_tasks"]) == (2, 0)
        for partition in (0, 2):
            store = MemoryStorePartition(table="counts", partition=partition)
            worker.tasks.table_ready(
                "counts", partition, TablePartition("counts", partition, store)
            )
        status, body = await probe("/health/ready")
        assert (status, body["ready"], body["reasons"], body["active_tasks"]) == (200, True, [], 2)
        assert body["generation"] == 7
        worker.failure = RuntimeError("token=hunter2")
        status, body = await probe("/health/ready")
        assert status == 503 and "hunter2" not in str(body)
        assert await probe("/health/live") == (200, {"live": True})
    finally:
        await server.close()
