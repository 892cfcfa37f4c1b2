"""The worker's HTTP server (aiohttp): metrics, the status page and its JSON twin.

Routes are a list of ``(method, path, handler)``; more can be added with
:meth:`WebServer.add_route` before the server starts: the Worker adds the interactive
table queries' ``GET /tables/<table>/<key>`` (``runtime/ops/query_endpoint.py``), the
health probes (``runtime/ops/health.py``) and the app's web views
(``runtime/ops/views.py``) this way, in that order (the first route matching a request
answers it). The access log is off: a scrape every few seconds must not become a log line every
few seconds.

With an SSL context (``App(web_tls_cert=..., web_tls_key=...)``, built by
:func:`streamjoin.query.tls.server_context` before anything starts) it serves HTTPS
only, and :attr:`WebServer.url` says ``https://``.
"""

from __future__ import annotations

import hmac
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from streamjoin.config import AppConfig, Secret
from streamjoin.errors import LifecycleError
from streamjoin.query.tls import WORKER_SETTINGS, client_context, server_context
from streamjoin.runtime.ops.status_page import render_status_page

__all__ = ["Handler", "WebServer", "WebTLS", "bearer_token_ok", "web_tls_contexts"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class WebTLS:
    """The worker's two TLS contexts: the one it serves with, and the one it asks other
    workers with when it forwards a read (verifying them; presenting its own certificate
    under mutual TLS)."""

    server: ssl.SSLContext
    forward: ssl.SSLContext


def web_tls_contexts(config: AppConfig) -> WebTLS | None:
    """The contexts of ``config``'s ``web_tls_*`` settings (None: plain HTTP). Reads the
    files now: a missing, unreadable or mismatched one is a ConfigurationError naming it."""
    if config.web_tls_cert is None or config.web_tls_key is None:
        return None
    password = config.web_tls_key_password
    key_password = password.reveal() if isinstance(password, Secret) else password
    mutual = config.web_tls_client_ca is not None
    return WebTLS(
        server=server_context(
            config.web_tls_cert,
            config.web_tls_key,
            client_ca_file=config.web_tls_client_ca,
            key_password=key_password,
        ),
        forward=client_context(
            config.web_tls_ca,
            cert_file=config.web_tls_cert if mutual else None,
            key_file=config.web_tls_key if mutual else None,
            key_password=key_password,
            setting_names=WORKER_SETTINGS,
        ),
    )


def bearer_token_ok(request: web.Request, token: str | None) -> bool:
    """Whether ``request`` carries ``Authorization: Bearer <token>`` (always true when no
    token is set); compared in constant time. Table queries and web views ask the same."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


class WebServer:
    """Serves ``/metrics``, ``/status.json``, ``/`` and the added routes for one worker."""

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, Any]],
        registry: CollectorRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._tls = tls
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
        return f"{self.scheme}://{host}:{self.port}/"

    @property
    def scheme(self) -> str:
        return "http" if self._tls is None else "https"

    async def start(self) -> None:
        app = web.Application()
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True, ssl_context=self._tls)
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
