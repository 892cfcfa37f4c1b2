"""Interactive queries, the shell: the routing table's upkeep and the aiohttp handler.

After every rebalance one ``DescribeGroups`` gives each member's advertised host (its
subscription userdata), its consumed partitions and its standbys (its assignment), and
:class:`~streamjoin.query.routing.RoutingTable` turns them into owners per table
partition, kept for that generation (docs/protocol.md, "Routing"). A description is
only used when the group is ``Stable``, every member holds an assignment of the same
epoch and this worker's generation did not change meanwhile.

``GET /tables/<table>/<key>`` asks :func:`~streamjoin.query.routing.decide` where to
answer, then reads the local store, forwards to the owner (once: the forwarded request
carries a header, and its receiver never forwards again) or redirects. Reads see the
store only: what the last flush applied, never the writes still buffered for the next
one (docs/queries.md, "Consistency").

A worker serving HTTPS forwards and redirects over HTTPS too (every worker of an app
has the same web settings), verifying the owner against ``web_tls_ca`` and, under
mutual TLS, presenting its own certificate (``forward_tls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from aiohttp import web

from streamjoin.errors import (
    KeyNotFound,
    QueryError,
    QueryKeyError,
    QueryUnauthorized,
    QueryUnavailable,
    StreamjoinError,
    TableAccessError,
)
from streamjoin.query.routing import (
    FORWARDED_HEADER,
    Action,
    LocalState,
    Location,
    MemberRoute,
    RoutingTable,
    decide,
    error_body,
    global_value_body,
    parse_flag,
    parse_key,
    parse_window_range,
    partition_of,
    require_table,
    value_body,
    windows_body,
)
from streamjoin.runtime.ops.web import Handler, bearer_token_ok
from streamjoin.state import window_layout as layout
from streamjoin.state.base import StorePartition
from streamjoin.windowed import WindowedTable
from streamjoin.windowed_aggregation import AggregateTable

if TYPE_CHECKING:
    from streamjoin.global_tables import GlobalTable
    from streamjoin.runtime.group.group_info import GroupInfo
    from streamjoin.runtime.group.membership import GroupMembership
    from streamjoin.runtime.table_state.global_tables import GlobalTableService
    from streamjoin.runtime.table_state.service import StateService, TableStores
    from streamjoin.state.table_partition import TablePartition
    from streamjoin.tables import Table
    from streamjoin.topology import Topology

log = logging.getLogger("streamjoin.queries")

__all__ = ["QueryService", "advertised_host", "error_response"]

_WILDCARDS = ("0.0.0.0", "::", "")
#: how long to wait between descriptions of a group that is not settled yet
_REFRESH_RETRY = 0.25
#: how often the routing table's generation is compared with the worker's, at the latest
_RECHECK = 2.0


class LocalTables(Protocol):
    """What the worker holds of each table partition (``WorkerTables``)."""

    def active_partition(self, table: str, partition: int) -> TablePartition | None: ...

    def assigned_partition(self, table: str, partition: int) -> bool: ...


def advertised_host(bind_host: str, port: int) -> str:
    """``host:port`` other workers and clients reach this worker's web server at: the
    bound address, or this machine's name when bound to every interface."""
    host = socket.gethostname() if bind_host in _WILDCARDS else bind_host
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}"


