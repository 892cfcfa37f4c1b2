"""`streamjoin table get` over stores on disk written by the real table code."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from streamjoin.cli import cli
from streamjoin.partitioner import partition_for_key
from streamjoin.state.inspect import store_path
from streamjoin.state.rocksdb import RocksDBStorePartition
from streamjoin.testing.driver import TestDriver

MODULE = "sj_table_get_app"
APP_SOURCE = textwrap.dedent(
    """
    import streamjoin
    from streamjoin.state.windows import TumblingWindows

    # no partition counts anywhere: settled when the app starts (topic_partitions)
    app = streamjoin.App("cli-win", topic_partitions=3)
    clicks = app.topic("clicks", key_serializer="str")
    per_minute = app.table(
        "per-minute",
        default=int,
        key_serializer="str",
        window=TumblingWindows(size_ms=60_000, retention_ms=600_000),
        copartitioned_with=clicks,
    )
    totals = app.table("totals", default=int, key_serializer="str", copartitioned_with=clicks)

    @app.agent(clicks)
    async def count(stream):
        async for event in stream:
            per_minute[event.key] += 1
            totals[event.key] += 1
    """
)


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / f"{MODULE}.py").write_text(APP_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(MODULE, None)


async def _write_state(state_dir: Path) -> None:
    """Run the app's agent in memory, then store its table partitions on disk as a worker
    would have them."""
    app = importlib.import_module(MODULE).app
    async with TestDriver(app) as driver:
        for ts in (1_000, 2_000, 61_000):
            await driver.put("clicks", key="user-1", value=1, timestamp_ms=ts)
        await driver.put("clicks", key="user-2", value=1, timestamp_ms=3_000)
        await driver.drain()
        assert driver.stores is not None
        for name, partition in driver.stores.open_keys():
            source = driver.stores.get(name, partition)
            assert source is not None
            target = RocksDBStorePartition(
                store_path(state_dir, name), table=name, partition=partition
            )
            target.write(dict(source.items()), source.changelog_offset())
            target.close()
    # the CLI imports the module afresh: no partition count was ever declared
    sys.modules.pop(MODULE, None)


def _table_get(state_dir: Path, table: str, key: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli, ["table", "get", "-A", f"{MODULE}:app", "--state-dir", str(state_dir), table, key]
    )
    return result.exit_code, result.stdout, result.stderr


async def test_table_get_on_a_windowed_table_prints_the_keys_windows(app_dir: Path) -> None:
    state_dir = app_dir / "state"
    await _write_state(state_dir)

    code, out, err = _table_get(state_dir, "per-minute", "user-1")
    assert code == 0, (out, err)
    assert json.loads(out) == [
        {"start": 0, "end": 60_000, "value": 2},
        {"start": 60_000, "end": 120_000, "value": 1},
    ]
    assert f"(partition {partition_for_key(b'user-1', 3)})" in err

    code, out, err = _table_get(state_dir, "per-minute", "user-9")
    assert code == 1 and out == ""
    assert "'user-9' has no windows in the local state of table 'per-minute'" in err


async def test_table_get_finds_keys_of_tables_whose_count_is_settled_at_start(
    app_dir: Path,
) -> None:
    state_dir = app_dir / "state"
    await _write_state(state_dir)
    code, out, err = _table_get(state_dir, "totals", "user-1")
    assert (code, out.strip()) == (0, "3"), err
    assert f"(partition {partition_for_key(b'user-1', 3)})" in err
    code, out, err = _table_get(state_dir, "totals", "user-9")
    assert code == 1 and "'user-9' is not in the local state of table 'totals'" in err
