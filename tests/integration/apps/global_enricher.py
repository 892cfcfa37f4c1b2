"""A stream-global-table join, parameterized by environment for integration tests.

$SJT_USERS is the global table's topic (user -> {"country": ...}), $SJT_CLICKS the
stream (any key; the value names its user), $SJT_INNER and $SJT_LEFT the outputs of the
inner and the left join, $SJT_PARTITIONS the partitions of the clicks and outputs,
$SJT_USER_PARTITIONS the users topic's (another count: nothing is co-partitioned).
"""

from __future__ import annotations

import os
from typing import Any

import streamjoin
from streamjoin.events import Event

app = streamjoin.App(
    os.environ.get("SJT_APP_ID", "global-enricher"),
    broker=os.environ.get("SJT_BROKER", "kafka://127.0.0.1:9092"),
    commit_interval=0.3,
    processing_guarantee=os.environ.get("SJT_GUARANTEE", "at_least_once"),
    consumer_options={"session_timeout_ms": 6_000, "heartbeat_interval_ms": 1_000},
)
PARTITIONS = int(os.environ.get("SJT_PARTITIONS", "4"))
users = app.topic(
    os.environ["SJT_USERS"],
    key_serializer="str",
    value_serializer="json",
    partitions=int(os.environ.get("SJT_USER_PARTITIONS", "3")),
)
clicks = app.topic(
    os.environ["SJT_CLICKS"], key_serializer="str", value_serializer="json", partitions=PARTITIONS
)
inner_out = app.topic(
    os.environ["SJT_INNER"], key_serializer="str", value_serializer="json", partitions=PARTITIONS
)
left_out = app.topic(
    os.environ["SJT_LEFT"], key_serializer="str", value_serializer="json", partitions=PARTITIONS
)
user_table = app.global_table(users, name="users")


def user_of(event: Event) -> Any:
    return event.value["user"]


def enrich(key: str, click: Any, user: Any) -> dict[str, Any]:
    return {"user": click["user"], "country": None if user is None else user["country"]}


app.join(clicks, user_table, key=user_of, how="inner", output=inner_out, name="inner")(enrich)
app.join(clicks, user_table, key=user_of, how="left", output=left_out, name="left")(enrich)
