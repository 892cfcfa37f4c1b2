"""``app.topic_table(topic, ttl_ms=N)``: a topic table whose rows expire after N ms of
the partition's stream time, seen by the stream-table join, with a changelog tombstone
per expired row; and the combinations refused with a clear error."""

from __future__ import annotations

from typing import Any

import pytest

import streamjoin
from streamjoin.errors import ConfigurationError, SparkJobError
from streamjoin.testing.driver import TestDriver
from streamjoin.ttl_tables import TtlTable, refuse_in_spark

APP_ID = "topic-ttl-unit"
TTL_MS = 1_000


def join_app() -> tuple[streamjoin.App, Any]:
    """Clicks (left) joined with the latest ``users`` row of their key, kept 1 s."""
    app = streamjoin.App(APP_ID)
    users = app.topic("users", key_serializer="str", value_serializer="json", partitions=1)
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=1)
    app.topic("joined", key_serializer="str", value_serializer="json", partitions=1)
    table = app.topic_table(users, ttl_ms=TTL_MS)

    @app.join(clicks, table, how="left", output="joined", name="enrich")
    def enrich(key: Any, click: Any, user: Any) -> Any:
        return {"click": click, "user": user}

    return app, table


async def test_rows_expire_by_stream_time_for_the_join_and_leave_a_tombstone() -> None:
    app, table = join_app()
    assert isinstance(table, TtlTable) and table.ttl_ms == TTL_MS
    async with TestDriver(app) as driver:
        await driver.put("users", key="ann", value="fr", timestamp_ms=10_000)
        await driver.put("users", key="bob", value="de", timestamp_ms=10_000)
        await driver.drain()  # (flushed: the changelog has the rows, so expiring needs tombstones)
        await driver.put("clicks", key="ann", value=1, timestamp_ms=10_500)
        await driver.put("users", key="bob", value="at", timestamp_ms=10_600)  # kept alive
        await driver.put("clicks", key="ann", value=2, timestamp_ms=11_000)  # ann expired
        await driver.put("clicks", key="bob", value=3, timestamp_ms=11_100)
        await driver.drain()
        joined = [(e.key, e.value) for e in driver.records("joined")]
        assert joined == [
            ("ann", {"click": 1, "user": "fr"}),
            ("ann", {"click": 2, "user": None}),
            ("bob", {"click": 3, "user": "at"}),
        ]
        assert "ann" not in table and table["bob"] == "at"
        changelog = driver.raw_records(f"{APP_ID}-users-table-changelog")
        assert (b"ann", None) in [(r.key, r.value) for r in changelog]  # purged at a flush
        await driver.put("clicks", key="bob", value=4, timestamp_ms=11_600)  # bob: 10.6 + 1
        await driver.drain()
        assert driver.records("joined")[-1].value == {"click": 4, "user": None}


async def test_a_tombstone_on_the_topic_still_deletes_a_row() -> None:
    app, _ = join_app()
    async with TestDriver(app) as driver:
        await driver.put("users", key="ann", value="fr", timestamp_ms=1_000)
        await driver.put("users", key="ann", value=None, timestamp_ms=1_100)
        await driver.put("clicks", key="ann", value=1, timestamp_ms=1_200)
        await driver.drain()
        assert [e.value for e in driver.records("joined")] == [{"click": 1, "user": None}]


def test_combinations_that_cannot_work_are_refused() -> None:
    app = streamjoin.App(APP_ID)
    users = app.topic("users", key_serializer="str", partitions=1)
    orders = app.topic("orders", key_serializer="str", partitions=1)
    with pytest.raises(
        ConfigurationError, match=r"history_ms \(a versioned table\) does not combine with ttl_ms"
    ):
        app.topic_table(users, ttl_ms=TTL_MS, history_ms=TTL_MS)
    with pytest.raises(ConfigurationError, match="ttl_ms must be > 0"):
        app.topic_table(users, name="t0", ttl_ms=0)
    expiring = app.topic_table(users, name="expiring", ttl_ms=TTL_MS)
    with pytest.raises(ConfigurationError, match="has ttl_ms: table-table and foreign-key"):
        app.join(expiring, app.topic_table(orders), name="tt")(lambda k, a, b: a)
    with pytest.raises(SparkJobError, match="'expiring' is a TTL table"):
        refuse_in_spark("bootstrap", expiring)
    refuse_in_spark("bootstrap", app.topic_table(users, name="plain"), None)  # (no error)
