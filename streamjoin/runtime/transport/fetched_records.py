"""Fetched records handed out as our :class:`RawRecord`, without aiokafka's ``ConsumerRecord``.

aiokafka's consumer builds an 11-field ``ConsumerRecord`` per fetched record (through a
method call and two deserializer checks), and the fetch loop then copied each into a
``RawRecord``: about 8% of a worker's CPU on the enrichment benchmark. aiokafka builds
its per-partition record iterator with the ``PartitionRecords`` class of its fetcher
module; :func:`install` puts a subclass there that builds ``RawRecord`` straight from
the record batches, reading them with the restore path's :func:`scan_batches` (control
batches, aborted transactions, a fetch that starts mid-batch). It also puts a subclass
of the fetcher's ``FetchResult`` there whose ``getall`` hands out all of a partition's
records with one ``list()`` of that iterator, where aiokafka's loop runs three Python
steps per record (about 4% of a worker's CPU on the enrichment).

Only consumers created with ``key_deserializer=RAW_RECORDS`` get the new records; any
other aiokafka consumer in the process (an embedding service's own) is served by
aiokafka's code as before. If this aiokafka's ``PartitionRecords`` is not the one this
was written against, nothing is installed and the marker is an identity deserializer:
the consumer then hands out ``ConsumerRecord`` and :func:`as_raw_records` converts them.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import aiokafka
from aiokafka.consumer import fetcher as aiokafka_fetcher

from streamjoin.events import RawRecord
from streamjoin.runtime.table_state.changelog_records import READ_COMMITTED
from streamjoin.runtime.transport.record_scan import raw_records

log = logging.getLogger(__name__)


class RawRecordsMarker:
    """The key deserializer that asks for :class:`RawRecord` (the identity if not installed)."""

    def __call__(self, key: bytes | None) -> bytes | None:
        return key

    def __repr__(self) -> str:
        return "RAW_RECORDS"


RAW_RECORDS = RawRecordsMarker()

_AIOKAFKA_PARTITION_RECORDS: Any = getattr(aiokafka_fetcher, "PartitionRecords", None)
_AIOKAFKA_FETCH_RESULT: Any = getattr(aiokafka_fetcher, "FetchResult", None)
#: the constructor this module was written against (aiokafka 0.14)
_EXPECTED_PARAMETERS = (
    "self",
    "tp",
    "records",
    "aborted_transactions",
    "fetch_offset",
    "key_deserializer",
    "value_deserializer",
    "check_crcs",
    "isolation_level",
)


#: what :class:`RawFetchResult` uses of aiokafka's ``FetchResult`` (aiokafka 0.14)
_FETCH_RESULT_PARAMETERS = ("self", "tp", "assignment", "partition_records", "backoff")
_FETCH_RESULT_METHODS = ("getall", "check_assignment", "has_more", "_update_position")


def _seam_fits() -> bool:
    cls = _AIOKAFKA_PARTITION_RECORDS
    if cls is None or not hasattr(cls, "_unpack_records"):
        return False
    if tuple(inspect.signature(cls.__init__).parameters) != _EXPECTED_PARAMETERS:
        return False
    result = _AIOKAFKA_FETCH_RESULT
    if result is None or not all(callable(getattr(result, m, None)) for m in _FETCH_RESULT_METHODS):
        return False
    return tuple(inspect.signature(result.__init__).parameters) == _FETCH_RESULT_PARAMETERS


class RawPartitionRecords(_AIOKAFKA_PARTITION_RECORDS or object):  # type: ignore[misc]
    """aiokafka's iterator of one partition's fetched records, yielding ``RawRecord``
    when its consumer asked for them."""

    #: where the partition's fetch position goes once the records handed out so far are
    #: consumed (set by aiokafka's constructor, kept up to date by the iterator)
    next_fetch_offset: int

    def _unpack_records(self) -> Iterator[Any]:
        if self._key_deserializer is not RAW_RECORDS:
            return super()._unpack_records()  # type: ignore[no-any-return]
        return self._raw_records()

    def __iter__(self) -> Iterator[Any]:
        # aiokafka's __iter__ returns self, whose __next__ is one more Python call per
        # record; the generator itself keeps next_fetch_offset as aiokafka expects.
        if self._key_deserializer is not RAW_RECORDS:
            return self
        iterator = self._records_iterator
        return iter(()) if iterator is None else iterator

    def _raw_records(self) -> Iterator[RawRecord]:
        tp = self._tp
        topic, partition = tp.topic, tp.partition
        committed_only = self._isolation_level == READ_COMMITTED
        return raw_records(
            self,
            topic,
            partition,
            self._records,
            self._aborted_transactions if committed_only else None,
            bool(self._check_crcs),
        )


class RawFetchResult(_AIOKAFKA_FETCH_RESULT or object):  # type: ignore[misc]
    """aiokafka's fetched records of one partition, waiting to be handed out: ``getall``
    without a limit, on records built as ``RawRecord``, takes them all in one ``list()``
    (aiokafka's loop appends and checks the limit in Python per record). The same
    records, the same checks before and the same position after."""

    _topic_partition: Any
    _partition_records: Any

    def getall(self, max_records: int | None = None) -> list[Any]:
        records = self._partition_records
        if (
            max_records is not None
            or type(records) is not RawPartitionRecords
            or records._key_deserializer is not RAW_RECORDS
        ):
            return super().getall(max_records)  # type: ignore[no-any-return]
        if not self.check_assignment(self._topic_partition):
            return []
        handed = list(records)
        self._update_position()
        self._partition_records = None
        return handed


def install() -> bool:
    """Have aiokafka's fetcher build :class:`RawPartitionRecords` (idempotent). False,
    with a warning, when this aiokafka does not look like the one it was written for."""
    current = getattr(aiokafka_fetcher, "PartitionRecords", None)
    result = getattr(aiokafka_fetcher, "FetchResult", None)
    if current is RawPartitionRecords and result is RawFetchResult:
        return True
    if (
        current not in (_AIOKAFKA_PARTITION_RECORDS, RawPartitionRecords)
        or result not in (_AIOKAFKA_FETCH_RESULT, RawFetchResult)
        or not _seam_fits()
    ):
        log.warning(
            "aiokafka %s: its fetcher's PartitionRecords or FetchResult is not the one "
            "streamjoin knows; "
            "fetched records go through aiokafka's ConsumerRecord (slower, same results)",
            aiokafka.__version__,
        )
        return False
    aiokafka_fetcher.PartitionRecords = RawPartitionRecords
    aiokafka_fetcher.FetchResult = RawFetchResult
    return True


def as_raw_records(topic: str, partition: int, records: Sequence[Any]) -> list[RawRecord]:
    """The records of one partition that a consumer's getmany handed out, as ``RawRecord``
    (as they are, once :func:`install` took effect; converted from ``ConsumerRecord`` if not)."""
    if not records or type(records[0]) is RawRecord:
        return records  # type: ignore[return-value]
    return [
        RawRecord(topic, partition, r.offset, r.timestamp, r.key, r.value, r.headers or ())
        for r in records
    ]
