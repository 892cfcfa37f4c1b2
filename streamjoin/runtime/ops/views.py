"""The app's web views (``@app.page``) on the worker's web server (docs/web.md).

Each view is served as declared (``streamjoin/web_views.py``): the bearer token is asked
unless the view is public (the same ``query_token`` and check as table queries); a view
routed by a table key (``@app.table_route``) is answered where a read of that key is,
through the query endpoint's routing (``QueryService.route``): here when this worker is
the key's active owner, else forwarded to the owner once (or redirected with
``?redirect=1``), else ``503`` with ``Retry-After``. The handler's answer is sent as it
is when it is an aiohttp response, else as JSON.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from streamjoin.errors import (
    LifecycleError,
    QueryError,
    QueryKeyError,
    QueryUnauthorized,
    StreamjoinError,
)
from streamjoin.query.routing import jsonable, parse_flag, parse_key, partition_of
from streamjoin.runtime.ops.query_endpoint import QueryService, error_response
from streamjoin.runtime.ops.web import Handler, bearer_token_ok
from streamjoin.web_views import TableRoute, WebView

log = logging.getLogger("streamjoin.web")

__all__ = ["WebViews"]


class WebViews:
    """Serves the declared ``views``: the token, a routed view's owner, the answer."""

    def __init__(
        self,
        views: Sequence[WebView],
        *,
        queries: QueryService | None,
        token: str | None,
    ) -> None:
        if queries is None and any(view.route is not None for view in views):
            raise LifecycleError("views routed by a table key need the worker's query service")
        self._views = tuple(views)
        self._queries = queries
        self._token = token

    def routes(self) -> list[tuple[str, str, Handler]]:
        out: list[tuple[str, str, Handler]] = []
        for view in self._views:
            handler = functools.partial(self._serve, view)
            out.extend((method, view.path, handler) for method in view.methods)
        return out

    async def _serve(self, view: WebView, request: web.Request) -> web.StreamResponse:
        try:
            if not view.public and not bearer_token_ok(request, self._token):
                raise QueryUnauthorized("this page wants 'Authorization: Bearer <query_token>'")
            if view.route is not None:
                elsewhere = await self._route(view.route, request)
                if elsewhere is not None:
                    return elsewhere
            arguments = {name: request.match_info[name] for name in view.arguments}
            result = await view.handler(request, **arguments)
        except QueryError as exc:
            return error_response(exc)
        except web.HTTPException:
            raise  # the view's own answer (web.HTTPNotFound(), a redirect...)
        except StreamjoinError as exc:
            log.warning(
                "view %s (%s) failed: %s: %s", view.name, request.path, type(exc).__name__, exc
            )
            return _failed(f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("view %s (%s) failed", view.name, request.path)
            return _failed(f"the view raised {type(exc).__name__} (see the worker's log)")
        if isinstance(result, web.StreamResponse):
            return result
        return web.Response(text=json.dumps(jsonable(result)), content_type="application/json")

    async def _route(self, route: TableRoute, request: web.Request) -> web.StreamResponse | None:
        """None: answer here; else the owner's answer (raises a 503 or a redirect)."""
        if self._queries is None:  # refused in __init__
            raise LifecycleError("no query service")
        if route.match_info is not None:
            text = request.match_info.get(route.match_info)
        else:
            text = request.query.get(route.query_param or "")
        if text is None:
            raise QueryKeyError(f"this page is routed by its {route.where}, which is missing")
        table = route.table
        partition = partition_of(parse_key(text, table.key_codec), table.partitions)
        redirect = parse_flag(request.query.get("redirect"), "redirect")
        _, elsewhere = await self._queries.route(request, table, partition, redirect=redirect)
        return elsewhere


def _failed(message: str) -> web.Response:
    body: dict[str, Any] = {"error": "ViewFailed", "message": message, "status": 500}
    return web.Response(status=500, text=json.dumps(body), content_type="application/json")
