"""TableClient against scripted HTTP servers (stdlib, in threads): hosts in turn, 503
retries honoring Retry-After within a bound, redirects, and errors by name."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from streamjoin.errors import (
    KeyNotFound,
    QueryFailed,
    QueryKeyError,
    QueryUnauthorized,
    QueryUnavailable,
    UnknownTableError,
)
from streamjoin.query import AsyncTableClient, TableClient
from streamjoin.query.client import query_url

Reply = tuple[int, dict[str, str], dict[str, Any]]


class Scripted:
    """A server answering each request with the next scripted reply (the last one repeats)."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                scripted.paths.append(self.path)
                scripted.auth.append(self.headers.get("Authorization"))
                status, headers, body = (
                    scripted.replies.pop(0) if len(scripted.replies) > 1 else scripted.replies[0]
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers() -> Iterator[list[Scripted]]:
    made: list[Scripted] = []
    yield made
    for server in made:
        server.close()


def _serve(servers: list[Scripted], *replies: Reply) -> Scripted:
    server = Scripted(list(replies))
    servers.append(server)
    return server


def _value(v: int) -> Reply:
    return 200, {}, {"value": v, "partition": 1, "served_by": "x", "stale": False, "lag": None}


def _error(status: int, kind: str, **headers: str) -> Reply:
    return status, headers, {"error": kind, "message": f"{kind} here", "status": status}


def test_the_url_quotes_table_and_key() -> None:
    url = query_url("h:1", "counts", "a/b c", from_ms=5, allow_stale=True)
    assert url == "http://h:1/tables/counts/a%2Fb%20c?from=5&allow_stale=1"


def test_a_503_is_retried_after_its_retry_after(servers: list[Scripted]) -> None:
    server = _serve(servers, _error(503, "QueryUnavailable", **{"Retry-After": "2"}), _value(7))
    slept: list[float] = []
    client = TableClient([server.host], token="s3cret", sleep=slept.append)
    assert client.get("counts", "u1")["value"] == 7
    assert slept == [2.0]
    assert server.auth == ["Bearer s3cret", "Bearer s3cret"]
    assert server.paths == ["/tables/counts/u1", "/tables/counts/u1"]


def test_503s_stop_at_the_retry_bound(servers: list[Scripted]) -> None:
    server = _serve(servers, _error(503, "QueryUnavailable", **{"Retry-After": "1"}))
    client = TableClient([server.host], retry_for=0.5, sleep=lambda s: None)
    with pytest.raises(QueryUnavailable, match="no answer within"):
        client.get("counts", "u1")


def test_an_unreachable_host_is_skipped(servers: list[Scripted]) -> None:
    dead = _serve(servers, _value(0))
    dead.close()
    servers.remove(dead)
    alive = _serve(servers, _value(3))
    client = TableClient([dead.host, alive.host], sleep=lambda s: None)
    assert client.value("counts", "u1") == 3


def test_no_host_answering_is_a_query_failed(servers: list[Scripted]) -> None:
    dead = _serve(servers, _value(0))
    dead.close()
    servers.remove(dead)
    client = TableClient([dead.host], retry_for=0.2, sleep=lambda s: None, timeout=0.5)
    with pytest.raises(QueryFailed, match="no host answered"):
        client.get("counts", "u1")


def test_redirects_are_followed(servers: list[Scripted]) -> None:
    owner = _serve(servers, _value(9))
    other = _serve(
        servers, (307, {"Location": f"http://{owner.host}/tables/counts/u1?redirect=1"}, {})
    )
    client = TableClient([other.host], redirect=True)
    assert client.value("counts", "u1") == 9
    assert other.paths == ["/tables/counts/u1?redirect=1"]
    assert owner.paths == ["/tables/counts/u1?redirect=1"]


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (_error(404, "KeyNotFound"), KeyNotFound),
        (_error(404, "UnknownTableError"), UnknownTableError),
        (_error(400, "QueryKeyError"), QueryKeyError),
        (_error(401, "QueryUnauthorized"), QueryUnauthorized),
        ((500, {}, {"message": "boom"}), QueryFailed),
    ],
)
def test_errors_come_back_by_name(
    servers: list[Scripted], reply: Reply, error: type[Exception]
) -> None:
    server = _serve(servers, reply)
    with pytest.raises(error):
        TableClient([server.host]).get("counts", "u1")


# ------------------------------------------------------------------ the asyncio client


async def test_the_async_client_retries_503s_and_follows_redirects(
    servers: list[Scripted],
) -> None:
    owner = _serve(servers, _error(503, "QueryUnavailable", **{"Retry-After": "0.01"}), _value(4))
    other = _serve(
        servers, (307, {"Location": f"http://{owner.host}/tables/counts/u1?redirect=1"}, {})
    )
    async with AsyncTableClient([other.host], token="t", redirect=True) as client:
        assert await client.value("counts", "u1") == 4
    assert owner.auth == ["Bearer t", "Bearer t"]
    assert len(other.paths) == 2  # the 503 came through the redirect: asked again from the top


async def test_the_async_client_skips_dead_hosts_and_names_errors(
    servers: list[Scripted],
) -> None:
    dead = _serve(servers, _value(0))
    dead.close()
    servers.remove(dead)
    alive = _serve(servers, _error(404, "KeyNotFound"))
    async with AsyncTableClient([dead.host, alive.host]) as client:
        with pytest.raises(KeyNotFound):
            await client.get("counts", "u1")
    async with AsyncTableClient([dead.host], retry_for=0.2, timeout=0.5) as client:
        with pytest.raises(QueryFailed, match="no host answered"):
            await client.get("counts", "u1")
    busy = _serve(servers, _error(503, "QueryUnavailable", **{"Retry-After": "1"}))
    async with AsyncTableClient([busy.host], retry_for=0.5) as client:
        with pytest.raises(QueryUnavailable, match="no answer within"):
            await client.get("counts", "u1")
