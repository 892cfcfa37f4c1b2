"""The ledger with a set table (tests/integration/apps/ledger_sets.py) plus a TTL table and
a stream join over a versioned topic table, all on the ledger's input: one app (one
commit) holding every stateful plain table kind, for test_table_kinds_rebalance.py.

Besides ledger_sets' environment: each event adds one to its key's count in the TTL table
``recent`` ($SJT_RECENT_TTL_MS of stream time) and sends ``{"id", "count"}`` to
$SJT_RECENT; and it is joined (left) with its key's row in the versioned topic table over
$SJT_USERS (history $SJT_HISTORY_MS) as of the event's timestamp, ``{"id", "user"}`` to
$SJT_JOINED. Every topic has $SJT_PARTITIONS partitions.
"""

from __future__ import annotations

import os
from typing import Any

from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.apps.ledger import PARTITIONS, source
from tests.integration.apps.ledger_sets import app

__all__ = ["app"]


def _json_topic(env: str) -> Any:
    return app.topic(
        os.environ[env], key_serializer="str", value_serializer="json", partitions=PARTITIONS
    )


recent_out = _json_topic("SJT_RECENT")
joined = _json_topic("SJT_JOINED")
users = app.topic_table(
    _json_topic("SJT_USERS"), history_ms=int(os.environ.get("SJT_HISTORY_MS", "600000"))
)
recent = app.table(
    "recent",
    default=int,
    key_serializer="str",
    copartitioned_with=source,
    ttl_ms=int(os.environ["SJT_RECENT_TTL_MS"]),
)


@app.agent(source, name="recent")
async def count_recent(stream: Stream) -> None:
    async for event in stream:
        recent[event.key] += 1
        await recent_out.send(key=event.key, value={"id": event.value, "count": recent[event.key]})


@app.join(source, users, how="left", output=joined, name="as-of")
def as_of(key: str, event: str, user: Any) -> Any:
    return {"id": event, "user": user}
