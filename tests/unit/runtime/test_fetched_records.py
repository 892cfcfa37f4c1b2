"""Fetched records built as RawRecord inside aiokafka's fetcher: the same records and fetch
positions as aiokafka's own ConsumerRecord path, on any log and any hand-out size."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition
from changelog_support import Log, batch, rec, steps
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.errors import CorruptRecordSet
from streamjoin.events import RawRecord
from streamjoin.runtime.table_state.changelog_records import READ_COMMITTED, READ_UNCOMMITTED
from streamjoin.runtime.transport import fetched_records
from streamjoin.runtime.transport.fetched_records import (
    RAW_RECORDS,
    RawPartitionRecords,
    as_raw_records,
)

TP = TopicPartition("events", 3)


def partition_records(
    cls: Any,
    data: bytes,
    fetch_offset: int,
    aborted: list[tuple[int, int]] | None,
    *,
    raw: bool,
    isolation: int = READ_UNCOMMITTED,
) -> Any:
    return cls(
        TP,
        MemoryRecords(data),
        aborted,
        fetch_offset,
        RAW_RECORDS if raw else None,
        None,
        True,
        isolation,
    )


def hand_out(records: Any, max_records: int) -> list[Any]:
    """What aiokafka's ``FetchResult.getall`` hands out in one ``getmany``."""
    out = []
    for record in records:
        out.append(record)
        if len(out) >= max_records:
            break
    return out


def fields(record: Any) -> tuple[Any, ...]:
    return (
        record.topic,
        record.partition,
        record.offset,
        record.timestamp,
        record.key,
        record.value,
        tuple(record.headers),
    )


@settings(max_examples=300, deadline=None)
@given(steps, st.data())
def test_the_same_records_and_positions_as_aiokafka(
    plan: list[tuple[str, int, bool, int]], draw: st.DataObject
) -> None:
    log = Log.built(plan)
    start = draw.draw(st.integers(0, log.end), label="start")
    committed = draw.draw(st.booleans(), label="read_committed")
    isolation = READ_COMMITTED if committed else READ_UNCOMMITTED
    position = start
    while position < log.end:
        limit = draw.draw(st.integers(1, 400), label="fetch bytes")
        data = log.fetch(position, limit)
        aborted = log.aborted_for(position) if committed else None
        ours = partition_records(
            RawPartitionRecords, data, position, aborted, raw=True, isolation=isolation
        )
        theirs = partition_records(
            aiokafka_fetcher.PartitionRecords,
            data,
            position,
            aborted,
            raw=False,
            isolation=isolation,
        )
        while True:
            max_records = draw.draw(st.integers(1, 6), label="max_poll_records")
            got, want = hand_out(ours, max_records), hand_out(theirs, max_records)
            assert all(type(r) is RawRecord for r in got)
            assert all(type(r) is ConsumerRecord for r in want)
            assert [fields(r) for r in got] == [fields(r) for r in want]
            assert ours.next_fetch_offset == theirs.next_fetch_offset
            if len(want) < max_records:
                break
        assert ours.next_fetch_offset > position, "every fetch moves forward"
        position = ours.next_fetch_offset
    assert position == log.end


def test_headers_timestamps_and_tombstones_are_kept() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1_700_000_000_001, b"a", b"1", [("trace", b"x"), ("n", b"")])
    builder.append(1, 1_700_000_000_002, None, None, [])
    got = list(partition_records(RawPartitionRecords, bytes(builder.build()), 0, None, raw=True))
    assert got == [
        RawRecord("events", 3, 0, 1_700_000_000_001, b"a", b"1", (("trace", b"x"), ("n", b""))),
        RawRecord("events", 3, 1, 1_700_000_000_002, None, None, ()),
    ]


def test_other_consumers_get_aiokafkas_records() -> None:
    data = batch(0, [rec(0), rec(1)])
    records = partition_records(RawPartitionRecords, data, 0, None, raw=False)
    got = hand_out(records, 10)
    assert [type(r) for r in got] == [ConsumerRecord, ConsumerRecord]
    assert [(r.offset, r.key, r.value) for r in got] == [rec(0), rec(1)]
    assert records.next_fetch_offset == 2


def test_a_corrupt_batch_fails_loudly() -> None:
    data = bytearray(batch(0, [rec(0)]))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordSet, match="CRC"):
        list(partition_records(RawPartitionRecords, bytes(data), 0, None, raw=True))


def test_install_puts_the_class_in_aiokafkas_fetcher_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        aiokafka_fetcher, "PartitionRecords", fetched_records._AIOKAFKA_PARTITION_RECORDS
    )
    monkeypatch.setattr(aiokafka_fetcher, "FetchResult", fetched_records._AIOKAFKA_FETCH_RESULT)
    assert fetched_records.install()
    assert aiokafka_fetcher.PartitionRecords is RawPartitionRecords
    assert aiokafka_fetcher.FetchResult is fetched_records.RawFetchResult
    assert fetched_records.install()
    assert aiokafka_fetcher.PartitionRecords is RawPartitionRecords
    assert aiokafka_fetcher.FetchResult is fetched_records.RawFetchResult


