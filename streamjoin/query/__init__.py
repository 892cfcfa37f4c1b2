"""Interactive queries: read a running app's tables from any worker or from outside.

:class:`TableClient` asks the workers' ``GET /tables/<table>/<key>`` endpoint;
:meth:`streamjoin.App.locate` says where a key lives. The decisions are in
:mod:`streamjoin.query.routing` (pure); the endpoint is
:mod:`streamjoin.runtime.ops.query_endpoint`. See docs/queries.md.
"""

from __future__ import annotations

from streamjoin.query.client import AsyncTableClient, TableClient
from streamjoin.query.routing import Location

__all__ = ["AsyncTableClient", "Location", "TableClient"]
