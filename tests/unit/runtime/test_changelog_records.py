"""Decoding fetched changelog record sets, fetch planning and error classes (pure)."""

from __future__ import annotations

import pytest
from aiokafka.structs import TopicPartition
from changelog_support import Log, batch, marker, rec, steps
from hypothesis import given, settings
from hypothesis import strategies as st

from streamjoin.errors import CorruptRecordSet
from streamjoin.runtime.table_state.changelog_records import (
    ErrorAction,
    Record,
    batch_records,
    error_action,
    plan_fetches,
    scan_record_set,
    split_partition_answer,
)


def read(
    data: bytes, start: int, aborted: list[tuple[int, int]] | None = None
) -> tuple[list[Record], int]:
    scanned = scan_record_set(data, start, aborted)
    records = [r for b in scanned.batches for r in batch_records(b, scanned.start)]
    return records, scanned.next_offset


# ---------------------------------------------------------------------------- decoding


def test_plain_batches_come_out_as_offset_key_value() -> None:
    data = batch(0, [rec(0), rec(1), rec(2)]) + batch(3, [rec(3), (4, b"gone", None)])
    records, next_offset = read(data, 0)
    assert records == [rec(0), rec(1), rec(2), rec(3), (4, b"gone", None)]
    assert next_offset == 5


def test_nothing_fetched_stays_put() -> None:
    for data in (b"", None):
        scanned = scan_record_set(data, 7)
        assert (scanned.batches, scanned.next_offset, scanned.advanced) == ([], 7, False)


def test_a_fetch_from_the_middle_of_a_batch_drops_the_records_before_it() -> None:
    data = batch(0, [rec(0), rec(1), rec(2), rec(3)]) + batch(4, [rec(4)])
    assert read(data, 2) == ([rec(2), rec(3), rec(4)], 5)


def test_batches_entirely_before_the_fetch_offset_are_skipped() -> None:
    data = batch(0, [rec(0), rec(1)]) + batch(2, [rec(2)])
    scanned = scan_record_set(data, 2)
    assert len(scanned.batches) == 1
    assert read(data, 2) == ([rec(2)], 3)


def test_compaction_gaps_keep_offsets_and_advance_past_the_batch_end() -> None:
    # offsets 1, 3, 4 and 8-9 were compacted away; the first batch still ends at 4
    data = batch(0, [rec(0), rec(2)], last_offset=4) + batch(5, [rec(5), rec(7)], last_offset=9)
    assert read(data, 0) == ([rec(0), rec(2), rec(5), rec(7)], 10)


def test_a_batch_emptied_by_compaction_still_advances_the_position() -> None:
    data = batch(10, [], last_offset=14)
    scanned = scan_record_set(data, 10)
    assert scanned.advanced and scanned.next_offset == 15
    assert read(data, 10) == ([], 15)


def test_control_batches_are_skipped_but_advance_the_position() -> None:
    data = (
        batch(0, [rec(0), rec(1)], producer_id=7, transactional=True)
        + marker(2, 7, commit=True)
        + batch(3, [rec(3)])
    )
    assert read(data, 0) == ([rec(0), rec(1), rec(3)], 4)
    # a record set holding only a marker moves the position and yields nothing
    assert read(marker(2, 7, commit=True), 2) == ([], 3)


def test_read_uncommitted_keeps_aborted_records_and_drops_only_markers() -> None:
    data = batch(0, [rec(0), rec(1)], producer_id=7, transactional=True) + marker(
        2, 7, commit=False
    )
    assert read(data, 0, None) == ([rec(0), rec(1)], 3)


def test_read_committed_drops_aborted_transactions_only() -> None:
    data = (
        batch(0, [rec(0)], producer_id=7, transactional=True)  # aborted
        + batch(1, [rec(1)], producer_id=8, transactional=True)  # committed
        + batch(2, [rec(2)])  # not transactional
        + batch(3, [rec(3)], producer_id=7, transactional=True)  # still the aborted one
        + marker(4, 7, commit=False)
        + marker(5, 8, commit=True)
        + batch(6, [rec(6)], producer_id=7, transactional=True)  # a new transaction of 7
        + marker(7, 7, commit=True)
    )
    records, next_offset = read(data, 0, [(7, 0)])
    assert records == [rec(1), rec(2), rec(6)]
    assert next_offset == 8