class QueryService:
    """Answers table reads for one worker and keeps the group's routing table."""

    def __init__(
        self,
        topology: Topology,
        *,
        tables: LocalTables,
        stores: TableStores | None,
        state_service: StateService | None,
        membership: Callable[[], GroupMembership | None],
        describe: Callable[[], Awaitable[GroupInfo]],
        self_host: str | None,
        token: str | None = None,
        forward_timeout: float = 5.0,
        forward_tls: ssl.SSLContext | None = None,
        global_tables: GlobalTableService | None = None,
    ) -> None:
        self._tables: Mapping[str, Table] = topology.tables
        #: global tables are answered from this worker's own copy, never forwarded
        self._global: Mapping[str, GlobalTable] = topology.global_tables
        self._global_service = global_tables
        self._worker_tables = tables
        self._stores = stores
        self._state = state_service
        self._membership = membership
        self._describe = describe
        self.self_host = self_host
        self._token = token
        self._forward_timeout = forward_timeout
        self._forward_tls = forward_tls
        #: how owners are asked and redirected to: as this worker serves
        self._scheme = "http" if forward_tls is None else "https"
        groups = topology.task_groups()
        self._sources = {t: g.sources for g in groups for t in g.tables}
        self._changelogs = {name: t.changelog.name for name, t in topology.tables.items()}
        self.routing: RoutingTable | None = None
        self._changed = asyncio.Event()
        self._refresher: asyncio.Task[None] | None = None
        self._stopped = True
        #: describe the group again even at the same generation (an owner did not answer:
        #: a static member restarted without a rebalance may have a new address)
        self._stale = False
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, serving: bool) -> None:
        """Start keeping the routing table when ``serving`` (the web server runs); else it
        starts with the first :meth:`locate`, so that a worker nobody queries never
        describes its group."""
        self._stopped = False
        if serving:
            self._keep_routing()

    def _keep_routing(self) -> None:
        if self._refresher is None and not self._stopped:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())
            self._changed.set()

    async def stop(self) -> None:
        self._stopped = True
        task, self._refresher = self._refresher, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def assignment_changed(self) -> None:
        """A rebalance completed here: the routing table is described again."""
        self._changed.set()

    # ------------------------------------------------------------------ routing

    def _generation(self) -> int:
        membership = self._membership()
        return -1 if membership is None else membership.generation

    def _rebalancing(self) -> bool:
        membership = self._membership()
        return membership is None or membership.rebalancing

    def current_routing(self) -> RoutingTable | None:
        """The routing table, if it describes this worker's current generation."""
        routing = self.routing
        if routing is None or routing.generation != self._generation() or self._rebalancing():
            return None
        return routing

    async def _refresh_loop(self) -> None:
        while True:
            # woken by each assignment; the timeout only guards against a missed wake-up
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), _RECHECK)
            self._changed.clear()
            while self._generation() >= 0 and (
                self._stale or self.routing is None or self.routing.generation != self._generation()
            ):
                try:
                    await self._refresh_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # broker hiccup: 503s until the next try works
                    log.debug("describing the group for routing failed: %r", exc)
                if (
                    self._stale
                    or self.routing is None
                    or self.routing.generation != self._generation()
                ):
                    await asyncio.sleep(_REFRESH_RETRY)

    async def _refresh_once(self) -> None:
        generation = self._generation()
        if generation < 0 or self._rebalancing():
            return
        info = await self._describe()
        epochs = {m.generation for m in info.members}
        if info.state != "Stable" or len(epochs) != 1 or generation != self._generation():
            return  # in flux: described again shortly
        self._stale = False
        self.routing = RoutingTable.build(
            generation,
            (MemberRoute(m.host, m.active, m.standby) for m in info.members),
            self._sources,
            self._changelogs,
        )
        log.debug("routing table for generation %d: %s", generation, self.routing.owners)

    def locate(self, table_name: str, key: Any) -> Location:
        """Where ``key`` of ``table_name`` lives (``key`` as the key codec takes it);
        :class:`QueryUnavailable` while the group's assignment is in flux."""
        require_table(table_name, self._tables)
        table = self._tables[table_name]
        key_bytes = table.key_codec.dumps(key)
        if key_bytes is None:
            raise QueryKeyError(f"table {table_name!r}: None keys have no partition")
        partition = partition_of(key_bytes, table.partitions)
        self._keep_routing()
        routing = self.current_routing()
        if routing is None:
            raise QueryUnavailable(
                "the group's assignment is not known yet (rebalancing, or being described "
                "after one); retry shortly"
            )
        return routing.locate(table_name, partition)

    # ------------------------------------------------------------------ HTTP

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/tables/{table}/{key:.+}", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            self._authorize(request)
            return await self._answer(request)
        except QueryError as exc:
            return error_response(exc)
        except StreamjoinError as exc:  # a store error, a codec error on the value...
            log.warning("query %s failed: %s", request.rel_url, exc)
            return error_response(QueryUnavailable(f"{type(exc).__name__}: {exc}"))

    def _authorize(self, request: web.Request) -> None:
        if not bearer_token_ok(request, self._token):
            raise QueryUnauthorized("this endpoint wants 'Authorization: Bearer <query_token>'")

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        name, text = request.match_info["table"], request.match_info["key"]
        global_table = self._global.get(name)
        if global_table is not None:
            return self._answer_global(global_table, text)
        require_table(name, [*self._tables, *self._global])
        table = self._tables[name]
        query = request.query
        allow_stale = parse_flag(query.get("allow_stale"), "allow_stale")
        redirect = parse_flag(query.get("redirect"), "redirect")
        window_range = parse_window_range(query.get("from"), query.get("to"))
        key_bytes = parse_key(text, table.key_codec)
        partition = partition_of(key_bytes, table.partitions)
        local, elsewhere = await self.route(
            request, table, partition, redirect=redirect, allow_stale=allow_stale
        )
        if elsewhere is not None:
            return elsewhere
        stale = not local.active  # answered here: the active owner, or a standby
        store = self._store_for(table, partition, stale=stale)
        lag = local.lag if stale else None
        if isinstance(table, WindowedTable):
            windows = self._windows(table, store, key_bytes, *window_range)
            if not windows:
                raise KeyNotFound(f"key {text!r} has no windows in table {name!r} in that range")
            body = windows_body(name, text, partition, windows, self.self_host, lag)
        else:
            raw = table.stored_value(store, key_bytes)
            if raw is None:
                raise KeyNotFound(f"key {text!r} is not in table {name!r}")
            value = table.value_codec.loads(raw)
            body = value_body(name, text, partition, value, self.self_host, lag)
        return web.Response(body=body, content_type="application/json")

    async def route(
        self,
        request: web.Request,
        table: Table,
        partition: int,
        *,
        redirect: bool,
        allow_stale: bool = False,
    ) -> tuple[LocalState, web.StreamResponse | None]:
        """Where ``request``, a read of ``table``'s ``partition``, is answered (table reads
        and web views routed by a table key): what this worker holds of it, and None to
        answer here, else the owner's answer (forwarded); a redirect to the owner or a
        :class:`QueryUnavailable` is raised."""
        local = self._local_state(table, partition)
        decision = decide(
            table=table.name,
            partition=partition,
            local=local,
            rebalancing=self._rebalancing(),
            routing=self.current_routing(),
            self_host=self.self_host,
            forwarded=FORWARDED_HEADER in request.headers,
            redirect=redirect,
            allow_stale=allow_stale,
        )
        if decision.action is Action.UNAVAILABLE:
            raise decision.unavailable()
        if decision.action is Action.REDIRECT and decision.target is not None:
            raise web.HTTPTemporaryRedirect(_url_on(self._scheme, decision.target, request))
        if decision.action is Action.FORWARD and decision.target is not None:
            return local, await self._forward(decision.target, request)
        return local, None

    def _answer_global(self, table: GlobalTable, text: str) -> web.StreamResponse:
        service = self._global_service
        progress = None if service is None else service.progress.get(table.name)
        if progress is None or not progress.restored:
            raise QueryUnavailable(f"global table {table.name!r} is still restoring here")
        key_bytes = parse_key(text, table.key_codec)
        try:
            raw = table.stored_value(key_bytes)
        except TableAccessError as exc:  # stopping: the copy was just detached
            raise QueryUnavailable(str(exc)) from exc
        if raw is None:
            raise KeyNotFound(f"key {text!r} is not in global table {table.name!r}")
        value = table.value_codec.loads(raw)
        body = global_value_body(table.name, text, value, self.self_host, progress.lag)
        return web.Response(body=body, content_type="application/json")

    def _local_state(self, table: Table, partition: int) -> LocalState:
        if self._worker_tables.active_partition(table.name, partition) is not None:
            return LocalState(active=True)
        if self._worker_tables.assigned_partition(table.name, partition):
            return LocalState(restoring=True)
        if self._stores is None or self._stores.get(table.name, partition) is None:
            return LocalState()
        lags = {} if self._state is None else self._state.lags()
        return LocalState(standby=True, lag=lags.get(table.changelog.name, {}).get(partition))

    def _store_for(self, table: Table, partition: int, *, stale: bool) -> StorePartition:
        if stale:
            store = None if self._stores is None else self._stores.get(table.name, partition)
        else:
            state = self._worker_tables.active_partition(table.name, partition)
            store = None if state is None else state.store
        if store is None:  # closed between the decision and the read: cannot happen today
            raise QueryUnavailable(f"partition {partition} of table {table.name!r} just moved")
        return store

    @staticmethod
    def _windows(
        table: WindowedTable, store: StorePartition, key: bytes, low: int, high: int
    ) -> list[tuple[int, int, Any]]:
        size = table.windows.size_ms if table.windows is not None else 0
        # (an aggregation's sliding windows and sessions know their own ends)
        end_of = table.window_end if isinstance(table, AggregateTable) else None
        out = []
        for data_key, raw in store.range_items(*layout.data_range(key, low, high)):
            start = layout.split_data_key(data_key).time_ms
            end = start + size if end_of is None else end_of(start, raw)
            out.append((start, end, table.value_codec.loads(raw)))
        return out

    async def _forward(self, owner: str, request: web.Request) -> web.StreamResponse:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._forward_timeout),
                connector=aiohttp.TCPConnector(ssl=self._forward_tls or True),
            )
        headers = {FORWARDED_HEADER: self.self_host or "?"}
        for name in ("Authorization", "Content-Type", "Accept"):
            if name in request.headers:
                headers[name] = request.headers[name]
        # (a web view may take other methods than GET, and a body)
        data = await request.read() if request.body_exists else None
        try:
            url = _url_on(self._scheme, owner, request)
            async with self._session.request(
                request.method, url, headers=headers, data=data
            ) as response:
                body = await response.read()
                out_headers = {}
                if "Retry-After" in response.headers:
                    out_headers["Retry-After"] = response.headers["Retry-After"]
                return web.Response(
                    status=response.status,
                    body=body,
                    headers=out_headers,
                    content_type=response.content_type or "application/json",
                )
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._stale = True  # it may have moved without a rebalance: describe again
            self._changed.set()
            raise QueryUnavailable(f"the owner {owner} did not answer: {exc!r}") from exc


def _url_on(scheme: str, host: str, request: web.Request) -> str:
    """The same request on another worker (path and query as received)."""
    return f"{scheme}://{host}{request.rel_url}"


def error_response(exc: QueryError) -> web.Response:
    headers = {}
    if isinstance(exc, QueryUnavailable):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    if isinstance(exc, QueryUnauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return web.Response(
        status=exc.status, body=error_body(exc), headers=headers, content_type="application/json"
    )
