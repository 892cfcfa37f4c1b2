"""The ledger app (tests/integration/apps/ledger.py) with a set table changed through its
manager: each input ``e<n>`` of key ``k`` turns into one set operation (see
:mod:`tests.integration.apps.member_operations`) on the set of key ``t<k>``, sent with
``members.manager``; ``t<k>`` is usually on another partition than ``k``, so the owner
of that partition, often another worker, applies it. Every worker also holds the whole
set table as the set global table ``members-global``, served by its web endpoint (on a
free port). $SJT_KEYS is the traffic's key count.
"""

from __future__ import annotations

import os

from streamjoin.runtime.tasks.agent_runtime import Stream
from tests.integration.apps.ledger import PARTITIONS, app, source
from tests.integration.apps.member_operations import operation

__all__ = ["app", "target_of"]

members = app.set_table(
    "members", key_serializer="str", value_serializer="str", partitions=PARTITIONS, manager=True
)
everywhere = app.set_global_table(members)
app.configure(web_port=0)

KEYS = int(os.environ.get("SJT_KEYS", "24"))


def target_of(key: str) -> str:
    """The key whose set an input of ``key`` changes."""
    return f"t{key}"


@app.agent(source, name="members")
async def send_operations(stream: Stream) -> None:
    manager = members.manager
    async for event in stream:
        op, member = operation(event.value, KEYS)
        if op == "add":
            await manager.add(target_of(event.key), member)
        else:
            await manager.discard(target_of(event.key), member)
