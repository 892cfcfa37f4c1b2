"""The records of one partition's fetch answer as :class:`RawRecord`: the per-record loop
of the fetch path (:class:`~streamjoin.runtime.transport.fetched_records.RawPartitionRecords`).

Compiled with mypyc (:mod:`streamjoin.compiled`): every record a worker reads passes
here. The iterator that calls it inherits aiokafka's, an interpreted class, so it cannot
be compiled itself; this generator function can.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final, Protocol

from streamjoin.events import RawRecord
from streamjoin.runtime.table_state.changelog_records import BatchReader, scan_batches

#: (``Final``: a C static when compiled, not a module dict lookup per use)
_RAW_RECORD: Final = RawRecord
_SCAN_BATCHES: Final = scan_batches

__all__ = ["FetchPosition", "raw_records"]


class FetchPosition(Protocol):
    """Where the partition's next fetch starts, kept up to date per record handed out:
    aiokafka stops mid-batch at ``max_poll_records`` and resumes from there."""

    next_fetch_offset: int


def raw_records(
    position: FetchPosition,
    topic: str,
    partition: int,
    records: BatchReader,
    aborted_transactions: Iterable[tuple[int, int]] | None,
    check_crcs: bool,
) -> Iterator[RawRecord]:
    """The records of one fetch answer's batches (``records``, read on the first step, as
    aiokafka's own iterator does) from ``position``'s offset on, moving it along.
    ``aborted_transactions``: a ``read_committed`` fetch's, None to read uncommitted."""
    scanned = _SCAN_BATCHES(
        records, position.next_fetch_offset, aborted_transactions, check_crcs=check_crcs
    )
    for batch in scanned.batches:
        start = position.next_fetch_offset
        for record in batch:
            offset: int = record.offset
            if offset < start:
                continue  # a fetch from the middle of a batch returns all of it
            position.next_fetch_offset = offset + 1
            yield _RAW_RECORD(
                topic,
                partition,
                offset,
                record.timestamp,
                record.key,
                record.value,
                tuple(record.headers),
            )
        position.next_fetch_offset = batch.next_offset
    position.next_fetch_offset = scanned.next_offset
