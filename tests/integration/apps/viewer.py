"""The counter app (apps/counter.py) with web views: ``/count/{word}`` routed by the key of
table ``counts`` (answered by the key's owner, saying which worker it is), and a public
page."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.integration.apps.counter import app, counts

__all__ = ["app"]


@app.page("/count/{word}")
@app.table_route(counts, match_info="word")
async def count(request: web.Request, word: str) -> dict[str, Any]:
    return {"word": word, "count": counts[word], "served_by": request.host}


@app.page("/hello", public=True)
async def hello(request: web.Request) -> web.Response:
    return web.Response(text=f"<h1>{app.id}</h1>", content_type="text/html")
