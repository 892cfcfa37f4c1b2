"""StateService's restore loop over a scripted changelog reader (memory stores, no broker)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from aiokafka.structs import TopicPartition

from streamjoin.app import App
from streamjoin.errors import ChangelogOffsetOutOfRange, ChangelogReadError
from streamjoin.runtime.table_state import service as state_module
from streamjoin.runtime.table_state.changelog_reader import ChangelogChunk
from streamjoin.runtime.table_state.changelog_records import Record
from streamjoin.runtime.table_state.service import StateService, TableStores
from streamjoin.tables import Table


class ScriptedReader:
    """A changelog with offsets [start, end) whose log start can move under a replay."""

    instances: ClassVar[list[ScriptedReader]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.log: dict[TopicPartition, list[Record]] = {}
        self.start_offset = 0
        self.positions: dict[TopicPartition, int] = {}
        self.assigns: list[dict[TopicPartition, tuple[int, int | None]]] = []
        self.reads = 0
        #: on this read, the log start moves to ``move_start_to`` and the read fails
        self.fail_on_read: int | None = None
        self.move_start_to = 0
        ScriptedReader.instances.append(self)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def end_offsets(
        self, tps: list[TopicPartition], *, high_watermark: bool = False
    ) -> dict[TopicPartition, int]:
        return {tp: self.log[tp][-1][0] + 1 if self.log.get(tp) else 0 for tp in tps}

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.start_offset for tp in tps}

    def assign(self, ranges: dict[TopicPartition, tuple[int, int | None]]) -> None:
        self.assigns.append(dict(ranges))
        self.positions = {tp: start for tp, (start, _) in ranges.items()}

    def unassign(self, tp: TopicPartition) -> None:
        self.positions.pop(tp, None)

    async def read(self, max_records: int, timeout: float) -> dict[TopicPartition, ChangelogChunk]:
        await asyncio.sleep(0)
        self.reads += 1
        if self.reads == self.fail_on_read:
            self.start_offset = self.move_start_to
            self.log = {
                tp: [r for r in recs if r[0] >= self.start_offset] for tp, recs in self.log.items()
            }
            failed = dict(self.positions)
            self.positions.clear()
            raise ChangelogOffsetOutOfRange(failed)
        out = {}
        for tp, position in self.positions.items():
            records = [r for r in self.log[tp] if r[0] >= position][:2]
            if records:
                self.positions[tp] = records[-1][0] + 1
                out[tp] = ChangelogChunk(records, records[-1][0] + 1)
        return out


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedReader]:
    """The state service gets a ScriptedReader (see ``instances``) instead of a real one."""
    ScriptedReader.instances.clear()
    monkeypatch.setattr(state_module, "ChangelogReader", ScriptedReader)
    return ScriptedReader


def one_table_service(**options: Any) -> tuple[StateService, Table, TopicPartition]:
    """A state service (memory stores) for an app with one 1-partition table ``t``."""
    app = App("svc", broker="kafka://127.0.0.1:9")
    app.table("t", partitions=1)
    table = app.tables["t"]
    options.setdefault("on_ready", lambda name, partition, store: None)
    service = StateService(
        TableStores(app.tables, None),
        bootstrap_servers=app.config.broker,
        client_options={},
        **options,
    )
    return service, table, TopicPartition(table.changelog.name, 0)


async def test_records_deleted_under_a_replay_rebuild_the_store(
    scripted: type[ScriptedReader],
) -> None:
    ready = asyncio.Event()
    service, table, tp = one_table_service(
        on_ready=lambda name, partition, store: ready.set(),
        restore_write_batch=1,  # flush every read: the partial restore reaches the store
    )
    await service.start()
    (live,) = scripted.instances
    live.log = {tp: [(o, b"k%d" % (o % 4), b"v%d" % o) for o in range(10)]}
    live.fail_on_read = 2  # after offsets 0-1 were applied, offsets below 6 are deleted
    live.move_start_to = 6
    try:
        service.set_assignment({"t": {0}}, {})
        await asyncio.wait_for(ready.wait(), timeout=5)
    finally:
        store = service.stores.get(table.name, 0)
        assert store is not None
        contents = dict(store.items())
        offset = store.changelog_offset()
        await service.stop()
    # planned from 0; then, with the store at offset 1 and the log starting at 6: rebuilt
    assert live.assigns == [{tp: (0, 10)}, {tp: (6, 10)}]
    assert contents == {b"k2": b"v6", b"k3": b"v7", b"k0": b"v8", b"k1": b"v9"}
    assert offset == 9
    assert service.restored_records == 2 + 4


async def test_an_unreadable_changelog_stops_the_worker_with_the_error(
    scripted: type[ScriptedReader],
) -> None:
    crashed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
    service, table, tp = one_table_service(on_crash=crashed.set_result)
    await service.start()
    (live,) = scripted.instances
    live.log = {tp: [(o, b"k", b"v") for o in range(10)]}

    async def unreadable(max_records: int, timeout: float) -> dict[TopicPartition, Any]:
        raise ChangelogReadError(f"{tp.topic}[0]: CORRUPT_MESSAGE")

    live.read = unreadable  # type: ignore[method-assign]
    try:
        service.set_assignment({"t": {0}}, {})
        error = await asyncio.wait_for(crashed, timeout=5)
    finally:
        await service.stop()
    assert isinstance(error, ChangelogReadError)
    assert "CORRUPT_MESSAGE" in str(error)
    assert not service.is_ready(table.name, 0)  # never marked restored


async def test_a_restore_that_ends_after_its_partition_was_revoked_is_readied_on_reassignment(
    scripted: type[ScriptedReader],
) -> None:
    """Seen in CI (the exactly-once zombie test, once): a worker's transaction aborted,
    its partitions were lost while their stores restored; a restore then finished for a
    partition no longer assigned ("ready", announced to no task), and when the same
    partition came back the service kept it as ready and never announced it again: the
    task waited for its table forever, its source partitions paused."""
    readied: list[tuple[str, int]] = []
    service, _table, tp = one_table_service(
        on_ready=lambda name, partition, store: readied.append((name, partition))
    )
    await service.start()
    (live,) = scripted.instances
    live.log = {tp: [(o, b"k%d" % o, b"v%d" % o) for o in range(6)]}
    try:
        service.set_assignment({"t": {0}}, {})
        for _ in range(3):  # the restore is planned and reads its first records
            await asyncio.sleep(0)
        service.revoke([("t", 0)])  # lost mid-restore
        for _ in range(50):  # the restore runs to its end meanwhile
            await asyncio.sleep(0.01)
        readied_while_revoked = list(readied)
        service.set_assignment({"t": {0}}, {})  # the same partition comes back
        for _ in range(50):
            if len(readied) > len(readied_while_revoked):
                break
            await asyncio.sleep(0.01)
    finally:
        await service.stop()
    assert readied_while_revoked == []  # nobody to announce it to
    assert readied == [("t", 0)]