def test_a_batch_cut_off_by_the_fetch_size_is_left_for_the_next_fetch() -> None:
    first, second = batch(0, [rec(0), rec(1)]), batch(2, [rec(2), rec(3)])
    data = first + second[: len(second) // 2]
    assert read(data, 0) == ([rec(0), rec(1)], 2)
    scanned = scan_record_set(second[:20], 2)
    assert not scanned.advanced and scanned.next_offset == 2


def test_a_corrupt_batch_raises_unless_crcs_are_not_checked() -> None:
    data = bytearray(batch(0, [rec(0), rec(1)]))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordSet, match="CRC"):
        scan_record_set(bytes(data), 0)
    assert scan_record_set(bytes(data), 0, check_crcs=False).next_offset == 2


def test_partition_answer_layouts_by_fetch_version() -> None:
    assert split_partition_answer(3, [b"r"]) == (None, b"r")
    assert split_partition_answer(4, [10, [(7, 0)], b"r"]) == ([(7, 0)], b"r")
    assert split_partition_answer(7, [10, 0, None, b"r"]) == ([], b"r")
    assert split_partition_answer(11, [10, 0, [(7, 3)], -1, b"r"]) == ([(7, 3)], b"r")


# ---------------------------------------------------------------------------- chunked reads


@settings(max_examples=300, deadline=None)
@given(steps, st.data())
def test_reading_in_chunks_of_any_size_reads_exactly_the_log(
    plan: list[tuple[str, int, bool, int]], draw: st.DataObject
) -> None:
    log = Log.built(plan)
    start = draw.draw(st.integers(0, log.end), label="start")
    committed = draw.draw(st.booleans(), label="read_committed")
    expected = [
        r for r in log.records if r[0] >= start and not (committed and r[0] in log.aborted_records)
    ]
    got: list[Record] = []
    position = start
    while position < log.end:
        limit = draw.draw(st.integers(1, 400), label="fetch bytes")
        aborted = log.aborted_for(position) if committed else None
        scanned = scan_record_set(log.fetch(position, limit), position, aborted)
        assert scanned.advanced, "every fetch moves forward (the first batch always fits)"
        got += [r for b in scanned.batches for r in batch_records(b, scanned.start)]
        position = scanned.next_offset
    assert position == log.end
    assert got == expected


# ---------------------------------------------------------------------------- planning


def tp(partition: int, topic: str = "cl") -> TopicPartition:
    return TopicPartition(topic, partition)


def test_fetches_are_grouped_by_leader_and_skip_busy_and_leaderless_nodes() -> None:
    leaders = {tp(0): 1, tp(1): 2, tp(2): 1, tp(3): None, tp(4): -1, tp(5): 3}
    plan = plan_fetches([(t, 10 * t.partition) for t in leaders], leaders.__getitem__, busy={3})
    assert plan.by_node == {1: [(tp(0), 0), (tp(2), 20)], 2: [(tp(1), 10)]}
    assert plan.leaderless == [tp(3), tp(4)]


def test_fetch_order_rotates_so_every_partition_comes_first() -> None:
    wanted = [(tp(p), 0) for p in range(3)]
    firsts = {plan_fetches(wanted, lambda _: 1, rotation=r).by_node[1][0][0] for r in range(3)}
    assert firsts == {tp(0), tp(1), tp(2)}


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (1, ErrorAction.OUT_OF_RANGE),
        (6, ErrorAction.REFRESH_METADATA),  # NOT_LEADER_OR_FOLLOWER
        (3, ErrorAction.REFRESH_METADATA),  # UNKNOWN_TOPIC_OR_PARTITION
        (5, ErrorAction.REFRESH_METADATA),  # LEADER_NOT_AVAILABLE
        (7, ErrorAction.RETRY),  # REQUEST_TIMED_OUT
        (2, ErrorAction.FAIL),  # CORRUPT_MESSAGE
        (29, ErrorAction.FAIL),  # TOPIC_AUTHORIZATION_FAILED
        (-1, ErrorAction.FAIL),  # UNKNOWN_SERVER_ERROR
    ],
)
def test_error_codes_map_to_actions(code: int, action: ErrorAction) -> None:
    assert error_action(code) is action