def test_an_unknown_aiokafka_is_left_alone_and_its_records_converted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Changed:
        def __init__(self, tp: Any, records: Any) -> None: ...

    monkeypatch.setattr(aiokafka_fetcher, "PartitionRecords", Changed)
    monkeypatch.setattr(aiokafka_fetcher, "FetchResult", fetched_records._AIOKAFKA_FETCH_RESULT)
    assert not fetched_records.install()
    assert aiokafka_fetcher.PartitionRecords is Changed
    assert aiokafka_fetcher.FetchResult is fetched_records._AIOKAFKA_FETCH_RESULT
    assert "ConsumerRecord (slower, same results)" in caplog.text
    handed = hand_out(
        partition_records(
            fetched_records._AIOKAFKA_PARTITION_RECORDS, batch(5, [rec(5)]), 5, None, raw=True
        ),
        10,
    )
    assert type(handed[0]) is ConsumerRecord  # the marker deserializes as the identity
    assert as_raw_records("events", 3, handed) == [
        RawRecord("events", 3, 5, 1_700_000_000_000, b"k5", b"v5", ())
    ]
    raws = [RawRecord("events", 3, 6, 0, None, None)]
    assert as_raw_records("events", 3, raws) is raws


class _PartitionState:
    """What ``FetchResult`` reads and moves of a partition's fetch state in aiokafka."""

    def __init__(self, position: int, paused: bool = False) -> None:
        self.position = position
        self.paused = paused

    def consumed_to(self, offset: int) -> None:
        self.position = offset


class _Assignment:
    def __init__(self, state: _PartitionState) -> None:
        self.active = True
        self.state = state

    def state_value(self, tp: TopicPartition) -> _PartitionState:
        assert tp == TP
        return self.state


def fetch_result(cls: Any, records: Any, state: _PartitionState) -> Any:
    return cls(TP, assignment=_Assignment(state), partition_records=records, backoff=0)


@settings(max_examples=150, deadline=None)
@given(steps, st.data())
def test_getall_hands_out_what_aiokafkas_does(
    plan: list[tuple[str, int, bool, int]], draw: st.DataObject
) -> None:
    """RawFetchResult.getall (one list() without a limit) hands out the same records as
    aiokafka's FetchResult.getall and leaves the partition at the same position; with a
    limit it is aiokafka's own."""
    log = Log.built(plan)
    position = draw.draw(st.integers(0, log.end), label="start")
    data = log.fetch(position, draw.draw(st.integers(1, 400), label="fetch bytes"))
    limit = draw.draw(st.none() | st.integers(1, 6), label="max_records")
    ours_state, theirs_state = _PartitionState(position), _PartitionState(position)
    ours = fetch_result(
        fetched_records.RawFetchResult,
        partition_records(RawPartitionRecords, data, position, None, raw=True),
        ours_state,
    )
    theirs = fetch_result(
        fetched_records._AIOKAFKA_FETCH_RESULT,
        partition_records(
            fetched_records._AIOKAFKA_PARTITION_RECORDS, data, position, None, raw=False
        ),
        theirs_state,
    )
    while theirs.has_more():
        got, want = ours.getall(limit), theirs.getall(limit)
        assert all(type(r) is RawRecord for r in got)
        assert [fields(r) for r in got] == [fields(r) for r in want]
        assert ours_state.position == theirs_state.position
        assert ours.has_more() == theirs.has_more()
    assert not ours.has_more()


def test_getall_of_a_paused_partition_drops_its_records_as_aiokafkas_does() -> None:
    """(aiokafka fetches a paused partition's records again once it is resumed)"""
    for cls, raw in (
        (fetched_records.RawFetchResult, True),
        (fetched_records._AIOKAFKA_FETCH_RESULT, False),
    ):
        state = _PartitionState(0, paused=True)
        records = partition_records(RawPartitionRecords, batch(0, [rec(0)]), 0, None, raw=raw)
        result = fetch_result(cls, records, state)
        assert result.getall() == []
        assert state.position == 0
        assert not result.has_more()


def test_an_unknown_fetch_result_leaves_both_classes_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class ChangedResult:
        def __init__(self, tp: Any, records: Any) -> None: ...

        def getall(self) -> list[Any]:
            return []

    monkeypatch.setattr(
        aiokafka_fetcher, "PartitionRecords", fetched_records._AIOKAFKA_PARTITION_RECORDS
    )
    monkeypatch.setattr(aiokafka_fetcher, "FetchResult", ChangedResult)
    assert not fetched_records.install()
    assert aiokafka_fetcher.PartitionRecords is fetched_records._AIOKAFKA_PARTITION_RECORDS
    assert aiokafka_fetcher.FetchResult is ChangedResult
    assert "ConsumerRecord (slower, same results)" in caplog.text
