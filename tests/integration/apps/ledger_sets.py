"""The ledger app (tests/integration/apps/ledger.py) with a set table beside its counts.

A second agent on the ledger's input turns each event id ``e<n>`` into one set operation on
its key's set in the set table ``members`` (adds and discards of a few members: see
:mod:`tests.integration.apps.member_operations`), so a reader of the input topic can
compute every key's final set and compare it with the table's changelog.
$SJT_TABLE_STORE picks the store of both tables; $SJT_KEYS is the traffic's key count.
"""

from __future__ import annotations

import os

from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.apps.ledger import app, source
from tests.integration.apps.member_operations import operation

__all__ = ["app"]

members = app.set_table(
    "members",
    key_serializer="str",
    value_serializer="str",
    copartitioned_with=source,
    store=os.environ.get("SJT_TABLE_STORE", "rocksdb"),  # type: ignore[arg-type]
)


KEYS = int(os.environ.get("SJT_KEYS", "24"))


@app.agent(source, name="members")
async def track(stream: Stream) -> None:
    async for event in stream:
        op, member = operation(event.value, KEYS)
        if op == "add":
            members[event.key].add(member)
        else:
            members[event.key].discard(member)
