"""AppConfig validation and secrets, the frozen Topology and its task groups, and the
TaskManager's lifecycle (no broker)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

import streamjoin
from streamjoin.cli import cli
from streamjoin.config import AppConfig, Secret
from streamjoin.errors import ConfigurationError, StoreCorrupted, StreamjoinError
from streamjoin.runtime.table_state.flush import TableFlusher
from streamjoin.runtime.tasks.task import Task, TaskManager, TaskState
from streamjoin.state.memory import MemoryStorePartition
from streamjoin.state.table_partition import TablePartition
from streamjoin.stream import Stream
from streamjoin.testing.driver import TestDriver
from tests.declarations import differences, every_kind_app, fingerprint
from tests.unit.runtime.counting_app import counting_app

# ------------------------------------------------------------------ AppConfig


def test_config_is_frozen_and_replace_validates() -> None:
    config = AppConfig("cfg", commit_interval=0.5)
    with pytest.raises(AttributeError):
        config.commit_interval = 2  # type: ignore[misc]
    assert config.replace(commit_interval=2).commit_interval == 2
    with pytest.raises(ConfigurationError, match="commit_interval"):
        config.replace(commit_interval=0)
    with pytest.raises(ConfigurationError, match="unknown App settings: nope"):
        config.replace(nope=1)
    with pytest.raises(ConfigurationError, match="standby_replicas"):
        config.replace(standby_replicas=-1)
    with pytest.raises(ConfigurationError, match="broker"):
        config.replace(broker="not a url")


def test_credentials_never_print() -> None:
    app = streamjoin.App(
        "secret-app",
        client_options={"sasl_plain_username": "me", "sasl_plain_password": "hunter2"},
        producer_options={"ssl_password": "s3cret"},
    )
    printed = " ".join([repr(app), repr(app.config), str(app.config)])
    assert "hunter2" not in printed and "s3cret" not in printed
    assert isinstance(app.config.client_options["sasl_plain_password"], Secret)
    # the Kafka clients get the real value
    assert app.config.client_kwargs()["sasl_plain_password"] == "hunter2"
    assert app.config.client_kwargs()["sasl_plain_username"] == "me"


def test_app_settings_go_through_the_same_validation() -> None:
    app = streamjoin.App("settings-app")
    app.configure(broker="kafka://127.0.0.1:9999")
    assert app.config.broker == "127.0.0.1:9999"
    with pytest.raises(ConfigurationError, match="broker"):
        app.configure(broker="kafka://nohost")
    with pytest.raises(ConfigurationError, match="group_instance_id"):
        app.configure(group_instance_id="  ")
    app.configure(state_dir="/tmp/x")
    assert app.config.state_path == Path("/tmp/x")
    with pytest.raises(StreamjoinError):
        app.configure(capacity=0)


def test_worker_cli_overrides_are_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cfgapp.py").write_text("import streamjoin\napp = streamjoin.App('cfgapp')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(cli, ["worker", "-A", "cfgapp:app", "--instance-id", " "])
    assert result.exit_code == 3, result.output  # cannot start (2 is click's usage error)
    assert "group_instance_id must be a non-empty string" in result.output
    result = CliRunner().invoke(cli, ["worker", "-A", "cfgapp:app", "-b", "kafka://x"])
    assert result.exit_code != 0 and "broker" in result.output


# ------------------------------------------------------------------ Topology


def _join_app() -> streamjoin.App:
    app = streamjoin.App("topo")
    left = app.topic("left", partitions=3)
    right = app.topic("right", partitions=3)
    other = app.topic("other", partitions=2)
    out = app.topic("out", partitions=3)

    @app.join(left, right, window=1000, output=out, name="j")
    def joined(key: object, a: object, b: object) -> object:
        return (a, b)

    counts = app.table("counts", default=int, copartitioned_with=other)

    @app.agent(other)
    async def count(stream: Stream) -> None:
        async for event in stream:
            counts[event.key] += 1

    return app


def test_topology_is_frozen_and_groups_tasks() -> None:
    topology = _join_app().topology()
    with pytest.raises(TypeError):
        topology.tables["x"] = None  # type: ignore[index]
    groups = {g.sources: g for g in topology.task_groups()}
    join = groups[("left", "right")]
    assert join.tables == ("j-buffer",)
    assert "topo-j-buffer-changelog" in join.topics
    assert groups[("other",)].tables == ("counts",)
    assert topology.source_topics == frozenset({"left", "right", "other"})
    assert topology.aligned_groups() == [("left", "right")]


async def test_a_run_changes_no_declaration() -> None:
    app = every_kind_app("declarations-driver")
    before = fingerprint(app)
    async with TestDriver(app) as driver:
        for i in range(40):
            key = f"k{i % 7}"
            await driver.put("ads", key=key, value={"ad": i}, timestamp_ms=i * 100)
            await driver.put("clicks", key=key, value=i, timestamp_ms=i * 100)
            await driver.put("views", key=key, value=i, timestamp_ms=i * 100 + 50)
        await driver.drain()
        assert driver.records("click-view") and driver.records("view-ad")
        await driver.commit()
        await driver.revoke([("clicks", 0), ("views", 0), ("ads", 0)])
        await driver.assign([("clicks", 0), ("views", 0), ("ads", 0)])
        await driver.put("views", key="k1", value=99, timestamp_ms=60_000)
        await driver.drain()
    assert differences(before, fingerprint(app)) == []


def test_the_fingerprint_sees_a_field_a_run_writes() -> None:
    app = every_kind_app("declarations-seen")
    before = fingerprint(app)
    app.topics["clicks"].partitions = 4
    assert differences(before, fingerprint(app)) == ["topics['clicks'].partitions: None -> 4"]
    app.topics["clicks"].partitions = None
    app.tables["per-second"].default = list  # (a field the declaration set)
    assert any("per-second" in d for d in differences(before, fingerprint(app)))
    app.tables["per-second"].default = int
    # an attribute a run adds (a compiled table has no __dict__ to add one to: an agent)
    app.agents["click-view"].__dict__["_latest"] = {0: 5}  # a per-partition dict
    assert any("click-view" in d and "_latest" in d for d in differences(before, fingerprint(app)))


# ------------------------------------------------------------------ TaskManager


def test_task_lifecycle() -> None:
    topology = _join_app().topology()
    manager = TaskManager(topology)
    created = manager.assign([("left", 1), ("right", 1), ("other", 0)])
    assert len(created) == 2  # left[1] and right[1] are one task
    join_task = manager.task_for("left", 1)
    assert join_task is manager.task_for("right", 1) and join_task is not None
    assert join_task.state is TaskState.RESTORING  # it has a join buffer to restore
    state = TablePartition("j-buffer", 1, MemoryStorePartition())
    assert manager.table_ready("j-buffer", 1, state) is join_task
    assert join_task.running and join_task.tables.get("j-buffer") is state
    # ready signalled twice (two assignments in quick succession): unflushed writes stay
    state.put(b"k", b"unflushed")
    again = TablePartition("j-buffer", 1, MemoryStorePartition())
    assert manager.table_ready("j-buffer", 1, again) is None
    assert join_task.tables["j-buffer"] is state and state.get(b"k") == b"unflushed"

    join_task.tracker.register(("left", 1), 10, 1)
    join_task.tracker.ack(("left", 1), 10)
    manager.suspend([join_task])
    assert join_task.state is TaskState.SUSPENDED and join_task.accepts_acks
    assert manager.committable([join_task]) == {("left", 1): 11}
    manager.close([join_task])
    assert join_task.state is TaskState.CLOSED and manager.task_for("left", 1) is None

    other = manager.task_for("other", 0)
    assert other is not None
    other.tables["counts"] = TablePartition("counts", 0, MemoryStorePartition())
    other.tables["counts"].put(b"k", b"1")
    assert manager.lose([other]) == 1
    assert other.state is TaskState.LOST and manager.live() == []


async def test_driver_revocation_commits_exactly_what_it_flushed() -> None:
    """The worker's revocation path, in memory: every event processed before the revoke is
    in the table and committed; nothing is counted twice when the task comes back."""
    app, counts = counting_app("revoke-driver")
    async with TestDriver(app) as driver:
        for _ in range(5):
            await driver.put("clicks", key="a", value=1)
        await driver.drain()
        await driver.revoke([("clicks", 0)])
        assert driver.committed == {("clicks", 0): 5}
        await driver.assign([("clicks", 0)])
        await driver.put("clicks", key="a", value=1)
        await driver.drain()
        assert dict(counts.items()) == {"a": 6}


async def test_a_lost_task_flushes_and_commits_nothing() -> None:
    """A fenced member's tasks are lost: their unflushed writes never reach the store or
    the changelog, and no offset is committed (their next owner replays them)."""
    app, counts = counting_app("lose-driver")
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value=1)
        await driver.drain()  # flushed: a=1 is durable
        for _ in range(3):
            await driver.put("clicks", key="a", value=1)
        for _ in range(20):
            await asyncio.sleep(0)
        lost = await driver.lose([("clicks", 0)])
        assert [t.state for t in lost] == [TaskState.LOST]
        assert driver.committed == {}
        changelog = [r.value for r in driver.raw_records("lose-driver-counts-changelog")]
        assert changelog == [b"1"]
        await driver.assign([("clicks", 0)])
        assert dict(counts.items()) == {"a": 1}


async def test_a_task_lost_while_its_commit_flushes_is_skipped_not_crashed() -> None:
    """The heartbeat learns the member was removed while the periodic commit is flushing
    (waiting for the producer): the loss must wait for that commit (whose flush uses the
    task's stores) and the commit must send, apply and commit nothing of the lost task.

    Bug reproduced (CI, the stalled-join test): the loss closed the stores under the
    flush, which raised StoreClosed; the consumer service crashed while the worker stayed
    in the group holding partitions it never processed again."""
    app, counts = counting_app("lost-mid-commit")
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value=1)
        await driver.drain()  # flushed: a=1 is durable
        for _ in range(3):
            await driver.put("clicks", key="a", value=1)
        for _ in range(20):
            await asyncio.sleep(0)
        processing, topology = driver.processing, driver.topology
        assert processing is not None and topology is not None
        reached, gate = asyncio.Event(), asyncio.Event()

        async def slow_producer_flush() -> None:
            reached.set()
            await gate.wait()

        processing.flusher = TableFlusher(driver, topology.tables, flush_sends=slow_producer_flush)
        (task,) = driver.tasks.live() if driver.tasks is not None else []
        store = task.tables["counts"].store
        commit = asyncio.create_task(driver.commit())
        await reached.wait()
        lose = asyncio.create_task(driver.lose([("clicks", 0)]))
        for _ in range(20):
            await asyncio.sleep(0)
        lost_early = lose.done()
        gate.set()
        assert not lost_early, "the loss must wait for the commit flushing its stores"
        assert [t.state for t in await lose] == [TaskState.LOST]
        # Once the loss returns the worker closes the stores: the commit is done with them.
        assert commit.done() and commit.result() == {}
        assert driver.committed == {}
        changelog = [r.value for r in driver.raw_records("lost-mid-commit-counts-changelog")]
        assert changelog == [b"1"]
        assert store.get(b"a") == b"1"
        await driver.assign([("clicks", 0)])
        assert dict(counts.items()) == {"a": 1}


async def test_a_loss_found_by_the_commits_own_membership_check_does_not_deadlock() -> None:
    """The commit asks the group whether this member is still in it (a heartbeat); when
    the answer is "removed", the membership loses the partitions right there, inside the
    commit. The loss waits for a commit under way, but not for the one it is part of.

    Bug reproduced (CI, test_a_second_worker_with_the_same_instance_id_fences_the_first):
    the loss waited for the commit lock its own commit held; the worker hung, neither
    processing nor stopping."""
    app, counts = counting_app("lose-in-commit")
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value=1)
        await driver.drain()
        await driver.put("clicks", key="a", value=1)
        for _ in range(20):
            await asyncio.sleep(0)
        processing = driver.processing
        assert processing is not None
        lost: list[Task] = []

        async def removed() -> bool:
            lost.extend(await driver.lose([("clicks", 0)]))
            return False

        processing._member_ok = removed
        assert await asyncio.wait_for(processing.commit(), timeout=5) == {}
        assert [t.state for t in lost] == [TaskState.LOST]
        processing._member_ok = None
        await driver.assign([("clicks", 0)])
        assert dict(counts.items()) == {"a": 1}


async def test_the_driver_aligns_co_partitioned_inputs_by_timestamp() -> None:
    """The driver runs the worker's aligner: an agent over two topics sees both in timestamp
    order even when one side is put far ahead of the other."""
    app = streamjoin.App("align-driver", topic_partitions=1, align_idle_ms=300)
    left = app.topic("l", value_serializer="json", partitions=1)
    right = app.topic("r", value_serializer="json", partitions=1)
    seen: list[tuple[str, int]] = []

    @app.agent([left, right])
    async def both(stream: Stream) -> None:
        async for event in stream:
            seen.append((event.topic, event.timestamp))

    async with TestDriver(app) as driver:
        for ts in (10, 30, 50):
            await driver.put("l", key=b"k", value=1, timestamp_ms=ts)
        for ts in (20, 40):
            await driver.put("r", key=b"k", value=1, timestamp_ms=ts)
        await driver.drain()
    # r was empty but caught up: the aligner waited align_idle_ms for it before releasing l
    assert [ts for _, ts in seen] == [10, 20, 30, 40, 50]


async def test_corruption_found_by_a_commits_flush_rebuilds_the_store_not_the_worker() -> None:
    """A clean flush asks the store whether a deleted key exists (to skip needless
    tombstones). When that read finds the store corrupted, the commit must still go
    through (the tombstone is sent: harmless if the key was absent) and the store be
    handed to the rebuild path, like corruption found by an agent's read; it used to
    fail the commit, which stopped the worker."""
    app, _counts = counting_app("corrupt-mid-flush")
    async with TestDriver(app) as driver:
        await driver.put("clicks", key="a", value=1)
        await driver.drain()
        processing = driver.processing
        assert processing is not None and driver.tasks is not None
        (task,) = driver.tasks.live()
        state = task.tables["counts"]
        seen: list[tuple[Task, StoreCorrupted]] = []
        processing.runtime._on_store_corrupted = lambda t, exc: seen.append((t, exc))

        def corrupted(key: bytes) -> bool:
            raise StoreCorrupted("/tmp/corrupt-mid-flush", "block checksum mismatch")

        state.store.contains = corrupted  # type: ignore[method-assign]
        await driver.put("clicks", key="b", value=1)
        await driver.drain()
        state.put(b"gone", None)  # a delete: the flush asks the store about it
        committed = await driver.commit()
        assert committed == {("clicks", 0): 2}
        changelog = driver.raw_records("corrupt-mid-flush-counts-changelog")
        assert (b"gone", None) in [(r.key, r.value) for r in changelog]
        assert [(t, str(exc.cause)) for t, exc in seen] == [(task, "block checksum mismatch")]
