"""Tables through the in-memory test driver: dict API, partition routing, changelog, flush."""

from __future__ import annotations

import pytest

import streamjoin
from streamjoin.errors import AgentFailed, CopartitioningError, TableAccessError
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.testing.driver import TestDriver


def counting_app() -> tuple[streamjoin.App, object]:
    app = streamjoin.App("tables-unit")
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=4)
    counts = app.table("counts", default=int, key_serializer="str", copartitioned_with=clicks)

    @app.agent(clicks, name="count")
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1
            if event.value == "reset":
                del counts[event.key]

    return app, counts


def test_table_declares_a_compacted_copartitioned_changelog() -> None:
    app, _ = counting_app()
    changelog = app.topics["tables-unit-counts-changelog"]
    assert changelog.partitions == 4
    assert changelog.config["cleanup.policy"] == "compact"
    assert ("clicks", "tables-unit-counts-changelog") in app.copartition_groups
    assert app.changelog_topics == {"tables-unit-counts-changelog"}


def test_partition_count_conflicts_are_rejected() -> None:
    app = streamjoin.App("x")
    a = app.topic("a", partitions=4)
    with pytest.raises(CopartitioningError, match="partition counts differ"):
        app.table("t", partitions=6, copartitioned_with=a)


async def test_counts_changelog_and_store_agree() -> None:
    app, _ = counting_app()
    async with TestDriver(app) as driver:
        for user in ["ann", "bob", "ann", "cid", "ann", "bob"]:
            await driver.put("clicks", key=user, value="click")
        await driver.drain()
        table = app.tables["counts"]
        assert dict(table.items()) == {"ann": 3, "bob": 2, "cid": 1}
        # the changelog holds the latest value per key, on the key's partition
        latest = {}
        for record in driver.raw_records("tables-unit-counts-changelog"):
            latest[record.key] = (record.value, record.partition)
        assert {k: v for k, (v, _) in latest.items()} == {b"ann": b"3", b"bob": b"2", b"cid": b"1"}
        # after the flush the stores hold the data with the changelog offsets
        stores = {p: table.active_partition(p).store for p in table.active_partitions()}
        for partition, store in stores.items():
            if store.count():
                assert store.changelog_offset() is not None
                assert store.changelog_offset() == max(
                    r.offset
                    for r in driver.raw_records("tables-unit-counts-changelog")
                    if r.partition == partition
                )
        await driver.put("clicks", key="ann", value="reset")
        await driver.drain()
        assert "ann" not in dict(table.items())


async def test_flush_compacts_writes_between_commits() -> None:
    app, _ = counting_app()
    async with TestDriver(app) as driver:
        for _ in range(10):
            await driver.put("clicks", key="ann", value="click")
        await driver.drain()  # one flush at the end: only the last value is sent
        changelog = driver.raw_records("tables-unit-counts-changelog")
        assert [(r.key, r.value) for r in changelog] == [(b"ann", b"10")]


async def test_deletes_reach_the_changelog_only_for_keys_it_holds() -> None:
    """A key written and deleted between two flushes never reached the changelog: no
    tombstone is sent for it; a key flushed earlier gets its tombstone."""
    app, _ = counting_app()
    changelog = "tables-unit-counts-changelog"
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="ann", value="click")
        await driver.drain()  # ann=1 flushed
        await driver.put("clicks", key="bob", value="click")
        await driver.put("clicks", key="bob", value="reset")  # bob written and deleted
        await driver.put("clicks", key="ann", value="reset")
        await driver.drain()
        sent = [(r.key, r.value) for r in driver.raw_records(changelog)]
        assert sent == [(b"ann", b"1"), (b"ann", None)]
        assert dict(app.tables["counts"].items()) == {}


async def test_writes_from_a_non_copartitioned_topic_fail_clearly() -> None:
    app = streamjoin.App("x")
    clicks = app.topic("clicks", partitions=4)
    other = app.topic("other", partitions=4)
    counts = app.table("counts", default=int, copartitioned_with=clicks)

    @app.agent(other)
    async def wrong(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    async with TestDriver(app) as driver:
        await driver.put("other", key=b"k", value=1)
        with pytest.raises(AgentFailed, match="not co-partitioned"):
            await driver.drain()


async def test_writes_outside_agents_are_rejected_but_reads_route_by_key() -> None:
    app, counts = counting_app()
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="ann", value="click")
        await driver.drain()
        assert counts["ann"] == 1  # type: ignore[index]
        assert counts.get("nobody") is None  # type: ignore[attr-defined]
        assert "ann" in counts  # type: ignore[operator]
        with pytest.raises(TableAccessError, match="only be written from an agent"):
            counts["ann"] = 5  # type: ignore[index]
