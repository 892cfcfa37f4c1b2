"""The worker's HTTP server (aiohttp): metrics, the status page and its JSON twin.

Routes are a list of ``(method, path, handler)``; more can be added with
:meth:`WebServer.add_route` before the server starts: the Worker adds the interactive
table queries' ``GET /tables/<table>/<key>`` (``runtime/ops/query_endpoint.py``) this
way. The access log is off: a scrape every few seconds must not become a log line every
few seconds.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from streamjoin.errors import LifecycleError
from streamjoin.runtime.ops.status_page import render_status_page

__all__ = ["Handler", "WebServer"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WebServer:
    """Serves ``/metrics``, ``/status.json``, ``/`` and the added routes for one worker."""

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, Any]],
        registry: CollectorRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._snapshot = snapshot
        self._registry = registry
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self.routes: list[tuple[str, str, Handler]] = [
            ("GET", "/", self._page),
            ("GET", "/status.json", self._status),
            ("GET", "/metrics", self._metrics),
        ]

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        if self._runner is not None:
            raise LifecycleError("routes are added before the web server starts")
        self.routes.append((method, path, handler))

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        app = web.Application()
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise LifecycleError(
                f"cannot serve the status page on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from exc
        self._runner = runner
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self.port = int(address[1])  # the port picked when asked for 0
                break

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _status(self, request: web.Request) -> web.Response:
        return web.Response(
            text=json.dumps(self._snapshot(), default=str), content_type="application/json"
        )

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=render_status_page(self._snapshot()), content_type="text/html")
