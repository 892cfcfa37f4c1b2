"""``app.table(..., store="memory" | "rocksdb")``: the declaration, which store a worker
opens for each table, and what an in-memory table leaves (nothing) on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

import streamjoin
from streamjoin.errors import ConfigurationError
from streamjoin.runtime.table_state.service import STORES_DIR, TableStores
from streamjoin.runtime.tasks.agent_runtime import Stream
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.testing.driver import TestDriver


def two_tables(app_id: str = "store-choice", **app_options: object) -> streamjoin.App:
    app = streamjoin.App(app_id, **app_options)  # type: ignore[arg-type]
    clicks = app.topic("clicks", key_serializer="str", value_serializer="json", partitions=2)
    on_disk = app.table("on_disk", default=int, key_serializer="str", copartitioned_with=clicks)
    in_memory = app.table(
        "in_memory", default=int, key_serializer="str", copartitioned_with=clicks, store="memory"
    )

    @app.agent(clicks, name="count")
    async def count(stream: Stream) -> None:
        async for event in stream:
            on_disk[event.key] += 1
            in_memory[event.key] += 1

    return app


def test_the_store_is_declared_per_table() -> None:
    app = two_tables()
    assert app.tables["on_disk"].store == "rocksdb"
    assert app.tables["in_memory"].store == "memory"


def test_an_unknown_store_is_a_configuration_error() -> None:
    app = streamjoin.App("store-choice")
    with pytest.raises(ConfigurationError, match="store must be one of 'rocksdb', 'memory'"):
        app.table("t", store="redis")  # type: ignore[arg-type]
    assert not app.tables


def test_a_worker_opens_each_table_in_its_store(tmp_path: Path) -> None:
    app = two_tables()
    for table in app.tables.values():
        table.changelog.partitions = 2
    stores = TableStores(app.tables, state_dir=tmp_path)
    try:
        memory = stores.open(app.tables["in_memory"], 0)
        disk = stores.open(app.tables["on_disk"], 0)
        assert isinstance(memory, MemoryStorePartition)
        assert not isinstance(disk, MemoryStorePartition)
        memory.write({b"k": b"1"}, 7)
        disk.write({b"k": b"1"}, 3)
        # only the RocksDB table has a database under the state dir
        assert sorted(p.name for p in (tmp_path / STORES_DIR).iterdir()) == ["on_disk"]
        # an open memory store reports its offset (its lag counts, as a standby's);
        # a closed one has none: it starts empty next time
        assert ("in_memory", 0) in stores.on_disk()
        assert stores.stored_offset(app.tables["in_memory"], 0) == 7
        stores.close(app.tables["in_memory"], 0)
        assert ("in_memory", 0) not in stores.on_disk()
        assert stores.stored_offset(app.tables["in_memory"], 0) is None
        assert stores.open(app.tables["in_memory"], 0).get(b"k") is None
        # wiping a memory store touches no database
        stores.destroy(app.tables["in_memory"], 0)
        assert sorted(p.name for p in (tmp_path / STORES_DIR).iterdir()) == ["on_disk"]
        assert ("on_disk", 0) in stores.on_disk()
    finally:
        stores.close_all()


async def test_memory_and_rocksdb_tables_give_the_same_answers() -> None:
    app = two_tables()
    async with TestDriver(app) as driver:
        for user in ["ann", "bob", "ann", "cid", "ann"]:
            await driver.put("clicks", key=user, value="click")
        await driver.drain()
        assert dict(app.tables["in_memory"].items()) == {"ann": 3, "bob": 1, "cid": 1}
        assert dict(app.tables["on_disk"].items()) == dict(app.tables["in_memory"].items())
        changelogs = {
            name: sorted(
                (r.key, r.value) for r in driver.raw_records(f"store-choice-{name}-changelog")
            )
            for name in ("on_disk", "in_memory")
        }
        assert changelogs["on_disk"] == changelogs["in_memory"] != []


def test_an_app_without_a_state_dir_keeps_every_table_in_memory(tmp_path: Path) -> None:
    app = two_tables()
    stores = TableStores(app.tables, state_dir=None)
    try:
        for name in ("on_disk", "in_memory"):
            assert not stores.on_disk_store(app.tables[name])
            assert isinstance(stores.open(app.tables[name], 1), MemoryStorePartition)
    finally:
        stores.close_all()
